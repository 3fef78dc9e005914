import MeshAudio

/// What the Opus decoder does with each arriving packet, from its sequence number alone: a pure state machine.
///
/// Opus decodes a stream in order, each packet continuing the state the previous one left. So a packet that arrives
/// after a newer one was decoded is too late for the decoder (dropped and counted, as a late packet would be); a
/// short gap is filled first by the decoder's own concealment, one frame per missing packet, so that the next packet
/// continues from there; and a jump too large to conceal is a new stream (the host restarted): the decoder starts
/// over.
public struct OpusSequence: Sendable, Equatable {
    /// Most missing packets the decoder conceals in one gap (20 ms of 2.5 ms frames); a longer gap restarts it.
    public static let maximumConcealedPackets = 8
    /// How far behind the newest decoded packet an arrival still counts as a stale copy rather than a restart:
    /// 160 ms of 2.5 ms frames, beyond any reordering the jitter buffer would wait for; further back is a host that
    /// started over.
    public static let staleWindow: Int64 = 64

    /// What to do with one arriving packet.
    public enum Action: Sendable, Equatable {
        /// Decode it, after concealing `concealFirst` missing packets (0 when it is the next one).
        case decode(concealFirst: Int)
        /// Start the decoder afresh, then decode it (the first packet, or a new stream).
        case restart
        /// Drop it: the decoder is already past it (a reordered or duplicated packet).
        case stale
    }

    private enum State: Sendable, Equatable {
        case idle
        /// The newest packet decoded.
        case decoding(newest: UInt32)
    }

    private var state: State = .idle

    public init() {}

    /// One packet arrived with `sequence` (serial-number arithmetic: the sequence wraps).
    public mutating func arrived(_ sequence: UInt32) -> Action {
        guard case .decoding(let newest) = state else {
            state = .decoding(newest: sequence)
            return .restart
        }
        let distance = Int64(Int32(bitPattern: sequence &- newest))
        if distance <= 0 && distance > -Self.staleWindow { return .stale }
        state = .decoding(newest: sequence)
        if distance <= 0 || distance > Int64(Self.maximumConcealedPackets) + 1 { return .restart }
        return .decode(concealFirst: Int(distance - 1))
    }

    /// Forget the stream.
    public mutating func reset() { state = .idle }
}

/// The player side of `--codec opus`, inside `PacketIngress` on the network thread: decodes each Opus packet,
/// resamples it from 48 kHz to the pipeline's rate (libspeexdsp; none for a 48 kHz pipeline) and stores it in a
/// `PacketRing` slot. Short gaps are filled first with the decoder's concealment (`OpusSequence`), marked `concealed`
/// so the jitter buffer still counts those packets as lost.
///
/// The packets that reach the ring are in the pipeline's format: the resampler runs continuously across packets (and
/// concealed frames), so their frame indices are a count of output frames, started from the first packet's index
/// scaled to the pipeline's rate; each packet carries the frames its input produced (110 or 111 at 44.1 kHz), and the
/// capture time of its first one. Allocation-free after `init`; used by the ingress's one producer thread only.
final class OpusIngress: @unchecked Sendable {  // The decoder, resampler and tracker: the producer thread's only.
    private let decoder: OpusStreamDecoder
    private let resampler: SpeexResampler?
    private var sequence = OpusSequence()
    private let channels: Int
    /// The pipeline's rate, which packets leave at.
    let outputRate: Int
    /// Decoded 48 kHz frames (the largest Opus frame), and the same resampled.
    private let decoded: UnsafeMutableBufferPointer<Float>
    private let staged: UnsafeMutableBufferPointer<Float>
    /// Index, at `outputRate`, of the next frame the resampler produces.
    private var nextOutputFrame: UInt64 = 0

    /// Throws `OpusError` or `SpeexResamplerError` when libopus or libspeexdsp refuses the arguments.
    init(channels: Int, outputRate: Int) throws {
        decoder = try OpusStreamDecoder(channels: channels)
        self.channels = channels
        self.outputRate = outputRate
        resampler = outputRate == Opus.sampleRate ? nil
            : try SpeexResampler(channels: channels, inputRate: Opus.sampleRate, outputRate: outputRate, quality: 5,
                                 maximumCorrectionPPM: 0)
        decoded = .allocate(capacity: 2_880 * channels)
        decoded.initialize(repeating: 0)
        staged = .allocate(capacity: (2_880 * outputRate / Opus.sampleRate + 8) * channels)
        staged.initialize(repeating: 0)
    }

    deinit {
        decoded.deallocate()
        staged.deallocate()
    }

    /// What one Opus packet became.
    struct Result {
        /// The packet's own outcome: pushed (with the samples clamped), full, malformed; nil when it was stale.
        var push: PacketRing.PushResult?
        /// Frames (at the output rate) the packet became (0 while the resampler fills at the stream's start).
        var frames = 0
        /// Frames the decoder synthesized for missing packets (at the output rate), pushed ahead of it.
        var concealedFrames = 0
        /// Concealed packets that did not fit the ring.
        var concealedOverflows = 0
    }

    /// Decodes `datagram` (whose header is `header`, already checked) into `ring`, concealing first what the
    /// sequence number says is missing.
    func receive(_ datagram: UnsafeRawBufferPointer, header: AudioPacketHeader, arrivalNanos: UInt64,
                 ring: PacketRing) -> Result {
        var result = Result()
        // A packet whose frames would not fit one slot once resampled is refused before anything is decoded.
        let most = header.frameCount * outputRate / Opus.sampleRate + 2
        guard most * channels <= ring.samplesPerSlot else {
            result.push = .malformed(.tooLarge(header.frameCount))
            return result
        }
        switch sequence.arrived(header.sequence) {
        case .stale:
            return result
        case .restart:
            restart(at: header)
        case .decode(let missing):
            let n = header.frameCount
            concealing: for k in stride(from: missing, to: 0, by: -1) {
                var h = header
                h.sequence = header.sequence &- UInt32(k)
                h.firstFrameIndex = header.firstFrameIndex &- UInt64(k * n)
                let back = UInt64(Double(k * n) * 1e9 / Double(Opus.sampleRate))
                h.captureTimeNanos = header.captureTimeNanos > back ? header.captureTimeNanos - back : 0
                let frames: Int
                do { frames = try decoder.conceal(into: decoded, frames: n) } catch {
                    // libopus would not conceal: start afresh at this packet, at its own index (the jitter buffer
                    // sees the gap, and counts the missing packets lost).
                    restart(at: header)
                    break concealing
                }
                switch store(frames: frames, of: h, concealed: true, arrivalNanos: arrivalNanos, ring: ring) {
                case .pushed: result.concealedFrames += lastStored
                case .full, .malformed: result.concealedOverflows += 1
                case nil: break
                }
            }
        }
        let payload = UnsafeRawBufferPointer(rebasing: datagram[AudioPacket.headerSize...])
        let frames: Int
        // A packet that does not decode, or not to the frames its header claims (a lying header), is malformed, and
        // the decoder's state is no longer the stream's: the next packet starts it afresh at its own index, so the
        // bad packet's frames are a gap the jitter buffer conceals, not a splice that moves every later packet early.
        do {
            frames = try decoder.decode(payload, into: decoded, maximumFrames: 2_880)
        } catch {
            sequence.reset()
            result.push = .malformed(.unsupportedFormat)
            return result
        }
        guard frames == header.frameCount else {
            sequence.reset()
            result.push = .malformed(.badFrameCount(frames))
            return result
        }
        // Nothing to store yet (the resampler's first input fills its filter): the packet was taken all the same.
        result.push = store(frames: frames, of: header, concealed: false, arrivalNanos: arrivalNanos, ring: ring) ?? .pushed(sanitized: 0)
        result.frames = lastStored
        return result
    }

    /// Frames the latest `store` put in the ring.
    private var lastStored = 0

    /// A new stream: the decoder and resampler start afresh, and output indices from the packet's, scaled.
    private func restart(at header: AudioPacketHeader) {
        decoder.reset()
        if let resampler {
            try? resampler.reset()
            try? resampler.skipZeros()
        }
        // Scaled without overflow whatever index a peer sends (only the top of the range wraps).
        let first = header.firstFrameIndex, rate = UInt64(outputRate), wire = UInt64(Opus.sampleRate)
        nextOutputFrame = (first / wire) &* rate &+ (first % wire) * rate / wire
    }

    /// Resamples `frames` decoded frames of the packet `header` and stores them in the next ring slot as one packet
    /// at the output rate. The resampler runs even when the ring is full, so the stream's indices stay true (the
    /// frames dropped are a gap the jitter buffer sees). Returns nil when it produced nothing (nothing is stored).
    private func store(frames: Int, of header: AudioPacketHeader, concealed: Bool, arrivalNanos: UInt64,
                       ring: PacketRing) -> PacketRing.PushResult? {
        lastStored = 0
        var out = UnsafeBufferPointer(rebasing: decoded[0..<(frames * channels)])
        var produced = frames
        if let resampler {
            produced = 0
            var consumed = 0
            while consumed < frames {
                let from = UnsafeBufferPointer(rebasing: out[(consumed * channels)...])
                let to = UnsafeMutableBufferPointer(rebasing: staged[(produced * channels)...])
                guard let step = try? resampler.process(input: from, output: to), step.consumed + step.produced > 0 else { break }
                consumed += step.consumed
                produced += step.produced
            }
            out = UnsafeBufferPointer(rebasing: staged[0..<(produced * channels)])
        }
        guard produced > 0 else { return nil }
        var h = header
        h.format = AudioFormat(sampleRate: outputRate, channels: channels)
        h.firstFrameIndex = nextOutputFrame
        h.frameCount = produced
        // Output frame j is input frame j·48000/rate (the resampler skipped its leading zeros): the first one's
        // capture time follows from the packet's.
        let inputFrame = Double(nextOutputFrame) * Double(Opus.sampleRate) / Double(outputRate)
        let time = Double(header.captureTimeNanos) + (inputFrame - Double(header.firstFrameIndex)) * 1e9 / Double(Opus.sampleRate)
        h.captureTimeNanos = Opus.nanos(time)
        // The host reports its capture delay in 48 kHz frames; the pipeline reads it at its own rate.
        // Clamped: scaled up to a pipeline above 48 kHz, a peer's largest value is past the field's range.
        h.hostLatencyFrames = UInt32(clamping: UInt64(header.hostLatencyFrames) * UInt64(outputRate) / UInt64(Opus.sampleRate))
        nextOutputFrame &+= UInt64(produced)
        let samples = out
        let r = ring.push(ReceivedPacket(header: h, arrivalNanos: arrivalNanos, concealed: concealed)) { slot throws(AudioPacketError) in
            _ = slot.update(fromContentsOf: samples)
            // Opus may overshoot full scale a little; a hostile stream may do more.
            return AudioPacket.sanitize(UnsafeMutableBufferPointer(rebasing: slot[0..<samples.count]))
        }
        if case .pushed = r { lastStored = produced }
        return r
    }
}
