import MeshAudio
import Synchronization

/// The send direction of the relay, assembled in one place. Read it top to bottom:
///
///     source ─▶ (mute) ─▶ tap ─▶ Packetizer ─▶ send
///     its own    the pm-send thread: one read, one packetize, one send per packet; the tap (clips' pre-roll)
///     thread     takes a copy without waiting
///
/// The source (a `Recorder`, a `ToneSource`, a `WAVFileSource`) and the network are inputs: once per captured chunk
/// `audience` says who listens now (nil: nobody — the chunk is then not packetized, so sequence numbers count the
/// packets that went out), and `send` sends one packet to them. `RelayHost` passes a PeerMesh session's, so this
/// module does not depend on PeerMesh.
public final class CapturePipeline<Audience>: Sendable {
    /// Counters and levels, readable from any thread.
    public struct Statistics: Sendable, Equatable {
        /// Packets that went out.
        public var packetsSent: UInt64 = 0
        /// Frames read from the source.
        public var framesCaptured: UInt64 = 0
        /// Peak |sample| of the latest chunk.
        public var peakLevel: Float = 0
        /// RMS of the latest chunk.
        public var rmsLevel: Float = 0
        public init() {}
    }

    /// Where the audio comes from.
    public let source: any AudioSource
    private let loop: SendLoop<Audience>
    private let lifecycle: StageLifecycle

    /// Assembles the chain from `source` to the network (not started yet). Throws when the source's format cannot be
    /// packetized. `tap`, when given, sees every captured chunk (after the mute) on the send thread, before it is
    /// packetized — the clip recorder's pre-roll; it must not block. `encoding` is how the samples travel.
    public init(source: any AudioSource, encoding: SampleEncoding = .float32, audience: @escaping @Sendable () -> Audience?,
                send: @escaping @Sendable (UnsafeRawBufferPointer, Audience) -> Bool,
                tap: (@Sendable (UnsafeBufferPointer<Float>) -> Void)? = nil) throws {
        self.source = source
        let lifecycle = StageLifecycle(stage: "CapturePipeline", threadName: "pm-send", scheduling: .normal)
        self.lifecycle = lifecycle
        loop = SendLoop(source: source, packetizer: try Packetizer(format: source.format, encoding: encoding), audience: audience,
                        send: send, tap: tap, lifecycle: lifecycle)
    }

    deinit {
        stop()
    }

    /// Starts the source, then the send thread.
    public func start() throws {
        let loop = self.loop, source = self.source
        try lifecycle.start(prepare: { try source.start() }, body: { loop.run() })
    }

    /// Stops the send thread and the source (a blocked read returns at once). Safe to call more than once.
    public func stop() {
        let source = self.source
        lifecycle.stop(wake: { source.stop() })
    }

    /// A snapshot of the counters and levels.
    public var statistics: Statistics { loop.statistics }

    /// Whether the microphone is muted: while it is, packets carry silence (listeners see no loss and no gap),
    /// and the levels still show what the source captures. Any thread.
    public var isMuted: Bool {
        get { loop.muted.load(ordering: .relaxed) }
        set { loop.muted.store(newValue, ordering: .relaxed) }
    }
}

/// Everything the send thread touches, so the thread does not keep the pipeline alive.
final class SendLoop<Audience>: @unchecked Sendable {  // The packetizer and buffers: the send thread's only.
    private let source: any AudioSource
    private var packetizer: Packetizer
    private let audience: @Sendable () -> Audience?
    private let send: @Sendable (UnsafeRawBufferPointer, Audience) -> Bool
    private let tap: (@Sendable (UnsafeBufferPointer<Float>) -> Void)?
    private let lifecycle: StageLifecycle
    private let samples: UnsafeMutableBufferPointer<Float>
    private let scratch: UnsafeMutableRawBufferPointer
    private let packetsSent = Atomic<UInt64>(0)
    private let framesCaptured = Atomic<UInt64>(0)
    private let peakLevel = Atomic<UInt32>(0)
    private let rmsLevel = Atomic<UInt32>(0)
    /// Set by the operator (`CapturePipeline.isMuted`); read once per chunk.
    let muted = Atomic<Bool>(false)

    init(source: any AudioSource, packetizer: Packetizer, audience: @escaping @Sendable () -> Audience?,
         send: @escaping @Sendable (UnsafeRawBufferPointer, Audience) -> Bool,
         tap: (@Sendable (UnsafeBufferPointer<Float>) -> Void)?, lifecycle: StageLifecycle) {
        self.source = source
        self.tap = tap
        self.packetizer = packetizer
        self.audience = audience
        self.send = send
        self.lifecycle = lifecycle
        samples = .allocate(capacity: source.periodFrames * source.format.channels)
        samples.initialize(repeating: 0)
        scratch = .allocate(byteCount: AudioPacket.maximumSize, alignment: 8)
    }

    deinit {
        samples.deallocate()
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

    /// The send thread: source → packetizer → send, one chunk at a time.
    func run() {
        let channels = source.format.channels
        while lifecycle.isRunning {
            guard let chunk = source.read(into: samples, timeoutNanos: 100_000_000) else { continue }
            let n = chunk.frames * channels
            var peak: Float = 0, sum: Float = 0
            for i in 0..<n {
                let v = abs(samples[i])
                peak = max(peak, v)
                sum += v * v
            }
            if muted.load(ordering: .relaxed) {
                for i in 0..<n { samples[i] = 0 }
            }
            tap?(UnsafeBufferPointer(rebasing: samples[0..<n]))
            packetizer.hostLatencyFrames = UInt32(clamping: max(0, source.stats.delayFrames))
            var sent: UInt64 = 0
            if let listeners = audience() {
                packetizer.packetize(UnsafeBufferPointer(rebasing: samples[0..<n]), chunk: chunk, scratch: scratch) {
                    // A listener may leave between the snapshot and the send; the next chunk skips it.
                    if send($0, listeners) { sent += 1 }
                }
            }
            packetsSent.wrappingAdd(sent, ordering: .relaxed)
            framesCaptured.wrappingAdd(UInt64(chunk.frames), ordering: .relaxed)
            peakLevel.store(peak.bitPattern, ordering: .relaxed)
            rmsLevel.store((n > 0 ? (sum / Float(n)).squareRoot() : 0).bitPattern, ordering: .relaxed)
        }
    }
}
