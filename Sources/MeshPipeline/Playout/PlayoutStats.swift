import Synchronization

/// A snapshot of a playout pipeline's counters and levels, readable from any thread.
public struct PlayoutStats: Sendable, Equatable {
    /// Latency queued in the relay on this side (jitter buffer + staging + resampler look-ahead) at the start of
    /// the latest pull, ms, as measured (it moves with arrival and render-call jitter).
    public var bufferedMilliseconds: Double = 0
    /// `bufferedMilliseconds` with the jitter taken out (as if the newest packet had the least transit of the
    /// last second and the render call the least lateness), ms — the quantity the drift controller holds at the
    /// target.
    public var steadyLatencyMilliseconds: Double = 0
    /// The drift controller's estimate of the clock rate difference (sender − device), ppm; 0 until estimated.
    /// Reported even while the resampler is bypassed.
    public var estimatedDriftPPM: Double = 0
    /// Filtered clock excursion since the drift reference, ms (the loop engages beyond ±0.75 ms).
    public var clockExcursionMilliseconds: Double = 0
    /// The jitter buffer's current target, ms.
    public var targetMilliseconds: Double = 0
    /// Buffered latency plus the device's queue (`RenderContext.deviceDelayFrames`), ms.
    public var playoutLatencyMilliseconds: Double = 0
    /// The host's capture-device delay from the latest packet's host report, ms.
    public var hostLatencyMilliseconds: Double = 0
    /// RFC 3550 interarrival jitter, ms.
    public var jitterMilliseconds: Double = 0
    /// Transit deviation over the jitter window (all but the top 0.3 % of transits, minus the least), ms.
    public var peakJitterMilliseconds: Double = 0
    /// Packets lost on the network, percent of packets sent (from sequence numbers).
    public var lossPercent: Double = 0
    /// Audio synthesized by concealment (losses, underruns, delay growth), ms.
    public var concealedMilliseconds: Double = 0
    /// Current drift correction, ppm (0 while the resampler is bypassed).
    public var driftPPM: Double = 0
    /// Whether the resampler is in the chain (it stays in once engaged).
    public var resampling: Bool = false
    /// Packets handed to the jitter buffer.
    public var received: UInt64 = 0
    /// Packets dropped as late.
    public var late: UInt64 = 0
    /// Packets dropped as duplicates.
    public var duplicates: UInt64 = 0
    /// Packets lost on the network.
    public var lostPackets: UInt64 = 0
    /// Frames that reached playout without data.
    public var lostFrames: UInt64 = 0
    /// Frames synthesized by the concealer.
    public var concealedFrames: UInt64 = 0
    /// Renders that found the buffer empty.
    public var underruns: UInt64 = 0
    /// Datagrams that failed to decode.
    public var malformed: UInt64 = 0
    /// Datagrams dropped because the packet ring was full.
    public var ringOverflows: UInt64 = 0
    /// Opus packets that arrived after a newer one was decoded (reordered or duplicated): dropped.
    public var stalePackets: UInt64 = 0
    /// Samples that arrived outside [−1, 1] (clamped) or not finite (zeroed).
    public var sanitizedSamples: UInt64 = 0
    /// Packets of a format other than the pipeline's (each one reported upward, for a new pipeline).
    public var formatMismatches: UInt64 = 0
    /// Stream restarts.
    public var resyncs: UInt64 = 0
    /// Frames skipped to shrink excess delay.
    public var skippedFrames: UInt64 = 0
    /// Frames synthesized to grow the delay.
    public var stretchedFrames: UInt64 = 0
    /// Resampler errors (the block was filled with silence).
    public var resamplerErrors: UInt64 = 0
    /// Output level meter: peak |sample| of the played audio, held and decaying by about 20 dB per second.
    public var peakLevel: Float = 0
    /// Frames played as silence while playback was held (the host paused this player): neither loss nor
    /// concealment.
    public var heldFrames: UInt64 = 0
    /// Whether playback is held now.
    public var held: Bool = false
    /// The encoding the host sends, and the bytes of audio packets that got through.
    public var wire = PacketIngress.WireUsage()
    public init() {}
}

/// The atomics behind `PlayoutRenderer.stats`: the render thread stores, any thread loads.
final class PublishedStats: Sendable {
    let buffered = Atomic<UInt64>(0), target = Atomic<UInt64>(0), playout = Atomic<UInt64>(0)
    let host = Atomic<UInt64>(0), jitter = Atomic<UInt64>(0), peakJitter = Atomic<UInt64>(0)
    let loss = Atomic<UInt64>(0), concealed = Atomic<UInt64>(0), drift = Atomic<UInt64>(0)
    let steady = Atomic<UInt64>(0), estimatedDrift = Atomic<UInt64>(0), excursion = Atomic<UInt64>(0)
    let resampling = Atomic<Bool>(false), held = Atomic<Bool>(false)
    let heldFrames = Atomic<UInt64>(0)
    let peak = Atomic<UInt32>(0)
    let received = Atomic<UInt64>(0), late = Atomic<UInt64>(0), duplicates = Atomic<UInt64>(0)
    let lostPackets = Atomic<UInt64>(0), lostFrames = Atomic<UInt64>(0), concealedFrames = Atomic<UInt64>(0)
    let underruns = Atomic<UInt64>(0), resyncs = Atomic<UInt64>(0)
    let skipped = Atomic<UInt64>(0), stretched = Atomic<UInt64>(0), resamplerErrors = Atomic<UInt64>(0)

    func setFlag(_ value: Bool) { resampling.store(value, ordering: .relaxed) }
    func setCounts(_ c: JitterBuffer.Counters, concealed: UInt64, resamplerErrors r: UInt64) {
        received.store(c.received, ordering: .relaxed)
        late.store(c.late, ordering: .relaxed)
        duplicates.store(c.duplicates, ordering: .relaxed)
        lostPackets.store(c.lostPackets, ordering: .relaxed)
        lostFrames.store(c.lostFrames, ordering: .relaxed)
        concealedFrames.store(concealed, ordering: .relaxed)
        underruns.store(c.underruns, ordering: .relaxed)
        resyncs.store(c.resyncs, ordering: .relaxed)
        skipped.store(c.skippedFrames, ordering: .relaxed)
        stretched.store(c.stretchedFrames, ordering: .relaxed)
        resamplerErrors.store(r, ordering: .relaxed)
    }
    /// The stats, with the ingress stage's counts of the datagrams it dropped.
    func snapshot(ingress: PacketIngress.Counters) -> PlayoutStats {
        var s = PlayoutStats()
        s.sanitizedSamples = ingress.sanitizedSamples
        s.bufferedMilliseconds = loadDouble(buffered)
        s.steadyLatencyMilliseconds = loadDouble(steady)
        s.estimatedDriftPPM = loadDouble(estimatedDrift)
        s.clockExcursionMilliseconds = loadDouble(excursion)
        s.targetMilliseconds = loadDouble(target)
        s.playoutLatencyMilliseconds = loadDouble(playout)
        s.hostLatencyMilliseconds = loadDouble(host)
        s.jitterMilliseconds = loadDouble(jitter)
        s.peakJitterMilliseconds = loadDouble(peakJitter)
        s.lossPercent = loadDouble(loss)
        s.concealedMilliseconds = loadDouble(concealed)
        s.driftPPM = loadDouble(drift)
        s.resampling = resampling.load(ordering: .relaxed)
        s.received = received.load(ordering: .relaxed)
        s.late = late.load(ordering: .relaxed)
        s.duplicates = duplicates.load(ordering: .relaxed)
        s.lostPackets = lostPackets.load(ordering: .relaxed)
        s.lostFrames = lostFrames.load(ordering: .relaxed)
        s.concealedFrames = concealedFrames.load(ordering: .relaxed)
        s.underruns = underruns.load(ordering: .relaxed)
        s.resyncs = resyncs.load(ordering: .relaxed)
        s.skippedFrames = skipped.load(ordering: .relaxed)
        s.stretchedFrames = stretched.load(ordering: .relaxed)
        s.resamplerErrors = resamplerErrors.load(ordering: .relaxed)
        s.peakLevel = Float(bitPattern: peak.load(ordering: .relaxed))
        s.held = held.load(ordering: .relaxed)
        s.heldFrames = heldFrames.load(ordering: .relaxed)
        s.malformed = ingress.malformed
        s.formatMismatches = ingress.formatMismatches
        s.ringOverflows = ingress.ringOverflows
        s.stalePackets = ingress.stalePackets
        return s
    }
}

@inline(__always)
func storeDouble(_ a: borrowing Atomic<UInt64>, _ value: Double) { a.store(value.bitPattern, ordering: .relaxed) }

@inline(__always)
private func loadDouble(_ a: borrowing Atomic<UInt64>) -> Double { Double(bitPattern: a.load(ordering: .relaxed)) }
