import COpus
import MeshPOSIX

/// An error reported by libopus, with its `opus_strerror` text, or libopus that could not be loaded.
public struct OpusError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The libopus `OPUS_*` error code (negative; `OPUS_INTERNAL_ERROR` when the library could not be loaded).
    public var code: Int32
    /// Why libopus could not be loaded (the loader's text), or nil: the error is libopus's own.
    public var loadFailure: String?

    public init(code: Int32, loadFailure: String? = nil) {
        self.code = code
        self.loadFailure = loadFailure
    }

    /// What libopus says about it. Computed when read, so raising the error on a real-time or network thread
    /// allocates nothing.
    public var message: String {
        if let loadFailure { return "libopus is not available (\(loadFailure)); install libopus0" }
        return (try? LibOpus.shared.get()).flatMap { $0.strerror(code) }.map { String(cString: $0) } ?? "unknown error"
    }
    public var description: String { loadFailure == nil ? "opus: \(message) (code \(code))" : "opus: \(message)" }
}

/// libopus's entry points, resolved once, when the first encoder or decoder is made: audio that travels as PCM (the
/// default) never maps the library.
struct LibOpus: @unchecked Sendable {  // immutable entry points of a library that is never unloaded (the ctl ones untyped)
    let strerror: pm_opus_strerror_fn
    let encoderCreate: pm_opus_encoder_create_fn
    let encoderDestroy: pm_opus_encoder_destroy_fn
    /// `opus_encoder_ctl`, variadic: called through the shim's typed wrappers.
    let encoderControl: UnsafeRawPointer
    let encode: pm_opus_encode_float_fn
    let decoderCreate: pm_opus_decoder_create_fn
    let decoderDestroy: pm_opus_decoder_destroy_fn
    /// `opus_decoder_ctl`, likewise.
    let decoderControl: UnsafeRawPointer
    let decode: pm_opus_decode_float_fn

    /// Loaded on first use; a failure (the library is missing) is kept and thrown by every encoder and decoder made.
    static let shared = Result { () throws(SharedLibrary.LoadError) -> LibOpus in
        let lib = try SharedLibrary.load(["libopus.so.0"])
        return LibOpus(strerror: try lib.function("opus_strerror", as: pm_opus_strerror_fn.self),
                       encoderCreate: try lib.function("opus_encoder_create", as: pm_opus_encoder_create_fn.self),
                       encoderDestroy: try lib.function("opus_encoder_destroy", as: pm_opus_encoder_destroy_fn.self),
                       encoderControl: try lib.function("opus_encoder_ctl", as: UnsafeRawPointer.self),
                       encode: try lib.function("opus_encode_float", as: pm_opus_encode_float_fn.self),
                       decoderCreate: try lib.function("opus_decoder_create", as: pm_opus_decoder_create_fn.self),
                       decoderDestroy: try lib.function("opus_decoder_destroy", as: pm_opus_decoder_destroy_fn.self),
                       decoderControl: try lib.function("opus_decoder_ctl", as: UnsafeRawPointer.self),
                       decode: try lib.function("opus_decode_float", as: pm_opus_decode_float_fn.self))
    }.mapError { OpusError(code: OPUS_INTERNAL_ERROR, loadFailure: $0.description) }
}

/// The one file that talks to COpus (libopus, loaded when first needed: `LibOpus`): an owned encoder and decoder for
/// interleaved Float32 at 48 kHz. Every call returns libopus's code through one funnel (`check`).
enum Opus {
    /// The sample rate the relay runs Opus at (libopus has no 44.1 kHz; the host resamples).
    static let sampleRate = 48_000

    /// Whether libopus takes frames of `frames` at 48 kHz: 2.5, 5, 10, 20, 40 and 60 ms. A `switch`, not a set: the
    /// player checks every packet's header on its real-time thread, where a lazily made global would allocate.
    @inline(__always)
    static func isFrameSize(_ frames: Int) -> Bool {
        switch frames {
        case 120, 240, 480, 960, 1920, 2880: true
        default: false
        }
    }

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
    private let lib: LibOpus
    private let state: OpaquePointer

    /// Creates an encoder at 48 kHz; throws when libopus cannot be loaded or refuses the arguments.
    init(channels: Int, bitrate: Int) throws(OpusError) {
        let lib = try LibOpus.shared.get()
        var err: Int32 = 0
        guard let st = lib.encoderCreate(Int32(Opus.sampleRate), Int32(channels), OPUS_APPLICATION_RESTRICTED_LOWDELAY, &err),
              err == OPUS_OK
        else { throw OpusError(code: err == OPUS_OK ? OPUS_INTERNAL_ERROR : err) }
        self.lib = lib
        state = st
        self.channels = channels
        self.bitrate = bitrate
        var ahead: Int32 = 0
        let control = lib.encoderControl
        do {
            _ = try Opus.check(pm_opus_set_bitrate(control, st, Int32(bitrate)))
            _ = try Opus.check(pm_opus_set_complexity(control, st, 5))
            // In-band FEC is a SILK feature and low-delay mode is CELT only, so libopus carries none at these frame
            // sizes; it is asked for anyway, so that a longer frame size would get it. Loss is covered by the
            // decoder's own concealment (`OpusStreamDecoder.conceal`).
            _ = try Opus.check(pm_opus_set_inband_fec(control, st, 1))
            _ = try Opus.check(pm_opus_set_packet_loss_perc(control, st, 5))
            _ = try Opus.check(pm_opus_get_lookahead(control, st, &ahead))
        } catch {
            lib.encoderDestroy(st)
            throw error
        }
        lookahead = Int(ahead)
    }

    deinit { lib.encoderDestroy(state) }

    /// Encodes one frame (`frames` per channel, `Opus.isFrameSize`; `pcm` holds `frames × channels`
    /// interleaved samples) into `output`; returns the packet's length.
    func encode(_ pcm: UnsafeBufferPointer<Float>, frames: Int, into output: UnsafeMutableRawBufferPointer) throws(OpusError) -> Int {
        precondition(pcm.count >= frames * channels, "OpusStreamEncoder.encode: short frame")
        guard let input = pcm.baseAddress, let out = output.baseAddress else { throw OpusError(code: OPUS_BUFFER_TOO_SMALL) }
        return try Opus.check(lib.encode(state, input, Int32(frames), out.assumingMemoryBound(to: UInt8.self),
                                                Int32(min(output.count, Int(Int32.max)))))
    }
}

/// An owned libopus decoder (`OpusDecoder`) at 48 kHz; `deinit` destroys it. Allocation-free after `init`.
final class OpusStreamDecoder {
    /// Channels per frame.
    let channels: Int
    private let lib: LibOpus
    private let state: OpaquePointer

    /// Creates a decoder at 48 kHz; throws when libopus cannot be loaded or refuses the arguments.
    init(channels: Int) throws(OpusError) {
        let lib = try LibOpus.shared.get()
        var err: Int32 = 0
        guard let st = lib.decoderCreate(Int32(Opus.sampleRate), Int32(channels), &err), err == OPUS_OK
        else { throw OpusError(code: err == OPUS_OK ? OPUS_INTERNAL_ERROR : err) }
        self.lib = lib
        state = st
        self.channels = channels
    }

    deinit { lib.decoderDestroy(state) }

    /// Decodes `packet` into `output` (room for at least `maximumFrames × channels` samples); returns the frames
    /// decoded per channel. Throws for a corrupted packet (nothing is written that counts).
    func decode(_ packet: UnsafeRawBufferPointer, into output: UnsafeMutableBufferPointer<Float>, maximumFrames: Int) throws(OpusError) -> Int {
        guard let base = packet.baseAddress, !packet.isEmpty, packet.count <= Int(Int32.max) else {
            throw OpusError(code: OPUS_INVALID_PACKET)
        }
        precondition(output.count >= maximumFrames * channels && maximumFrames > 0, "OpusStreamDecoder.decode: output too small")
        return try Opus.check(lib.decode(state, base.assumingMemoryBound(to: UInt8.self), Int32(packet.count),
                                                output.baseAddress!, Int32(maximumFrames), 0))
    }

    /// The decoder's packet-loss concealment: synthesizes `frames` frames (`Opus.isFrameSize`) that continue
    /// the signal where the last decoded packet ended, and keeps the decoder's state in step for the next packet.
    func conceal(into output: UnsafeMutableBufferPointer<Float>, frames: Int) throws(OpusError) -> Int {
        precondition(output.count >= frames * channels && frames > 0, "OpusStreamDecoder.conceal: output too small")
        return try Opus.check(lib.decode(state, nil, 0, output.baseAddress!, Int32(frames), 0))
    }

    /// Forgets the stream (`OPUS_RESET_STATE`), for a host that restarted.
    func reset() {
        // OPUS_RESET_STATE cannot fail on a valid decoder.
        _ = pm_opus_decoder_reset(lib.decoderControl, state)
    }
}
