import MeshAudio

/// The relay's audio datagram: one run of consecutive captured frames, self-describing, at most
/// `AudioPacket.maximumSize` (1184) bytes so that it fits one PeerMesh unreliable datagram payload
/// (`maximumAudioPayload`).
///
/// Wire layout, version 1. Header integers are big-endian (network order); samples are IEEE-754 Float32
/// little-endian, interleaved by channel. The header is 36 bytes:
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
/// |     19 |    1 | sample type, UInt8, `1` = Float32 little-endian                                |
/// |     20 |    4 | sample rate, UInt32, 8000–192000 Hz                                            |
/// |     24 |    8 | capture time, UInt64: host `CLOCK_MONOTONIC` ns of the first frame (host clock)|
/// |     32 |    4 | host report: host capture-device delay in frames at capture (0 = unknown)      |
/// |     36 |  4·F·C | samples, Float32 LE, frame-major interleaved (F frames × C channels)        |
///
/// The total length must be exactly `36 + 4 × frameCount × channels` and at most 1184 bytes, so one packet
/// carries at most 287 samples (287 mono frames, 143 stereo frames). The host report rides in every packet
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
    /// Most samples (frames × channels) one packet can carry.
    public static let maximumSamples = (maximumSize - headerSize) / 4

    /// Most frames of `format` that fit one packet of at most `maximumSize` bytes.
    public static func maximumFrames(for format: AudioFormat, maximumSize: Int = AudioPacket.maximumSize) -> Int {
        max(0, min(Int(UInt16.max), (maximumSize - headerSize) / format.bytesPerFrame))
    }

    /// Encoded length of a packet with `frames` frames of `format`.
    public static func encodedSize(frames: Int, format: AudioFormat) -> Int {
        headerSize + frames * format.bytesPerFrame
    }

    /// Encodes `header` and `samples` (exactly `header.frameCount × channels` interleaved samples) into `buffer`
    /// and returns the number of bytes written. Allocation-free.
    public static func encode(
        _ header: AudioPacketHeader, samples: UnsafeBufferPointer<Float>, into buffer: UnsafeMutableRawBufferPointer
    ) throws(AudioPacketError) -> Int {
        do { try header.format.validate() } catch { throw .unsupportedFormat }
        guard header.frameCount >= 1, header.frameCount <= Int(UInt16.max) else { throw .badFrameCount(header.frameCount) }
        let sampleCount = header.frameCount * header.format.channels
        guard samples.count == sampleCount else { throw .lengthMismatch(expected: sampleCount, actual: samples.count) }
        let size = headerSize + 4 * sampleCount
        guard size <= maximumSize else { throw .tooLarge(size) }
        guard buffer.count >= size else { throw .truncated(size) }
        buffer[0] = magic.0
        buffer[1] = magic.1
        buffer[2] = version
        buffer[3] = kindAudio
        buffer.storeBytes(of: header.sequence.bigEndian, toByteOffset: 4, as: UInt32.self)
        buffer.storeBytes(of: header.firstFrameIndex.bigEndian, toByteOffset: 8, as: UInt64.self)
        buffer.storeBytes(of: UInt16(header.frameCount).bigEndian, toByteOffset: 16, as: UInt16.self)
        buffer[18] = UInt8(header.format.channels)
        buffer[19] = header.format.sampleType.rawValue
        buffer.storeBytes(of: UInt32(header.format.sampleRate).bigEndian, toByteOffset: 20, as: UInt32.self)
        buffer.storeBytes(of: header.captureTimeNanos.bigEndian, toByteOffset: 24, as: UInt64.self)
        buffer.storeBytes(of: header.hostLatencyFrames.bigEndian, toByteOffset: 32, as: UInt32.self)
        var offset = headerSize
        for s in samples {
            buffer.storeBytes(of: s.bitPattern.littleEndian, toByteOffset: offset, as: UInt32.self)
            offset += 4
        }
        return size
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
        guard let type = AudioFormat.SampleType(rawValue: bytes[19]) else { throw .unsupportedFormat }
        let rate = Int(UInt32(bigEndian: bytes.loadUnaligned(fromByteOffset: 20, as: UInt32.self)))
        let format = AudioFormat(sampleRate: rate, channels: channels, sampleType: type)
        do { try format.validate() } catch { throw .unsupportedFormat }
        guard frames >= 1 else { throw .badFrameCount(frames) }
        let expected = headerSize + frames * format.bytesPerFrame
        guard bytes.count == expected else { throw .lengthMismatch(expected: expected, actual: bytes.count) }
        let capture = UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: 24, as: UInt64.self))
        let hostLatency = UInt32(bigEndian: bytes.loadUnaligned(fromByteOffset: 32, as: UInt32.self))
        return AudioPacketHeader(
            sequence: sequence, firstFrameIndex: first, frameCount: frames, format: format,
            captureTimeNanos: capture, hostLatencyFrames: hostLatency)
    }

    /// Copies the samples of a packet whose header `decodeHeader` returned into `destination` (which holds at
    /// least `frameCount × channels` samples). Samples from the network are not trusted: each is clamped to [−1, 1],
    /// and NaN or ±∞ becomes 0 (a hostile or broken host cannot make anything downstream trap or blow up). Returns
    /// how many samples had to be changed.
    @discardableResult
    public static func decodeSamples(
        _ bytes: UnsafeRawBufferPointer, header: AudioPacketHeader, into destination: UnsafeMutableBufferPointer<Float>
    ) throws(AudioPacketError) -> Int {
        let count = header.frameCount * header.format.channels
        guard destination.count >= count, bytes.count >= headerSize + 4 * count else {
            throw .lengthMismatch(expected: count, actual: destination.count)
        }
        var offset = headerSize
        var sanitized = 0
        for i in 0..<count {
            var v = Float(bitPattern: UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: UInt32.self)))
            if !v.isFinite {
                v = 0
                sanitized += 1
            } else if v > 1 || v < -1 {
                v = v > 1 ? 1 : -1
                sanitized += 1
            }
            destination[i] = v
            offset += 4
        }
        return sanitized
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

    public init(
        sequence: UInt32, firstFrameIndex: UInt64, frameCount: Int, format: AudioFormat,
        captureTimeNanos: UInt64 = 0, hostLatencyFrames: UInt32 = 0
    ) {
        self.sequence = sequence
        self.firstFrameIndex = firstFrameIndex
        self.frameCount = frameCount
        self.format = format
        self.captureTimeNanos = captureTimeNanos
        self.hostLatencyFrames = hostLatencyFrames
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

    public var description: String {
        switch self {
        case .truncated(let n): "audio packet truncated (\(n) bytes)"
        case .badMagic: "not an audio packet (bad magic)"
        case .unsupportedVersion(let v): "audio packet version \(v) is not supported (expected 1)"
        case .unknownKind(let k): "unknown audio packet kind \(k)"
        case .unsupportedFormat: "audio packet format is outside 8–192 kHz, 1–8 channels, Float32LE"
        case .badFrameCount(let n): "audio packet frame count \(n) is invalid"
        case .lengthMismatch(let e, let a): "audio packet length \(a) does not match the expected \(e)"
        case .tooLarge(let n): "audio packet of \(n) bytes exceeds \(AudioPacket.maximumSize)"
        }
    }
}
