/// A snapshot of a playout pipeline's counters and levels, readable from any thread.
public struct PlayoutStats: Sendable, Equatable, BitwiseCopyable {
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
    /// Frames synthesized by the concealer.
    public var concealedFrames: UInt64 = 0
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
    /// The jitter buffer's exact counters (packets received, late, lost…; frames lost, stretched, skipped).
    public var buffer = JitterBuffer.Counters()
    /// The ingress stage's counts of the datagrams it dropped or cleaned (counted on the network thread).
    public var ingress = PacketIngress.Counters()
    public init() {}

    // The counters most readers want, by their short names.

    /// Packets handed to the jitter buffer.
    public var received: UInt64 { buffer.received }
    /// Packets dropped as late.
    public var late: UInt64 { buffer.late }
    /// Packets dropped as duplicates.
    public var duplicates: UInt64 { buffer.duplicates }
    /// Packets lost on the network.
    public var lostPackets: UInt64 { buffer.lostPackets }
    /// Frames that reached playout without data.
    public var lostFrames: UInt64 { buffer.lostFrames }
    /// Renders that found the buffer empty.
    public var underruns: UInt64 { buffer.underruns }
    /// Stream restarts.
    public var resyncs: UInt64 { buffer.resyncs }
    /// Frames skipped to shrink excess delay.
    public var skippedFrames: UInt64 { buffer.skippedFrames }
    /// Frames synthesized to grow the delay.
    public var stretchedFrames: UInt64 { buffer.stretchedFrames }
    /// Late packets that continued a stream where it had run dry.
    public var lateResumes: UInt64 { buffer.lateResumes }
    /// Datagrams that failed to decode.
    public var malformed: UInt64 { ingress.malformed }
    /// Datagrams dropped because the packet ring was full.
    public var ringOverflows: UInt64 { ingress.ringOverflows }
    /// Opus packets that arrived after a newer one was decoded (reordered or duplicated): dropped.
    public var stalePackets: UInt64 { ingress.stalePackets }
    /// Samples that arrived outside [−1, 1] (clamped) or not finite (zeroed).
    public var sanitizedSamples: UInt64 { ingress.sanitizedSamples }
    /// Packets of a format other than the pipeline's (each one reported upward, for a new pipeline).
    public var formatMismatches: UInt64 { ingress.formatMismatches }
    /// Opus packets dropped because their decoder was not ready (the stream's first while libopus loads) or cannot
    /// be made.
    public var undecodedPackets: UInt64 { ingress.undecodedPackets }
}
