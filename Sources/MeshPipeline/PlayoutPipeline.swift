import MeshAudio
import MeshPOSIX

/// The receive direction of the relay, assembled in one place. Read it top to bottom:
///
///     datagram ─▶ PacketIngress ─▶ PacketRing ─▶ JitterBuffer ─▶ Concealer ─▶ DriftResampler ─▶ OutputStage ─▶ sink
///                 network thread:  SPSC hand-    render thread, pulled by the sink once per period
///                 one decode, one  over               ▲ latency          ▲ ratio
///                 format check                        └──── DriftController ┘    gain ramp, beep
///
/// `OutputControls` (set by the listener, any thread) hold playback — silence, nothing queued, a fresh start at the
/// live edge when released — and set the volume, mute and beep the `OutputStage` applies.
/// Datagrams reach the ingress one of two ways: a network thread hands them to `receive`, or — `start(reading:)` with
/// a `PacketSource` — the sink's own real-time thread reads them, waiting on the source's descriptor beside its device
/// (one thread, one wake-up per period; the sink renders each block as soon as its packets are in, `RenderSchedule`).
/// Released while running, the pipeline stops its sink.
/// The sink's thread pulls `renderer`, which walks the chain block by block (`PlayoutRenderer.render`). The sink is an
/// input — an ALSA `Player`, a `WAVFileSink`, a test's virtual-time sink — so the pipeline depends on no device and
/// not on PeerMesh.
///
/// A pipeline plays one format. A packet in another format is counted and reported (`takePendingFormat`): its owner
/// builds a pipeline for that format and swaps it in.
public final class PlayoutPipeline: Sendable {
    /// Tuning of the whole chain.
    public struct Configuration: Sendable, Equatable {
        /// The jitter buffer's tuning.
        public var jitter = JitterBuffer.Configuration()
        /// The drift controller's tuning.
        public var drift = DriftController.Configuration()
        /// libspeexdsp quality, 0...10.
        public var resamplerQuality = 5
        /// Packets the network end can queue ahead of the render end (nil: 512, or 32 for a pipeline made
        /// `readingInput`, whose sink's own thread reads the datagrams (`start(reading:)`) and takes each batch — at
        /// most 32 — in before it reads the next: a slot holds the largest packet, 2.3 KB, so the smaller ring keeps
        /// 1.1 MB out of the player's memory). One that another thread pushes into (`receive`) needs the 512: a burst
        /// after a stall comes faster than one render a period takes it out.
        public var ringCapacity: Int?
        /// Largest block walked through the chain at once (bigger pulls are split).
        public var maximumPeriodFrames = 4096
        /// The defaults, with the jitter buffer in `mode`.
        public init(mode: JitterBuffer.Mode = .auto) { jitter = JitterBuffer.Configuration(mode: mode) }
    }

    /// The format played (and accepted from the network).
    public let format: AudioFormat
    /// The configuration in use.
    public let configuration: Configuration
    /// Where the audio goes.
    public let sink: any AudioSink
    /// The render-thread end of the chain: what `sink` pulls.
    public let renderer: PlayoutRenderer
    private let ingress: PacketIngress
    /// Whether the sink's thread reads the datagrams (`start(reading:)`), or another thread hands them in (`receive`).
    private let readingInput: Bool

    /// The listener's controls (hold, volume, mute, beep), shared with the pipelines that replace this one.
    public let controls: OutputControls

    /// Assembles the chain for `format`, ending in `sink` (not started yet), under `controls`. `readingInput`: it
    /// will be started `reading` a source on the sink's own thread (which the sink must serve,
    /// `AudioSink.servesInput`); without it, datagrams come through `receive`. Throws when the format is unsupported
    /// or libspeexdsp fails.
    public init(format: AudioFormat, configuration: Configuration = Configuration(), sink: any AudioSink,
                controls: OutputControls = OutputControls(), readingInput: Bool = false) throws {
        try format.validate()
        precondition(!readingInput || sink.servesInput, "PlayoutPipeline: reading input on a sink that does not serve it")
        self.format = format
        self.configuration = configuration
        self.sink = sink
        self.controls = controls
        self.readingInput = readingInput
        let packets = PacketRing(capacity: configuration.ringCapacity ?? (readingInput ? 32 : 512))
        ingress = PacketIngress(format: format, ring: packets)
        renderer = try PlayoutRenderer(
            format: format,
            packets: packets,
            controls: controls,
            upstream: ConcealedStream(jitterBuffer: JitterBuffer(format: format, configuration: configuration.jitter),
                                      concealer: Concealer(format: format)),
            drift: DriftController(sampleRate: format.sampleRate, configuration: configuration.drift),
            resampler: DriftResampler(format: format, maximumPeriodFrames: max(16, configuration.maximumPeriodFrames),
                                      quality: configuration.resamplerQuality,
                                      maximumCorrectionPPM: configuration.drift.maximumCorrectionPPM))
    }

    deinit {
        sink.stop()
    }

    /// Starts the sink: it plays silence until audio arrives. With a `source`, the sink's thread reads the datagrams
    /// itself (a sink that serves inputs, `AudioSink.servesInput`, does; another one ignores it, and the owner hands
    /// them to `receive`). Make the pipeline `readingInput` when a source will be given, for the ring that fits it.
    public func start(reading source: (any PacketSource)? = nil) throws {
        if let source { renderer.input = SourceInput(source: source, ingress: ingress) }
        try sink.start(renderer: renderer)
    }

    /// Stops the sink (a WAV file is finalized).
    public func stop() { sink.stop() }

    /// The network end (one thread): a datagram that arrived at `arrivalNanos` (receiver clock).
    @discardableResult
    public func receive(_ datagram: UnsafeRawBufferPointer, arrivalNanos: UInt64) -> PacketIngress.Outcome {
        ingress.receive(datagram, arrivalNanos: arrivalNanos)
    }

    /// The other format the host switched to, taken (each report once); nil when there is none.
    public func takePendingFormat() -> AudioFormat? { ingress.takePendingFormat() }

    /// Why the Opus packets that arrive cannot be decoded (libopus is missing…), or nil.
    public var opusFailure: String? { ingress.opusFailure }

    /// A snapshot of the counters and levels (any thread).
    public var stats: PlayoutStats {
        let counters = ingress.counters
        var s = renderer.stats(ingress: counters)
        s.wire = ingress.wire
        // What the Opus decoder concealed is concealment too.
        s.concealedFrames &+= counters.decoderConcealedFrames
        s.concealedMilliseconds += Double(counters.decoderConcealedFrames) * 1000 / Double(format.sampleRate)
        return s
    }
}

/// Where a pipeline's datagrams come from when its sink's thread reads them (`PlayoutPipeline.start(reading:)`): a
/// PeerMesh session's `DatagramReader`, say. Real-time safe, as the sink's thread.
public protocol PacketSource: AnyObject, Sendable {
    /// What to wait on for `POLLIN`.
    var descriptor: Int32 { get }
    /// Reads the datagrams that have arrived (never blocks) and hands each to `ingress.receive`.
    func read(into ingress: PacketIngress)
}

/// A `PacketSource` as the sink sees it: the render input that reads into a pipeline's ingress. It holds the
/// ingress, not the pipeline, so the sink's thread never touches a pipeline being released (whose `deinit` stops
/// the sink).
final class SourceInput: RenderInput {
    let source: any PacketSource
    let ingress: PacketIngress

    init(source: any PacketSource, ingress: PacketIngress) {
        self.source = source
        self.ingress = ingress
    }

    var descriptor: Int32 { source.descriptor }
    func pump() { source.read(into: ingress) }
}

/// The render-thread end of a `PlayoutPipeline`, pulled by its sink. Each pull walks the chain once per block of at
/// most `maximumPeriodFrames` (`renderBlock`): packets → jitter buffer (their transits → drift controller); the
/// latency held → drift controller → steering; jitter buffer → concealer → resampler → out. Real-time safe: it never
/// allocates, locks, logs or touches Foundation.
public final class PlayoutRenderer: AudioRenderer, @unchecked Sendable {  // Mutable state: the render thread's only.
    private let packets: PacketRing
    /// Jitter buffer → concealer: what the resampler pulls.
    private var upstream: ConcealedStream
    private var drift: DriftController
    private let resampler: DriftResampler
    private var meter: LevelMeter
    private let channels: Int
    private let rate: Double
    private let maximumBlockFrames: Int
    /// The host's capture-device delay, from the latest packet's host report.
    private var hostLatencyFrames: UInt32 = 0
    /// The latest block's steering (its measured and jitter-free latency are published).
    private var latest: DriftSteering
    /// What the render thread publishes after each pull (levels and the chain's counters).
    private let published = AtomicRecord(PlayoutStats())
    private let controls: OutputControls
    private var output: OutputStage
    /// Whether the latest pull was held (playback silent, the stream forgotten).
    private var holding = false
    /// The next packet starts a new stream for the drift controller (the first after a hold).
    private var restartPending = false
    private var heldFrames: UInt64 = 0
    /// The device's clock against the monotonic clock, from the pulls.
    private var deviceClock: DeviceClockMeter
    /// The input the sink serves, set before the sink starts (`PlayoutPipeline.start(reading:)`).
    public internal(set) var input: (any RenderInput)?

    init(format: AudioFormat, packets: PacketRing, controls: OutputControls, upstream: ConcealedStream,
         drift: DriftController, resampler: DriftResampler) {
        self.packets = packets
        self.controls = controls
        output = OutputStage(sampleRate: format.sampleRate, channels: format.channels, continuing: controls)
        self.upstream = upstream
        self.drift = drift
        self.resampler = resampler
        meter = LevelMeter(sampleRate: format.sampleRate)
        deviceClock = DeviceClockMeter(rate: Double(format.sampleRate))
        channels = format.channels
        rate = Double(format.sampleRate)
        maximumBlockFrames = resampler.maximumPeriodFrames
        latest = DriftSteering(measuredLatencyFrames: 0, steadyLatencyFrames: 0, correctionPPM: nil, engaged: false,
                               floorsReady: false)
    }

    /// Fills exactly `context.frames` frames. Real-time safe.
    public func render(into buffer: UnsafeMutableBufferPointer<Float>, context: RenderContext) {
        let total = min(context.frames, buffer.count / channels)
        drift.noteRenderCall(nowNanos: context.nowNanos, deviceDelayFrames: context.deviceDelayFrames)
        // Feedback: the device's clock against the arrivals' → the jitter estimate.
        deviceClock.notePull(frames: total, nowNanos: context.nowNanos)
        upstream.jitterBuffer.deviceClockPPM = deviceClock.ppm
        let held = controls.held
        if held && holding {
            hold(buffer.baseAddress!, frames: total)
        } else {
            if holding {
                holding = false
                restartPending = true
            }
            var done = 0
            while done < total {
                let n = min(maximumBlockFrames, total - done)
                renderBlock(buffer.baseAddress! + done * channels, frames: n,
                            nowNanos: context.nowNanos &+ UInt64(Double(done) * 1e9 / rate))
                done += n
            }
            if total > 0 { resampler.noteLastOutput(buffer.baseAddress! + (total - 1) * channels) }
            // The first held pull plays its block fading out, then the hold begins: the silence never starts with a
            // step (a click). Playing again needs nothing of the kind: the concealer fades a new stream in.
            if held { fadeOutAndHold(buffer.baseAddress!, frames: total) }
        }
        drift.noteRendered(frames: total)
        let muted = controls.muted
        output.process(buffer.baseAddress!, frames: total, target: muted ? 0 : controls.targetGain,
                       beeps: controls.beepCount, muted: muted)
        meter.measure(UnsafeBufferPointer(rebasing: buffer[0..<(total * channels)]), frames: total)
        publish(deviceDelayFrames: context.deviceDelayFrames)
    }

    /// The first held pull (a pause, or a talk that holds playback): its block, just rendered, fades linearly to
    /// silence; then the stream is forgotten (jitter buffer, concealer and drift controller start over), so that
    /// when the hold ends the first packet primes the buffer afresh at the live edge: no backlog and no burst.
    private func fadeOutAndHold(_ out: UnsafeMutablePointer<Float>, frames: Int) {
        for f in 0..<frames {
            let gain = Float(frames - 1 - f) / Float(max(1, frames))
            for c in 0..<channels { out[f * channels + c] *= gain }
        }
        holding = true
        upstream.jitterBuffer.reset()
        upstream.concealer.reset()
        drift.reset()
    }

    /// Held, after the first held pull: silence out, and whatever arrives is dropped; the silence is neither loss
    /// nor concealment.
    private func hold(_ out: UnsafeMutablePointer<Float>, frames: Int) {
        while let _ = packets.pop({ _, _ in }) {}
        out.update(repeating: 0, count: frames * channels)
        heldFrames &+= UInt64(frames)
    }

    /// Whether the next `frames` frames can be rendered without concealing anything for lack of data: the packets
    /// that arrived are taken in first. Real-time safe (the sink's thread).
    public func isReady(frames: Int) -> Bool {
        if controls.held && holding { return true }
        absorbPackets()
        return upstream.jitterBuffer.holdsNext(resampler.upstreamFramesNeeded(forOutput: min(frames, maximumBlockFrames)))
    }

    /// Packets → jitter buffer; each one's transit → drift controller (a resync restarts the controller).
    private func absorbPackets() {
        while let _ = packets.pop({ packet, samples in
            hostLatencyFrames = packet.header.hostLatencyFrames
            let stored = upstream.jitterBuffer.insert(packet, samples: samples)
            // Frames the Opus decoder concealed arrived with the next packet: no arrival time of their own.
            if !packet.concealed || stored == .resync {
                drift.notePacket(firstFrame: packet.header.firstFrameIndex, frames: packet.header.frameCount,
                                 arrivalNanos: packet.arrivalNanos, streamRestarted: stored == .resync || restartPending)
                restartPending = false
            }
        }) {}
    }

    /// One block through the chain.
    private func renderBlock(_ out: UnsafeMutablePointer<Float>, frames: Int, nowNanos: UInt64) {
        absorbPackets()
        // Feedback: the latency held here (jitter buffer + resampler queue) → drift controller → steering.
        let measured = upstream.jitterBuffer.latencyFrames(nowNanos: nowNanos) + Double(resampler.stagedFrames)
            + resampler.lookAheadFrames
        let steering = drift.steer(measuredLatencyFrames: measured, stream: upstream.jitterBuffer.bufferedStream,
                                   nowNanos: nowNanos)
        latest = steering
        // Jitter buffer → concealer, pulled by the resampler → out; both steered by the drift controller.
        resampler.render(into: out, frames: frames, nowNanos: nowNanos, steering: steering,
                         from: &upstream, feedback: steering.jitterFeedback)
    }

    // MARK: - Stats

    /// The published counters and levels, with the ingress stage's counts (any thread).
    func stats(ingress: PacketIngress.Counters) -> PlayoutStats {
        var s = published.load()
        s.ingress = ingress
        return s
    }

    private func publish(deviceDelayFrames: Int) {
        let c = upstream.jitterBuffer.snapshot
        let ms = 1000 / rate
        let latency = latest.measuredLatencyFrames
        // Of the packets the host sent (by sequence number): packets the Opus decoder concealed are stored, but
        // were lost, so `accepted` is no measure of what was sent.
        let sent = upstream.jitterBuffer.expectedPackets
        var s = PlayoutStats()
        s.bufferedMilliseconds = latency * ms
        s.steadyLatencyMilliseconds = latest.steadyLatencyFrames * ms
        s.estimatedDriftPPM = drift.estimatedDriftPPM
        s.clockExcursionMilliseconds = drift.filteredExcursion * 1000
        s.targetMilliseconds = upstream.jitterBuffer.targetFrames * ms
        s.playoutLatencyMilliseconds = (latency + Double(deviceDelayFrames)) * ms
        s.hostLatencyMilliseconds = Double(hostLatencyFrames) * ms
        s.jitterMilliseconds = upstream.jitterBuffer.interarrivalJitterNanos / 1e6
        s.peakJitterMilliseconds = upstream.jitterBuffer.peakDeviationNanosInWindow / 1e6
        s.lossPercent = sent == 0 ? 0 : 100 * Double(c.lostPackets) / Double(sent)
        s.concealedMilliseconds = Double(upstream.concealer.concealedFrames) * ms
        s.driftPPM = drift.engaged ? drift.correctionPPM : 0
        s.resampling = resampler.isResampling
        s.buffer = c
        s.concealedFrames = upstream.concealer.concealedFrames
        s.resamplerErrors = resampler.errors
        s.peakLevel = meter.peak
        s.held = holding
        s.heldFrames = heldFrames
        published.store(s)
    }
}
