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

/// The player side of `--codec opus`, inside `PacketIngress` on the network thread: decodes each Opus packet into a
/// `PacketRing` slot, and fills short gaps with the decoder's concealment first (`OpusSequence`), marking those
/// frames `concealed` so the jitter buffer still counts the packets as lost. Allocation-free after `init`; used by
/// the ingress's one producer thread only.
final class OpusIngress: @unchecked Sendable {  // The decoder and tracker: the ingress's producer thread's only.
    private let decoder: OpusStreamDecoder
    private var sequence = OpusSequence()
    private let channels: Int

    init(channels: Int) throws(OpusError) {
        decoder = try OpusStreamDecoder(channels: channels)
        self.channels = channels
    }

    /// What one Opus packet became.
    struct Result {
        /// The packet's own outcome: pushed (with the samples clamped), full, malformed; nil when it was stale.
        var push: PacketRing.PushResult?
        /// Frames the decoder synthesized for missing packets, and pushed ahead of it.
        var concealedFrames = 0
        /// Concealed packets that did not fit the ring.
        var concealedOverflows = 0
    }

    /// Decodes `datagram` (whose header is `header`, already checked) into `ring`, concealing first what the
    /// sequence number says is missing.
    func receive(_ datagram: UnsafeRawBufferPointer, header: AudioPacketHeader, arrivalNanos: UInt64,
                 ring: PacketRing) -> Result {
        var result = Result()
        switch sequence.arrived(header.sequence) {
        case .stale:
            return result
        case .restart:
            decoder.reset()
        case .decode(let missing):
            let n = header.frameCount
            let frameNanos = Double(n) * 1e9 / Double(header.format.sampleRate)
            for k in stride(from: missing, to: 0, by: -1) {
                var h = header
                h.sequence = header.sequence &- UInt32(k)
                h.firstFrameIndex = header.firstFrameIndex &- UInt64(k * n)
                let back = UInt64(Double(k) * frameNanos)
                h.captureTimeNanos = header.captureTimeNanos > back ? header.captureTimeNanos - back : 0
                let pushed = ring.push(ReceivedPacket(header: h, arrivalNanos: arrivalNanos, concealed: true)) { slot throws(AudioPacketError) in
                    do { _ = try decoder.conceal(into: slot, frames: n) } catch { throw .unsupportedFormat }
                    return Self.clamp(slot, count: n * channels)
                }
                switch pushed {
                case .pushed: result.concealedFrames += n
                case .full, .malformed: result.concealedOverflows += 1
                }
            }
        }
        let payload = UnsafeRawBufferPointer(rebasing: datagram[AudioPacket.headerSize...])
        let expected = header.frameCount
        result.push = ring.push(ReceivedPacket(header: header, arrivalNanos: arrivalNanos)) { slot throws(AudioPacketError) in
            let frames: Int
            do {
                // The packet must decode to exactly the frames its header claims (a lying header is malformed).
                guard try Opus.frames(in: payload) == expected else { throw AudioPacketError.badFrameCount(expected) }
                frames = try decoder.decode(payload, into: slot, maximumFrames: slot.count / channels)
            } catch let error as AudioPacketError {
                throw error
            } catch {
                throw .unsupportedFormat
            }
            guard frames == expected else { throw .badFrameCount(frames) }
            return Self.clamp(slot, count: frames * channels)
        }
        return result
    }

    /// Clamps decoded samples to [−1, 1] (Opus may overshoot a little; a hostile stream may do more). Returns how
    /// many were changed.
    @inline(__always)
    private static func clamp(_ slot: UnsafeMutableBufferPointer<Float>, count: Int) -> Int {
        var changed = 0
        for i in 0..<count {
            let v = slot[i]
            if !v.isFinite {
                slot[i] = 0
                changed += 1
            } else if v > 1 || v < -1 {
                slot[i] = v > 1 ? 1 : -1
                changed += 1
            }
        }
        return changed
    }
}
