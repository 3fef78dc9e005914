import MeshAudio
import MeshPOSIX

/// The relay's audio datagram: one run of consecutive captured frames, self-describing, at most
/// `AudioPacket.maximumSize` (1184) bytes so that it fits one PeerMesh unreliable datagram payload
/// (`maximumAudioPayload`).
///
/// Wire layout, version 1. Header integers are big-endian (network order); samples are interleaved by channel, in
/// the packet's `SampleEncoding` (IEEE-754 Float32 little-endian, signed 16-bit little-endian, or one Opus packet).
/// The header is 36 bytes:
///
/// | offset | size | field                                                                          |
/// |-------:|-----:|--------------------------------------------------------------------------------|
/// |      0 |    2 | magic `0x4D 0x41` (ASCII "MA")                                                 |
/// |      2 |    1 | version, `1`                                                                   |
/// |      3 |    1 | kind, `1` = audio frames (other values are rejected as `.unknownKind`)        |
/// |      4 |    4 | sequence number, UInt32, +1 per packet, wraps 0xFFFFFFFF → 0                   |
/// |      8 |    8 | first frame index, UInt64: index in the capture stream of the first frame     |
/// |     16 |    2 | frame count, UInt16, ≥ 1                                                       |
/// |     18 |    1 | channels, UInt8, 1–8                                                           |
/// |     19 |    1 | sample encoding, UInt8: `1` = Float32 LE, `2` = Int16 LE, `3` = Opus           |
/// |     20 |    4 | sample rate, UInt32, 8000–192000 Hz                                            |
/// |     24 |    8 | capture time, UInt64: host `CLOCK_MONOTONIC` ns of the first frame (host clock)|
/// |     32 |    4 | host report: host capture-device delay in frames at capture (0 = unknown)      |
/// |     36 |  B·F·C | samples, frame-major interleaved (F frames × C channels, B bytes each)     |
///
/// The total length must be exactly `36 + B × frameCount × channels` (B = 4 for Float32, 2 for Int16) and at most
/// 1184 bytes, so one packet carries at most 287 Float32 samples (287 mono frames, 143 stereo frames) or 574 Int16
/// samples. An Opus packet (encoding 3) carries one Opus packet (RFC 6716) of any length from 1 byte up to the limit
/// instead; its rate must be 48 kHz and its frame count one of Opus's frame sizes (120, 240, 480, 960, 1920 or 2880),
/// the number of frames the Opus packet decodes to — which the player checks when it decodes it. The encoding is per packet: the player decodes whatever arrives, into the same Float32 pipeline. The host report rides in every packet
/// (4 bytes) instead of a separate message, so the player always knows the host's share of the latency.
/// Decoding never traps: anything malformed, truncated or foreign yields an `AudioPacketError`; samples are clamped.
public enum AudioPacket {
    /// Largest datagram the relay sends (PeerMesh `maximumAudioPayload`).
    /// PeerMesh's `Session.maximumDatagramSize` (an encrypted datagram's payload; checked by a test).
    public static let maximumSize = 1184
    /// Bytes before the first sample.
    public static let headerSize = 36
    /// The magic bytes "MA".
    public static let magic: (UInt8, UInt8) = (0x4D, 0x41)
    /// Current wire version.
    public static let version: UInt8 = 1
    /// Kind byte of an audio packet.
    public static let kindAudio: UInt8 = 1
    /// Most samples (frames × channels) one packet can carry, in the most compact encoding.
    public static let maximumSamples = (maximumSize - headerSize) / 2

    /// Most frames of `format` that fit one packet of at most `maximumSize` bytes in a PCM `encoding` (for Opus,
    /// the frame size is the codec's: `Packetizer.opusFrameSize`).
    public static func maximumFrames(for format: AudioFormat, encoding: SampleEncoding = .float32,
                                     maximumSize: Int = AudioPacket.maximumSize) -> Int {
        guard let bytes = encoding.bytesPerSample else { return Packetizer.opusFrameSize }
        return max(0, min(Int(UInt16.max), (maximumSize - headerSize) / (format.channels * bytes)))
    }

    /// Encoded length of a PCM packet with `frames` frames of `format` (nil for Opus: it depends on the signal).
    public static func encodedSize(frames: Int, format: AudioFormat, encoding: SampleEncoding = .float32) -> Int? {
        encoding.bytesPerSample.map { headerSize + frames * format.channels * $0 }
    }

    /// Encodes `header` and `samples` (exactly `header.frameCount × channels` interleaved samples) into `buffer`
    /// and returns the number of bytes written. Allocation-free. An Int16 packet takes its dither from a fixed seed;
    /// a stream of packets should carry one `TPDFDither` across them (`encode(_:samples:into:dither:)`).
    public static func encode(
        _ header: AudioPacketHeader, samples: UnsafeBufferPointer<Float>, into buffer: UnsafeMutableRawBufferPointer
    ) throws(AudioPacketError) -> Int {
        var dither = TPDFDither()
        return try encode(header, samples: samples, into: buffer, dither: &dither)
    }

    /// Encodes as `encode(_:samples:into:)` does, drawing the Int16 encoding's dither from `dither`.
    public static func encode(
        _ header: AudioPacketHeader, samples: UnsafeBufferPointer<Float>, into buffer: UnsafeMutableRawBufferPointer,
        dither: inout TPDFDither
    ) throws(AudioPacketError) -> Int {
        do { try header.format.validate() } catch { throw .unsupportedFormat }
        guard header.frameCount >= 1, header.frameCount <= Int(UInt16.max) else { throw .badFrameCount(header.frameCount) }
        // Opus packets come from the codec (`Packetizer`), not from samples here.
        guard let bytesPerSample = header.encoding.bytesPerSample else { throw .unsupportedFormat }
        let sampleCount = header.frameCount * header.format.channels
        guard samples.count == sampleCount else { throw .lengthMismatch(expected: sampleCount, actual: samples.count) }
        let size = headerSize + bytesPerSample * sampleCount
        guard size <= maximumSize else { throw .tooLarge(size) }
        guard buffer.count >= size else { throw .truncated(size) }
        writeHeader(header, into: buffer)
        var offset = headerSize
        switch header.encoding {
        case .float32:
            for s in samples {
                buffer.storeBytes(of: s.bitPattern.littleEndian, toByteOffset: offset, as: UInt32.self)
                offset += 4
            }
        case .int16:
            for s in samples {
                buffer.storeBytes(of: dither.quantize(s).littleEndian, toByteOffset: offset, as: Int16.self)
                offset += 2
            }
        case .opus:
            preconditionFailure("unreachable: Opus has no bytes per sample")
        }
        return size
    }

    /// Writes the 36-byte header (the caller checked that `buffer` holds at least `headerSize` bytes).
    public static func writeHeader(_ header: AudioPacketHeader, into buffer: UnsafeMutableRawBufferPointer) {
        precondition(buffer.count >= headerSize, "AudioPacket.writeHeader: buffer too small")
        buffer[0] = magic.0
        buffer[1] = magic.1
        buffer[2] = version
        buffer[3] = kindAudio
        buffer.storeBytes(of: header.sequence.bigEndian, toByteOffset: 4, as: UInt32.self)
        buffer.storeBytes(of: header.firstFrameIndex.bigEndian, toByteOffset: 8, as: UInt64.self)
        buffer.storeBytes(of: UInt16(header.frameCount).bigEndian, toByteOffset: 16, as: UInt16.self)
        buffer[18] = UInt8(header.format.channels)
        buffer[19] = header.encoding.rawValue
        buffer.storeBytes(of: UInt32(header.format.sampleRate).bigEndian, toByteOffset: 20, as: UInt32.self)
        buffer.storeBytes(of: header.captureTimeNanos.bigEndian, toByteOffset: 24, as: UInt64.self)
        buffer.storeBytes(of: header.hostLatencyFrames.bigEndian, toByteOffset: 32, as: UInt32.self)
    }

    /// Parses and validates the header of `bytes` (including the exact total length). Never traps.
    public static func decodeHeader(_ bytes: UnsafeRawBufferPointer) throws(AudioPacketError) -> AudioPacketHeader {
        guard bytes.count >= 4 else { throw .truncated(bytes.count) }
        guard bytes[0] == magic.0, bytes[1] == magic.1 else { throw .badMagic }
        guard bytes[2] == version else { throw .unsupportedVersion(bytes[2]) }
        guard bytes[3] == kindAudio else { throw .unknownKind(bytes[3]) }
        guard bytes.count >= headerSize else { throw .truncated(bytes.count) }
        guard bytes.count <= maximumSize else { throw .tooLarge(bytes.count) }
        let sequence = UInt32(bigEndian: bytes.loadUnaligned(fromByteOffset: 4, as: UInt32.self))
        let first = UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: 8, as: UInt64.self))
        let frames = Int(UInt16(bigEndian: bytes.loadUnaligned(fromByteOffset: 16, as: UInt16.self)))
        let channels = Int(bytes[18])
        guard let encoding = SampleEncoding(rawValue: bytes[19]) else { throw .unsupportedFormat }
        let rate = Int(UInt32(bigEndian: bytes.loadUnaligned(fromByteOffset: 20, as: UInt32.self)))
        let format = AudioFormat(sampleRate: rate, channels: channels)
        do { try format.validate() } catch { throw .unsupportedFormat }
        guard frames >= 1 else { throw .badFrameCount(frames) }
        if let expected = encodedSize(frames: frames, format: format, encoding: encoding) {
            guard bytes.count == expected else { throw .lengthMismatch(expected: expected, actual: bytes.count) }
        } else {
            // Opus: 48 kHz, mono or stereo (what the player's decoder takes), one of its frame sizes, and at least
            // one byte (the TOC) of codec data.
            guard rate == Opus.sampleRate, channels <= 2 else { throw .unsupportedFormat }
            guard Opus.isFrameSize(frames) else { throw .badFrameCount(frames) }
            guard bytes.count > headerSize else { throw .truncated(bytes.count) }
        }
        let capture = UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: 24, as: UInt64.self))
        let hostLatency = UInt32(bigEndian: bytes.loadUnaligned(fromByteOffset: 32, as: UInt32.self))
        return AudioPacketHeader(
            sequence: sequence, firstFrameIndex: first, frameCount: frames, format: format,
            captureTimeNanos: capture, hostLatencyFrames: hostLatency, encoding: encoding)
    }

    /// Copies the samples of a packet whose header `decodeHeader` returned into `destination` (which holds at
    /// least `frameCount × channels` samples). Samples from the network are not trusted: each is clamped to [−1, 1],
    /// and NaN or ±∞ becomes 0 (a hostile or broken host cannot make anything downstream trap or blow up). Returns
    /// how many samples had to be changed (Int16 samples are always in range: −32768 decodes to −1).
    @discardableResult
    public static func decodeSamples(
        _ bytes: UnsafeRawBufferPointer, header: AudioPacketHeader, into destination: UnsafeMutableBufferPointer<Float>
    ) throws(AudioPacketError) -> Int {
        let count = header.frameCount * header.format.channels
        // Opus needs the stream's decoder (`PacketIngress`).
        guard let bytesPerSample = header.encoding.bytesPerSample else { throw .unsupportedFormat }
        guard destination.count >= count, bytes.count >= headerSize + bytesPerSample * count else {
            throw .lengthMismatch(expected: count, actual: destination.count)
        }
        var offset = headerSize
        if header.encoding == .int16 {
            for i in 0..<count {
                destination[i] = Float(Int16(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: Int16.self)))
                    * (1 / 32768)
                offset += 2
            }
            return 0
        }
        for i in 0..<count {
            destination[i] = Float(bitPattern: UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: UInt32.self)))
            offset += 4
        }
        return sanitize(UnsafeMutableBufferPointer(rebasing: destination[0..<count]))
    }

    /// Clamps `samples` to [−1, 1] and zeroes NaN and ±∞, in place; returns how many it changed. Every decoder of
    /// samples from the network (Float32 here, Opus in `PacketIngress`) ends with it.
    @inline(__always)
    static func sanitize(_ samples: UnsafeMutableBufferPointer<Float>) -> Int {
        var changed = 0
        for i in samples.indices {
            let v = samples[i]
            if !v.isFinite {
                samples[i] = 0
                changed += 1
            } else if v > 1 || v < -1 {
                samples[i] = v > 1 ? 1 : -1
                changed += 1
            }
        }
        return changed
    }

    /// Convenience (allocating) encoder for tests and tools.
    public static func encode(_ header: AudioPacketHeader, samples: [Float]) throws(AudioPacketError) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: maximumSize)
        let result: Result<Int, AudioPacketError> = samples.withUnsafeBufferPointer { s in
            out.withUnsafeMutableBytes { b in
                do throws(AudioPacketError) { return .success(try encode(header, samples: s, into: b)) } catch { return .failure(error) }
            }
        }
        let n = try result.get()
        out.removeLast(out.count - n)
        return out
    }

    /// Convenience (allocating) decoder for tests and tools.
    public static func decode(_ bytes: [UInt8]) throws(AudioPacketError) -> (header: AudioPacketHeader, samples: [Float]) {
        let result: Result<(AudioPacketHeader, [Float]), AudioPacketError> = bytes.withUnsafeBytes { raw in
            do throws(AudioPacketError) {
                let h = try decodeHeader(raw)
                var samples = [Float](repeating: 0, count: h.frameCount * h.format.channels)
                _ = try samples.withUnsafeMutableBufferPointer { d throws(AudioPacketError) in
                    try decodeSamples(raw, header: h, into: d)
                }
                return .success((h, samples))
            } catch {
                return .failure(error)
            }
        }
        return try result.get()
    }
}

/// Everything an audio packet says besides its samples.
public struct AudioPacketHeader: Sendable, Equatable {
    /// Per-packet counter (wraps).
    public var sequence: UInt32
    /// Index in the capture stream of the packet's first frame.
    public var firstFrameIndex: UInt64
    /// Frames carried (1...65535, and the packet must fit `maximumSize` bytes).
    public var frameCount: Int
    /// Format of the samples.
    public var format: AudioFormat
    /// Host `CLOCK_MONOTONIC` nanoseconds at which the first frame was captured (host clock domain).
    public var captureTimeNanos: UInt64
    /// Host report: the capture device's delay, in frames, when this packet's frames were captured.
    public var hostLatencyFrames: UInt32
    /// How the samples travel (the decoded format is always `format`, Float32).
    public var encoding: SampleEncoding

    public init(
        sequence: UInt32, firstFrameIndex: UInt64, frameCount: Int, format: AudioFormat,
        captureTimeNanos: UInt64 = 0, hostLatencyFrames: UInt32 = 0, encoding: SampleEncoding = .float32
    ) {
        self.sequence = sequence
        self.firstFrameIndex = firstFrameIndex
        self.frameCount = frameCount
        self.format = format
        self.captureTimeNanos = captureTimeNanos
        self.hostLatencyFrames = hostLatencyFrames
        self.encoding = encoding
    }
}

/// How an audio packet's samples travel: the header's sample-encoding byte. The pipeline on both sides is Float32;
/// the encoding is chosen by the host (`mesh-record --codec`) and followed, packet by packet, by every player.
public enum SampleEncoding: UInt8, Sendable, CaseIterable, CustomStringConvertible, BitwiseCopyable {
    /// IEEE-754 Float32 little-endian: lossless, 4 bytes a sample (the default).
    case float32 = 1
    /// Signed 16-bit little-endian, TPDF-dithered by the sender: half the bytes, 96 dB of range.
    case int16 = 2

    /// Opus (RFC 6716, libopus) at 48 kHz in its restricted low-delay mode, 2.5 ms frames: a compressed packet
    /// of 96 kbit/s by default (`Packetizer`), decoded by the player, whose decoder conceals what the network lost.
    case opus = 3

    /// Bytes one sample takes on the wire; nil for Opus, whose packets are compressed (variable length).
    public var bytesPerSample: Int? {
        switch self {
        case .float32: 4
        case .int16: 2
        case .opus: nil
        }
    }

    /// The name on the command line and in status output: `f32`, `s16`, `opus`.
    public var description: String {
        switch self {
        case .float32: "f32"
        case .int16: "s16"
        case .opus: "opus"
        }
    }

    /// The encoding a command-line name stands for.
    public init?(name: String) {
        guard let e = Self.allCases.first(where: { $0.description == name }) else { return nil }
        self = e
    }
}

/// Triangular-PDF dither for Float32 → Int16: the sum of two independent uniform values of ±½ LSB each is added
/// before rounding, which turns quantization error into plain white noise (no distortion that follows the signal,
/// no dead zone at low levels). Deterministic from its seed; allocation-free; one per stream.
public struct TPDFDither: Sendable {
    private var random: SplitMix64

    public init(seed: UInt64 = 0x7064_6974_6865_7231) { random = SplitMix64(seed: seed) }

    /// `sample` (clamped to [−1, 1], NaN as 0) scaled to Int16 full scale (32768), dithered and rounded.
    @inline(__always)
    public mutating func quantize(_ sample: Float) -> Int16 {
        let r = random.next()
        // Two 24-bit uniforms in [0, 1): their difference is triangular on (−1, 1) LSB.
        let u1 = Float(r >> 40) * (1 / 16_777_216), u2 = Float((r >> 16) & 0xFF_FFFF) * (1 / 16_777_216)
        let x = sample.isNaN ? 0 : min(max(sample, -1), 1)
        let v = (x * 32768 + (u1 - u2)).rounded()
        return Int16(min(max(v, -32768), 32767))
    }
}

/// Why bytes are not a valid audio packet (or cannot be encoded as one).
public enum AudioPacketError: Error, Equatable, Sendable, CustomStringConvertible {
    case truncated(Int)
    case badMagic
    case unsupportedVersion(UInt8)
    case unknownKind(UInt8)
    case unsupportedFormat
    case badFrameCount(Int)
    case lengthMismatch(expected: Int, actual: Int)
    case tooLarge(Int)
    /// Not about a packet: the codec's library could not be loaded (the loader's text), so nothing can be encoded.
    case codecUnavailable(String)

    public var description: String {
        switch self {
        case .truncated(let n): "audio packet truncated (\(n) bytes)"
        case .badMagic: "not an audio packet (bad magic)"
        case .unsupportedVersion(let v): "audio packet version \(v) is not supported (expected 1)"
        case .unknownKind(let k): "unknown audio packet kind \(k)"
        case .unsupportedFormat: "audio packet format is outside 8–192 kHz, 1–8 channels, Float32 or Int16 samples"
        case .badFrameCount(let n): "audio packet frame count \(n) is invalid"
        case .lengthMismatch(let e, let a): "audio packet length \(a) does not match the expected \(e)"
        case .tooLarge(let n): "audio packet of \(n) bytes exceeds \(AudioPacket.maximumSize)"
        case .codecUnavailable(let why): why
        }
    }
}
