import MeshAudio
import Synchronization

/// The send direction of the relay, assembled in one place. Read it top to bottom:
///
///     source ─▶ (mute) ─▶ tap ─▶ Packetizer ─▶ send
///     all on the source's own thread (`pm-capture` for a device): one wake-up per period — the device's — carries
///     a chunk from capture to the network; the tap (clips' pre-roll) takes a copy without waiting
///
/// The source (a `Recorder`, a `ToneSource`, a `WAVFileSource`) and the network are inputs: once per captured chunk
/// `audience` says who listens now (nil: nobody — the chunk is then not packetized, so sequence numbers count the
/// packets that went out), and `send` sends one packet to them. `RelayHost` passes a PeerMesh session's, so this
/// module does not depend on PeerMesh. Both run on the capture thread: they must not allocate or wait (a snapshot
/// under a short lock and a non-blocking `sendto` are what they do).
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
    private let stage: SendStage<Audience>

    /// Assembles the chain from `source` to the network (not started yet). Throws when the source's format cannot be
    /// packetized. `tap`, when given, sees every captured chunk (after the mute) on the capture thread, before it is
    /// packetized — the clip recorder's pre-roll; it must not block. `encoding` is how the samples travel, and
    /// `opusBitrate` the bitrate of `.opus`.
    public init(source: any AudioSource, encoding: SampleEncoding = .float32,
                opusBitrate: Int = Packetizer.defaultOpusBitrate, audience: @escaping @Sendable () -> Audience?,
                send: @escaping @Sendable (UnsafeRawBufferPointer, Audience) -> Bool,
                tap: (@Sendable (UnsafeBufferPointer<Float>) -> Void)? = nil) throws {
        self.source = source
        let packetizer = try Packetizer(format: source.format, encoding: encoding, opusBitrate: opusBitrate)
        wireFormat = packetizer.wireFormat
        codecDelayFrames = packetizer.codecDelayFrames
        stage = SendStage(packetizer: packetizer, audience: audience, send: send, tap: tap)
    }

    /// The format of the packets (48 kHz for Opus, else the source's).
    public let wireFormat: AudioFormat
    /// The codec's own delay in `wireFormat` frames, besides the packet's length (Opus: resampler + look-ahead).
    public let codecDelayFrames: Int

    deinit {
        stop()
    }

    /// Starts the source, with the rest of the chain on its thread.
    public func start() throws {
        try source.start(consumer: stage)
    }

    /// Stops the source (its thread has ended when this returns). Safe to call more than once.
    public func stop() {
        source.stop()
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

/// Mute → tap → packetize → send for one chunk, on the source's thread; the source holds it, not the pipeline.
final class SendStage<Audience>: CaptureConsumer, @unchecked Sendable {  // The packetizer and scratch: the source thread's only.
    private var packetizer: Packetizer
    private let audience: @Sendable () -> Audience?
    private let send: @Sendable (UnsafeRawBufferPointer, Audience) -> Bool
    private let tap: (@Sendable (UnsafeBufferPointer<Float>) -> Void)?
    private let scratch: UnsafeMutableRawBufferPointer
    private let packetsSent = Atomic<UInt64>(0)
    private let framesCaptured = Atomic<UInt64>(0)
    private let peakLevel = Atomic<UInt32>(0)
    private let rmsLevel = Atomic<UInt32>(0)
    /// Set by the operator (`CapturePipeline.isMuted`); read once per chunk.
    let muted = Atomic<Bool>(false)

    init(packetizer: Packetizer, audience: @escaping @Sendable () -> Audience?,
         send: @escaping @Sendable (UnsafeRawBufferPointer, Audience) -> Bool,
         tap: (@Sendable (UnsafeBufferPointer<Float>) -> Void)?) {
        self.tap = tap
        self.packetizer = packetizer
        self.audience = audience
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
        if let listeners = audience() {
            packetizer.packetize(chunkSamples, chunk: chunk, scratch: scratch) {
                // A listener may leave between the snapshot and the send; the next chunk skips it.
                if send($0, listeners) { sent += 1 }
            }
        }
        let n = samples.count
        packetsSent.wrappingAdd(sent, ordering: .relaxed)
        framesCaptured.wrappingAdd(UInt64(chunk.frames), ordering: .relaxed)
        peakLevel.store(peak.bitPattern, ordering: .relaxed)
        rmsLevel.store((n > 0 ? (sum / Float(n)).squareRoot() : 0).bitPattern, ordering: .relaxed)
    }
}
