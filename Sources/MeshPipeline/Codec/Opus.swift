import COpus

/// An error reported by libopus, with its `opus_strerror` text.
public struct OpusError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The libopus `OPUS_*` error code (negative).
    public var code: Int32
    /// What libopus says about it. Computed when read, so raising the error on a real-time or network thread
    /// allocates nothing.
    public var message: String { opus_strerror(code).map { String(cString: $0) } ?? "unknown error" }
    public var description: String { "opus: \(message) (code \(code))" }
}

/// The one file that talks to COpus (libopus): an owned encoder and decoder for interleaved Float32 at 48 kHz, and
/// the packet inspection the wire decoder needs. Every call returns libopus's code through one funnel (`check`).
enum Opus {
    /// The sample rate the relay runs Opus at (libopus has no 44.1 kHz; the host resamples).
    static let sampleRate = 48_000

    /// Frame sizes libopus accepts at 48 kHz: 2.5, 5, 10, 20, 40 and 60 ms.
    static let frameSizes: Set<Int> = [120, 240, 480, 960, 1920, 2880]

    /// The one error funnel: a negative return becomes a typed error carrying the code.
    @inline(__always)
    static func check(_ rc: Int32) throws(OpusError) -> Int {
        if rc < 0 { throw OpusError(code: rc) }
        return Int(rc)
    }

    /// A time computed in Double as UInt64 nanoseconds, clamped to the type's range (a peer's capture time can be
    /// anything; so can the arithmetic on it).
    static func nanos(_ time: Double) -> UInt64 {
        guard time.isFinite, time > 0 else { return 0 }
        return time >= 18_446_744_073_709_549_568 ? UInt64.max : UInt64(time)
    }
}

/// An owned libopus encoder (`OpusEncoder`) in restricted low-delay mode (CELT only: 2.5–20 ms frames, 2.5 ms of
/// look-ahead); `deinit` destroys it. Allocation-free after `init`.
final class OpusStreamEncoder {
    /// Channels per frame.
    let channels: Int
    /// The target bitrate, bits per second.
    let bitrate: Int
    /// Samples per channel the encoder delays its output by (`OPUS_GET_LOOKAHEAD`: 120 at 48 kHz, 2.5 ms).
    let lookahead: Int
    private let state: OpaquePointer

    /// Creates an encoder at 48 kHz; throws when libopus refuses the arguments.
    init(channels: Int, bitrate: Int) throws(OpusError) {
        var err: Int32 = 0
        guard let st = opus_encoder_create(Int32(Opus.sampleRate), Int32(channels), OPUS_APPLICATION_RESTRICTED_LOWDELAY, &err),
              err == OPUS_OK
        else { throw OpusError(code: err == OPUS_OK ? OPUS_INTERNAL_ERROR : err) }
        state = st
        self.channels = channels
        self.bitrate = bitrate
        var ahead: Int32 = 0
        do {
            _ = try Opus.check(pm_opus_set_bitrate(st, Int32(bitrate)))
            _ = try Opus.check(pm_opus_set_complexity(st, 5))
            // In-band FEC is a SILK feature and low-delay mode is CELT only, so libopus carries none at these frame
            // sizes; it is asked for anyway, so that a longer frame size would get it. Loss is covered by the
            // decoder's own concealment (`OpusStreamDecoder.conceal`).
            _ = try Opus.check(pm_opus_set_inband_fec(st, 1))
            _ = try Opus.check(pm_opus_set_packet_loss_perc(st, 5))
            _ = try Opus.check(pm_opus_get_lookahead(st, &ahead))
        } catch {
            opus_encoder_destroy(st)
            throw error
        }
        lookahead = Int(ahead)
    }

    deinit { opus_encoder_destroy(state) }

    /// Encodes one frame (`frames` per channel, one of `Opus.frameSizes`; `pcm` holds `frames × channels`
    /// interleaved samples) into `output`; returns the packet's length.
    func encode(_ pcm: UnsafeBufferPointer<Float>, frames: Int, into output: UnsafeMutableRawBufferPointer) throws(OpusError) -> Int {
        precondition(pcm.count >= frames * channels, "OpusStreamEncoder.encode: short frame")
        guard let input = pcm.baseAddress, let out = output.baseAddress else { throw OpusError(code: OPUS_BUFFER_TOO_SMALL) }
        return try Opus.check(opus_encode_float(state, input, Int32(frames), out.assumingMemoryBound(to: UInt8.self),
                                                Int32(min(output.count, Int(Int32.max)))))
    }
}

/// An owned libopus decoder (`OpusDecoder`) at 48 kHz; `deinit` destroys it. Allocation-free after `init`.
final class OpusStreamDecoder {
    /// Channels per frame.
    let channels: Int
    private let state: OpaquePointer

    /// Creates a decoder at 48 kHz; throws when libopus refuses the arguments.
    init(channels: Int) throws(OpusError) {
        var err: Int32 = 0
        guard let st = opus_decoder_create(Int32(Opus.sampleRate), Int32(channels), &err), err == OPUS_OK
        else { throw OpusError(code: err == OPUS_OK ? OPUS_INTERNAL_ERROR : err) }
        state = st
        self.channels = channels
    }

    deinit { opus_decoder_destroy(state) }

    /// Decodes `packet` into `output` (room for at least `maximumFrames × channels` samples); returns the frames
    /// decoded per channel. Throws for a corrupted packet (nothing is written that counts).
    func decode(_ packet: UnsafeRawBufferPointer, into output: UnsafeMutableBufferPointer<Float>, maximumFrames: Int) throws(OpusError) -> Int {
        guard let base = packet.baseAddress, !packet.isEmpty, packet.count <= Int(Int32.max) else {
            throw OpusError(code: OPUS_INVALID_PACKET)
        }
        precondition(output.count >= maximumFrames * channels && maximumFrames > 0, "OpusStreamDecoder.decode: output too small")
        return try Opus.check(opus_decode_float(state, base.assumingMemoryBound(to: UInt8.self), Int32(packet.count),
                                                output.baseAddress!, Int32(maximumFrames), 0))
    }

    /// The decoder's packet-loss concealment: synthesizes `frames` frames (one of `Opus.frameSizes`) that continue
    /// the signal where the last decoded packet ended, and keeps the decoder's state in step for the next packet.
    func conceal(into output: UnsafeMutableBufferPointer<Float>, frames: Int) throws(OpusError) -> Int {
        precondition(output.count >= frames * channels && frames > 0, "OpusStreamDecoder.conceal: output too small")
        return try Opus.check(opus_decode_float(state, nil, 0, output.baseAddress!, Int32(frames), 0))
    }

    /// Forgets the stream (`OPUS_RESET_STATE`), for a host that restarted.
    func reset() {
        // OPUS_RESET_STATE cannot fail on a valid decoder.
        _ = pm_opus_decoder_reset(state)
    }
}
