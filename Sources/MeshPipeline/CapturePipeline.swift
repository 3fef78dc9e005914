import MeshAudio
import Synchronization

/// The send direction of the relay, assembled in one place. Read it top to bottom:
///
///     source ─▶ (mute) ─▶ tap ─▶ Packetizer ─▶ send
///     its own    the source's own thread (`SendThread.source`, the default) or a pm-send thread (`.own`): one read,
///     thread     one packetize, one send per packet; the tap (clips' pre-roll) takes a copy without waiting
///
/// `.source` wakes the host once per period instead of twice (measured: the host's own threads 804 → 366 context
/// switches a second, about 45 % less CPU), and a packet leaves as soon as its period is captured. (It was not the
/// default while players rendered at the device's own instant: a packet sent from the capture callback of a JACK
/// graph shared with the player landed on that instant, half the time just after it. Players now render each block
/// as soon as its packet is in, up to a deadline: `RenderSchedule`.)
///
/// The source (a `Recorder`, a `ToneSource`, a `WAVFileSource`) and the network are inputs: once per captured chunk
/// `withAudience` lends who listens now (it does not call back when nobody does — the chunk is then not packetized,
/// so sequence numbers count the packets that went out), and `send` sends one packet to them. `RelayHost` passes a
/// PeerMesh session's, so this module does not depend on PeerMesh. With `.source` both run on the capture thread:
/// they must not allocate, lock or wait. The audience is lent for the call, not returned, so that its owner keeps it
/// alive until the chunk is sent: a snapshot replaced meanwhile is freed on the owner's thread, never on this one.
public final class CapturePipeline<Audience>: Sendable {
    /// Counters and levels, readable from any thread.
    public struct Statistics: Sendable, Equatable {
        /// Packets that went out, one for each listener a packet reached.
        public var packetsSent: UInt64 = 0
        /// Frames read from the source.
        public var framesCaptured: UInt64 = 0
        /// Peak |sample| of the latest chunk.
        public var peakLevel: Float = 0
        /// RMS of the latest chunk.
        public var rmsLevel: Float = 0
        public init() {}
    }

    /// Which thread packetizes and sends.
    public enum SendThread: Sendable, Equatable {
        /// A thread of the pipeline's own (`pm-send`), reading the source's ring: two wake-ups per period.
        case own
        /// The source's thread itself (`AudioSource.start(consumer:)`): one wake-up per period (the default).
        case source
    }

    /// Where the audio comes from.
    public let source: any AudioSource
    /// Which thread sends.
    public let sendThread: SendThread
    private let stage: SendStage<Audience>
    private let lifecycle: StageLifecycle

    /// Assembles the chain from `source` to the network (not started yet). Throws when the source's format cannot be
    /// packetized. `tap`, when given, sees every captured chunk (after the mute) on the capture thread, before it is
    /// packetized — the clip recorder's pre-roll; it must not block. `encoding` is how the samples travel, and
    /// `opusBitrate` the bitrate of `.opus`. `send` sends a packet to the audience and returns how many of its
    /// listeners it reached (those that left since the snapshot are skipped).
    public init(source: any AudioSource, encoding: SampleEncoding = .float32,
                opusBitrate: Int = Packetizer.defaultOpusBitrate, sendThread: SendThread = .source,
                withAudience: @escaping @Sendable (_ use: (Audience) -> Void) -> Void,
                send: @escaping @Sendable (UnsafeRawBufferPointer, Audience) -> Int,
                tap: (@Sendable (UnsafeBufferPointer<Float>) -> Void)? = nil) throws {
        self.source = source
        self.sendThread = sendThread
        lifecycle = StageLifecycle(stage: "CapturePipeline", threadName: "pm-send", scheduling: .normal)
        let packetizer = try Packetizer(format: source.format, encoding: encoding, opusBitrate: opusBitrate)
        stage = SendStage(packetizer: packetizer, withAudience: withAudience, send: send, tap: tap)
    }


    deinit {
        stop()
    }

    /// Starts the source, and the send thread unless the source's thread sends.
    public func start() throws {
        switch sendThread {
        case .source:
            try source.start(consumer: stage)
        case .own:
            let source = self.source, stage = self.stage, lifecycle = self.lifecycle
            try lifecycle.start(prepare: { try source.start() }, body: { stage.run(reading: source, while: lifecycle) })
        }
    }

    /// Stops the send thread and the source (a blocked read returns at once; every thread has ended when this
    /// returns). Safe to call more than once.
    public func stop() {
        let source = self.source
        lifecycle.stop(wake: { source.stop() })  // `wake` runs whether or not the send thread ever started
    }

    /// A snapshot of the counters and levels.
    public var statistics: Statistics { stage.statistics }

    /// Whether the microphone is muted: while it is, packets carry silence (listeners see no loss and no gap),
    /// and the levels still show what the source captures. Any thread.
    public var isMuted: Bool {
        get { stage.muted.load(ordering: .relaxed) }
        set { stage.muted.store(newValue, ordering: .relaxed) }
    }
}

/// Mute → tap → packetize → send for one chunk, on whichever thread sends (`SendThread`), which holds it.
final class SendStage<Audience>: CaptureConsumer, @unchecked Sendable {  // The packetizer and scratch: the sending thread's only.
    private var packetizer: Packetizer
    private let withAudience: @Sendable (_ use: (Audience) -> Void) -> Void
    private let send: @Sendable (UnsafeRawBufferPointer, Audience) -> Int
    private let tap: (@Sendable (UnsafeBufferPointer<Float>) -> Void)?
    private let scratch: UnsafeMutableRawBufferPointer
    private let packetsSent = Atomic<UInt64>(0)
    private let framesCaptured = Atomic<UInt64>(0)
    private let peakLevel = Atomic<UInt32>(0)
    private let rmsLevel = Atomic<UInt32>(0)
    /// Set by the operator (`CapturePipeline.isMuted`); read once per chunk.
    let muted = Atomic<Bool>(false)

    init(packetizer: Packetizer, withAudience: @escaping @Sendable (_ use: (Audience) -> Void) -> Void,
         send: @escaping @Sendable (UnsafeRawBufferPointer, Audience) -> Int,
         tap: (@Sendable (UnsafeBufferPointer<Float>) -> Void)?) {
        self.tap = tap
        self.packetizer = packetizer
        self.withAudience = withAudience
        self.send = send
        scratch = .allocate(byteCount: AudioPacket.maximumSize, alignment: 8)
    }

    deinit {
        scratch.deallocate()
    }

    var statistics: CapturePipeline<Audience>.Statistics {
        var s = CapturePipeline<Audience>.Statistics()
        s.packetsSent = packetsSent.load(ordering: .relaxed)
        s.framesCaptured = framesCaptured.load(ordering: .relaxed)
        s.peakLevel = Float(bitPattern: peakLevel.load(ordering: .relaxed))
        s.rmsLevel = Float(bitPattern: rmsLevel.load(ordering: .relaxed))
        return s
    }

    /// The `pm-send` thread (`SendThread.own`): reads the source's ring, one chunk at a time, into a buffer of its own.
    func run(reading source: any AudioSource, while lifecycle: StageLifecycle) {
        let samples = UnsafeMutableBufferPointer<Float>.allocate(capacity: source.periodFrames * source.format.channels)
        samples.initialize(repeating: 0)
        defer { samples.deallocate() }
        let channels = source.format.channels
        while lifecycle.isRunning {
            guard let chunk = source.read(into: samples, timeoutNanos: 100_000_000) else { continue }
            consume(UnsafeMutableBufferPointer(rebasing: samples[0..<(chunk.frames * channels)]), info: chunk,
                    deviceDelayFrames: source.stats.delayFrames)
        }
    }

    /// One chunk: levels, mute, tap, then packetize → send to whoever listens now.
    func consume(_ samples: UnsafeMutableBufferPointer<Float>, info chunk: ChunkInfo, deviceDelayFrames: Int) {
        var peak: Float = 0, sum: Float = 0
        for v in samples {
            let a = abs(v)
            peak = max(peak, a)
            sum += a * a
        }
        if muted.load(ordering: .relaxed) {
            samples.update(repeating: 0)
        }
        let chunkSamples = UnsafeBufferPointer(samples)
        tap?(chunkSamples)
        packetizer.hostLatencyFrames = UInt32(clamping: max(0, deviceDelayFrames))
        var sent: UInt64 = 0
        withAudience { listeners in
            packetizer.packetize(chunkSamples, chunk: chunk, scratch: scratch) {
                // A listener may leave between the snapshot and the send; the next chunk skips it.
                sent &+= UInt64(max(0, send($0, listeners)))
            }
        }
        let n = samples.count
        packetsSent.wrappingAdd(sent, ordering: .relaxed)
        framesCaptured.wrappingAdd(UInt64(chunk.frames), ordering: .relaxed)
        peakLevel.store(peak.bitPattern, ordering: .relaxed)
        rmsLevel.store((n > 0 ? (sum / Float(n)).squareRoot() : 0).bitPattern, ordering: .relaxed)
    }
}
