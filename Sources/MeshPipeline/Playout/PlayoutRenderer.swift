import MeshAudio
import Synchronization

/// A snapshot of a `PlayoutRenderer`'s counters, readable from any thread.
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
    private let rate: Double
    // Drift-estimation timelines (render thread). Render: call time + device delay − nominal time of the frames
    // rendered since `renderOrigin`. Arrival: arrival time − nominal time of the frame since the stream's anchor.
    private var renderOrigin: UInt64 = 0
    private var renderedSinceOrigin: UInt64 = 0
    private var haveRenderOrigin = false
    private var lateness: Double = 0
    private var streamAnchorFrame: UInt64 = 0
    private var streamOriginNanos: UInt64 = 0
    private var haveStreamAnchor = false
    private var steadyLatency: Double = 0
    private var lastOutput: UnsafeMutablePointer<Float>

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
        rate = Double(format.sampleRate)
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
        lastOutput = .allocate(capacity: format.channels)
        lastOutput.initialize(repeating: 0, count: format.channels)
        published = PublishedStats()
    }

    deinit {
        fifo.deallocate()
        block.deallocate()
        marks.deallocate()
        history.deallocate()
        primeScratch.deallocate()
        lastOutput.deallocate()
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
        noteRenderTiming(context)
        while done < total {
            let n = min(maxPeriod, total - done)
            let now = context.nowNanos &+ UInt64(Double(done) * 1e9 / rate)
            renderBlock(buffer.baseAddress! + done * channels, frames: n, nowNanos: now)
            done += n
        }
        renderedSinceOrigin &+= UInt64(total)
        if total > 0 { lastOutput.update(from: buffer.baseAddress! + (total - 1) * channels, count: channels) }
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

    /// The render timeline for the drift estimate: the lateness of this call (time at which the first frame
    /// rendered now will play, minus its nominal time), fed to the controller's least-lateness floor. A jump of
    /// more than 20 ms from the floor (device restart, long stall, pre-fill) restarts the timeline.
    private func noteRenderTiming(_ context: RenderContext) {
        let play = context.nowNanos &+ UInt64(Double(max(0, context.deviceDelayFrames)) * 1e9 / rate)
        if !haveRenderOrigin {
            renderOrigin = play
            renderedSinceOrigin = 0
            haveRenderOrigin = true
        }
        lateness = Double(Int64(bitPattern: play &- renderOrigin)) - Double(renderedSinceOrigin) * 1e9 / rate
        if let floor = drift.latenessFloor(atNanos: context.nowNanos), abs(lateness - floor) > 20e6 {
            renderOrigin = play
            renderedSinceOrigin = 0
            lateness = 0
            drift.rebaseRenderTimeline()
        }
        drift.noteRender(latenessNanos: lateness, atNanos: context.nowNanos)
    }

    /// Transit of a packet ending at frame `end` that arrived at `arrival`, on the stream's timeline, ns.
    @inline(__always)
    private func transit(end: UInt64, arrival: UInt64) -> Double {
        Double(Int64(bitPattern: arrival &- streamOriginNanos))
            - Double(Int64(bitPattern: end &- streamAnchorFrame)) * 1e9 / rate
    }

    /// Stage 1: packets from the ring into the jitter buffer (and their transit into the drift estimate).
    private func ingest() {
        while let _ = ring.pop({ packet, samples in
            hostLatencyFrames = packet.header.hostLatencyFrames
            let result = jitter.insert(packet, samples: samples)
            if result == .formatMismatch { return }
            let h = packet.header
            if result == .resync || !haveStreamAnchor {
                if haveStreamAnchor { drift.reset() }   // a restarted stream may come from another clock
                streamAnchorFrame = h.firstFrameIndex
                streamOriginNanos = packet.arrivalNanos
                haveStreamAnchor = true
            }
            drift.noteArrival(transitNanos: transit(end: h.firstFrameIndex &+ UInt64(h.frameCount), arrival: packet.arrivalNanos),
                              atNanos: packet.arrivalNanos)
        }) {}
    }

    /// Stage 2: the drift controller sets the resampling ratio from the jitter-free clock excursion and latency.
    private func control(frames: Int, nowNanos: UInt64) {
        measuredLatency = latencyFrames(nowNanos: nowNanos)
        steadyLatency = measuredLatency
        guard jitter.isActive else { return }
        steadyLatency = drift.steadyLatency(
            rawFrames: measuredLatency, latenessNanos: lateness,
            newestTransitNanos: transit(end: jitter.newestFrameEnd, arrival: jitter.newestArrivalNanos), atNanos: nowNanos)
        guard jitter.isPlaying else { return }   // the controller only regulates a running stream
        let ppm = drift.update(steadyLatencyFrames: steadyLatency, targetFrames: jitter.targetFrames, nowNanos: nowNanos)
        guard drift.engaged || resampling else { return }   // bypass: the ratio is exactly 1, bit-exact
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
        // The jitter buffer compares its latency with the target (priming, stretch, skip) net of jitter: the
        // steady-latency offset measured at the start of this block rides along with the pipeline frames. It does
        // not start playing before the jitter floors have seen enough render calls (a start decided at one late
        // call would leave the latency short of the target for good).
        let pipeline = Double(fifoFrames) + (resampling ? Double(resampler.inputLatency) : 0)
            + (steadyLatency - measuredLatency)

        jitter.read(into: UnsafeMutableBufferPointer(start: block, count: n * channels),
                    marks: UnsafeMutableBufferPointer(start: marks, count: n), frames: n, nowNanos: nowNanos,
                    pipelineFrames: pipeline, holdStart: !drift.floorsReady)
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
        if produced < frames {
            // Should not happen (the FIFO is topped up before each pass); hold the last value rather than click.
            for i in produced..<frames {
                for c in 0..<channels {
                    out[i * channels + c] = i > 0 ? out[(i - 1) * channels + c] : lastOutput[c]
                }
            }
        }
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
        storeDouble(p.steady, steadyLatency * ms)
        storeDouble(p.estimatedDrift, drift.estimatedDriftPPM)
        storeDouble(p.excursion, drift.filteredExcursion * 1000)
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
    let steady = Atomic<UInt64>(0), estimatedDrift = Atomic<UInt64>(0), excursion = Atomic<UInt64>(0)
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
