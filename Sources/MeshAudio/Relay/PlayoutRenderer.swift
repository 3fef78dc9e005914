import Synchronization

/// A snapshot of a `PlayoutRenderer`'s counters, readable from any thread.
public struct PlayoutStats: Sendable, Equatable {
    /// Latency queued in the relay on this side (jitter buffer + staging + resampler look-ahead) at the start of
    /// the latest pull, ms — the quantity the drift controller holds at the target.
    public var bufferedMilliseconds: Double = 0
    /// The jitter buffer's current target, ms.
    public var targetMilliseconds: Double = 0
    /// Buffered latency plus the device's queue (`RenderContext.deviceDelayFrames`), ms.
    public var playoutLatencyMilliseconds: Double = 0
    /// The host's capture-device delay from the latest packet's host report, ms.
    public var hostLatencyMilliseconds: Double = 0
    /// RFC 3550 interarrival jitter, ms.
    public var jitterMilliseconds: Double = 0
    /// Peak transit deviation over the jitter window, ms.
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
    /// Packets of a format other than the player's.
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
    public init() {}
}

/// The receive side of the relay for the playback real-time thread: packet ring → jitter buffer → concealer →
/// staging FIFO → drift-corrected resampler (or bit-exact bypass) → device.
///
/// The network thread calls `enqueue(packet:arrivalNanos:)` (decode + push into the SPSC `PacketRing`); the sink's
/// real-time thread calls `render(into:context:)`, which never allocates, locks, logs or touches Foundation.
/// `stats` is readable from any thread (atomics). The stream must be in the renderer's `format`; packets in any
/// other format are counted (`formatMismatches`) and dropped — the assembly reopens the device to follow a format
/// change.
public final class PlayoutRenderer: AudioRenderer, @unchecked Sendable {
    // @unchecked: `enqueue` (one network thread) touches only the SPSC ring and atomics; all other mutable state is
    // touched only by the single render thread; `stats` reads atomics only.

    /// Tuning of the whole chain.
    public struct Configuration: Sendable, Equatable {
        public var jitter = JitterBuffer.Configuration()
        public var drift = DriftController.Configuration()
        /// libspeexdsp quality, 0...10.
        public var resamplerQuality = 5
        /// Packets the network thread can queue ahead of the render thread.
        public var ringCapacity = 512
        /// Largest `context.frames` handled in one pass (bigger pulls are split).
        public var maximumPeriodFrames = 4096
        public init(mode: JitterBuffer.Mode = .auto) { jitter = JitterBuffer.Configuration(mode: mode) }
    }

    /// The format played (and accepted from the network).
    public let format: AudioFormat
    /// The configuration in use.
    public let configuration: Configuration

    private let ring: PacketRing
    private var jitter: JitterBuffer
    private var concealer: Concealer
    private var drift: DriftController
    private let resampler: SpeexResampler
    private var resampling = false
    private let channels: Int
    private let maxPeriod: Int
    // Staging FIFO of concealed, stream-rate frames waiting for the resampler.
    private let fifo: UnsafeMutablePointer<Float>
    private let fifoCapacity: Int
    private var fifoFrames = 0
    // Jitter-buffer output block and its marks.
    private let block: UnsafeMutablePointer<Float>
    private let marks: UnsafeMutablePointer<UInt8>
    // The last frames played in bypass (to prime the resampler), and scratch for priming.
    private let historyFrames: Int
    private let history: UnsafeMutablePointer<Float>
    private let primeScratch: UnsafeMutablePointer<Float>
    private var hostLatencyFrames: UInt32 = 0
    private var resamplerErrorCount: UInt64 = 0

    // Producer-side counters.
    private let malformedCount = Atomic<UInt64>(0)
    private let overflowCount = Atomic<UInt64>(0)
    // Published stats (render thread writes, anyone reads).
    private let published: PublishedStats

    /// Builds the chain for `format`. Throws when the format is unsupported or libspeexdsp fails.
    public init(format: AudioFormat, configuration: Configuration = Configuration()) throws {
        try format.validate()
        self.format = format
        self.configuration = configuration
        channels = format.channels
        maxPeriod = max(16, configuration.maximumPeriodFrames)
        ring = PacketRing(capacity: configuration.ringCapacity)
        jitter = JitterBuffer(format: format, configuration: configuration.jitter)
        concealer = Concealer(format: format)
        drift = DriftController(sampleRate: format.sampleRate, configuration: configuration.drift)
        resampler = try SpeexResampler(
            channels: format.channels, inputRate: format.sampleRate, outputRate: format.sampleRate,
            quality: configuration.resamplerQuality,
            maximumCorrectionPPM: configuration.drift.maximumCorrectionPPM)
        let blockFrames = maxPeriod + maxPeriod / 8 + 16
        fifoCapacity = 2 * blockFrames
        fifo = .allocate(capacity: fifoCapacity * channels)
        fifo.initialize(repeating: 0, count: fifoCapacity * channels)
        block = .allocate(capacity: blockFrames * channels)
        block.initialize(repeating: 0, count: blockFrames * channels)
        marks = .allocate(capacity: blockFrames)
        marks.initialize(repeating: 0, count: blockFrames)
        historyFrames = 2 * resampler.inputLatency
        history = .allocate(capacity: historyFrames * channels)
        history.initialize(repeating: 0, count: historyFrames * channels)
        primeScratch = .allocate(capacity: historyFrames * channels)
        primeScratch.initialize(repeating: 0, count: historyFrames * channels)
        published = PublishedStats()
    }

    deinit {
        fifo.deallocate()
        block.deallocate()
        marks.deallocate()
        history.deallocate()
        primeScratch.deallocate()
    }

    // MARK: - Network thread

    /// Producer side (one network thread): decodes a datagram straight into the packet ring. Returns false — and
    /// counts it — when the bytes are malformed or the ring is full.
    @discardableResult
    public func enqueue(packet bytes: UnsafeRawBufferPointer, arrivalNanos: UInt64) -> Bool {
        switch ring.push(encoded: bytes, arrivalNanos: arrivalNanos) {
        case .pushed: return true
        case .full:
            overflowCount.add(1, ordering: .relaxed)
            return false
        case .malformed:
            malformedCount.add(1, ordering: .relaxed)
            return false
        }
    }

    // MARK: - Render thread

    /// Fills exactly `context.frames` frames. Real-time safe.
    public func render(into buffer: UnsafeMutableBufferPointer<Float>, context: RenderContext) {
        var done = 0
        let total = min(context.frames, buffer.count / channels)
        while done < total {
            let n = min(maxPeriod, total - done)
            let now = context.nowNanos &+ UInt64(Double(done) * 1e9 / Double(format.sampleRate))
            renderBlock(buffer.baseAddress! + done * channels, frames: n, nowNanos: now)
            done += n
        }
        var peak: Float = 0
        for i in 0..<(total * channels) { peak = max(peak, abs(buffer[i])) }
        let decay = 1 - min(1, Float(total) * 2.3 / Float(format.sampleRate))   // ≈ 20 dB per second
        heldPeak = max(peak, heldPeak * decay)
        published.peak.store(heldPeak.bitPattern, ordering: .relaxed)
        publish(deviceDelayFrames: context.deviceDelayFrames)
    }

    /// One pass of the chain: ingest → measure → control → produce.
    private func renderBlock(_ out: UnsafeMutablePointer<Float>, frames: Int, nowNanos: UInt64) {
        ingest()
        control(frames: frames, nowNanos: nowNanos)
        if resampling {
            produceResampled(out, frames: frames, nowNanos: nowNanos)
        } else {
            produceBypass(out, frames: frames, nowNanos: nowNanos)
        }
    }

    /// Stage 1: packets from the ring into the jitter buffer.
    private func ingest() {
        while let _ = ring.pop({ packet, samples in
            hostLatencyFrames = packet.header.hostLatencyFrames
            jitter.insert(packet, samples: samples)
        }) {}
    }

    /// Stage 2: the drift controller sets the resampling ratio from the latency error.
    private func control(frames: Int, nowNanos: UInt64) {
        measuredLatency = latencyFrames(nowNanos: nowNanos)
        guard jitter.isPlaying else { return }   // the controller only regulates a running stream
        let error = measuredLatency - jitter.targetFrames
        let ppm = drift.update(errorFrames: error, elapsedFrames: frames)
        guard drift.engaged else { return }
        if !resampling {
            do {
                try resampler.prime(
                    history: UnsafeBufferPointer(start: history, count: historyFrames * channels),
                    scratch: UnsafeMutableBufferPointer(start: primeScratch, count: historyFrames * channels))
                resampling = true
            } catch { resamplerErrorCount &+= 1; return }
        }
        do { try resampler.setCorrection(ppm: ppm) } catch { resamplerErrorCount &+= 1 }
    }

    /// Latency queued on this side: jitter buffer + staging FIFO + resampler look-ahead, frames.
    private func latencyFrames(nowNanos: UInt64) -> Double {
        jitter.latencyFrames(nowNanos: nowNanos) + Double(fifoFrames) + (resampling ? Double(resampler.inputLatency) : 0)
    }

    /// Stage 3: jitter buffer → concealer → staging FIFO, `frames` more frames.
    private func pull(frames: Int, nowNanos: UInt64) {
        let n = min(frames, fifoCapacity - fifoFrames)
        guard n > 0 else { return }
        let pipeline = Double(fifoFrames) + (resampling ? Double(resampler.inputLatency) : 0)
        jitter.read(into: UnsafeMutableBufferPointer(start: block, count: n * channels),
                    marks: UnsafeMutableBufferPointer(start: marks, count: n), frames: n, nowNanos: nowNanos,
                    pipelineFrames: pipeline)
        concealer.process(UnsafeMutableBufferPointer(start: block, count: n * channels),
                          marks: UnsafeBufferPointer(start: marks, count: n), frames: n)
        (fifo + fifoFrames * channels).update(from: block, count: n * channels)
        fifoFrames += n
    }

    private func dropFIFO(_ n: Int) {
        let rest = fifoFrames - n
        if rest > 0 { fifo.update(from: fifo + n * channels, count: rest * channels) }
        fifoFrames = rest
    }

    /// Stage 4a: bit-exact bypass (ratio exactly 1).
    private func produceBypass(_ out: UnsafeMutablePointer<Float>, frames: Int, nowNanos: UInt64) {
        if fifoFrames < frames { pull(frames: frames - fifoFrames, nowNanos: nowNanos) }
        out.update(from: fifo, count: frames * channels)
        dropFIFO(frames)
        // Keep the last `historyFrames` played frames for a seamless switch to resampling.
        let h = historyFrames
        if frames >= h {
            history.update(from: out + (frames - h) * channels, count: h * channels)
        } else {
            history.update(from: history + frames * channels, count: (h - frames) * channels)
            (history + (h - frames) * channels).update(from: out, count: frames * channels)
        }
    }

    /// Stage 4b: drift-corrected resampling.
    private func produceResampled(_ out: UnsafeMutablePointer<Float>, frames: Int, nowNanos: UInt64) {
        var produced = 0
        var guardPasses = 0
        while produced < frames && guardPasses < 4 {
            guardPasses += 1
            let want = Int((Double(frames - produced) * resampler.ratio).rounded(.up)) + 2
            if fifoFrames < want { pull(frames: want - fifoFrames, nowNanos: nowNanos) }
            do {
                let r = try resampler.process(
                    input: UnsafeBufferPointer(start: fifo, count: fifoFrames * channels),
                    output: UnsafeMutableBufferPointer(start: out + produced * channels, count: (frames - produced) * channels))
                dropFIFO(r.consumed)
                produced += r.produced
            } catch {
                resamplerErrorCount &+= 1
                break
            }
        }
        if produced < frames { (out + produced * channels).update(repeating: 0, count: (frames - produced) * channels) }
    }

    // MARK: - Stats

    /// A snapshot of the counters (any thread).
    public var stats: PlayoutStats { published.snapshot(malformed: malformedCount.load(ordering: .relaxed),
                                                         overflows: overflowCount.load(ordering: .relaxed)) }

    private func publish(deviceDelayFrames: Int) {
        let c = jitter.snapshot
        let ms = 1000 / Double(format.sampleRate)
        let p = published
        let latency = measuredLatency
        storeDouble(p.buffered, latency * ms)
        storeDouble(p.target, jitter.targetFrames * ms)
        storeDouble(p.playout, (latency + Double(deviceDelayFrames)) * ms)
        storeDouble(p.host, Double(hostLatencyFrames) * ms)
        storeDouble(p.jitter, jitter.interarrivalJitterNanos / 1e6)
        storeDouble(p.peakJitter, jitter.peakDeviationNanosInWindow / 1e6)
        let sent = c.lostPackets &+ c.accepted &+ c.late
        storeDouble(p.loss, sent == 0 ? 0 : 100 * Double(c.lostPackets) / Double(sent))
        storeDouble(p.concealed, Double(concealer.concealedFrames) * ms)
        storeDouble(p.drift, drift.engaged ? drift.correctionPPM : 0)
        p.setFlag(resampling)
        p.setCounts(c, concealed: concealer.concealedFrames, resamplerErrors: resamplerErrorCount)
    }

    /// Latency at the start of the latest block, before it was consumed (what the controller saw).
    private var measuredLatency: Double = 0
    private var heldPeak: Float = 0
}

/// The atomics behind `PlayoutRenderer.stats`: the render thread stores, any thread loads.
private final class PublishedStats: Sendable {
    let buffered = Atomic<UInt64>(0), target = Atomic<UInt64>(0), playout = Atomic<UInt64>(0)
    let host = Atomic<UInt64>(0), jitter = Atomic<UInt64>(0), peakJitter = Atomic<UInt64>(0)
    let loss = Atomic<UInt64>(0), concealed = Atomic<UInt64>(0), drift = Atomic<UInt64>(0)
    let resampling = Atomic<Bool>(false)
    let peak = Atomic<UInt32>(0)
    let received = Atomic<UInt64>(0), late = Atomic<UInt64>(0), duplicates = Atomic<UInt64>(0)
    let lostPackets = Atomic<UInt64>(0), lostFrames = Atomic<UInt64>(0), concealedFrames = Atomic<UInt64>(0)
    let underruns = Atomic<UInt64>(0), formatMismatches = Atomic<UInt64>(0), resyncs = Atomic<UInt64>(0)
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
        formatMismatches.store(c.formatMismatches, ordering: .relaxed)
        resyncs.store(c.resyncs, ordering: .relaxed)
        skipped.store(c.skippedFrames, ordering: .relaxed)
        stretched.store(c.stretchedFrames, ordering: .relaxed)
        resamplerErrors.store(r, ordering: .relaxed)
    }
    func snapshot(malformed: UInt64, overflows: UInt64) -> PlayoutStats {
        var s = PlayoutStats()
        s.bufferedMilliseconds = loadDouble(buffered)
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
        s.formatMismatches = formatMismatches.load(ordering: .relaxed)
        s.resyncs = resyncs.load(ordering: .relaxed)
        s.skippedFrames = skipped.load(ordering: .relaxed)
        s.stretchedFrames = stretched.load(ordering: .relaxed)
        s.resamplerErrors = resamplerErrors.load(ordering: .relaxed)
        s.malformed = malformed
        s.peakLevel = Float(bitPattern: peak.load(ordering: .relaxed))
        s.ringOverflows = overflows
        return s
    }
}

@inline(__always)
private func storeDouble(_ a: borrowing Atomic<UInt64>, _ value: Double) { a.store(value.bitPattern, ordering: .relaxed) }

@inline(__always)
private func loadDouble(_ a: borrowing Atomic<UInt64>) -> Double { Double(bitPattern: a.load(ordering: .relaxed)) }
