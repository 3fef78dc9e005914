import MeshAudio

/// Turns each captured period into audio packets immediately (no batching).
///
/// A period that does not fit one packet (`AudioPacket.maximumSize`) (48 kHz stereo, 256 frames, for instance) is split into
/// the fewest packets that fit, of near-equal size (the first ones one frame longer when it does not divide),
/// with consecutive sequence numbers and frame indices. Encoding goes into a caller-provided buffer: no
/// allocation per packet.
///
/// With `.opus` the packets are Opus's instead (`OpusFramer`): the chunks are resampled to 48 kHz and cut into
/// frames of `opusFrameSize` (2.5 ms), each one packet of about `opusBitrate / 8 / 400` bytes; a chunk completes
/// zero, one or more of them.
public struct Packetizer: Sendable {
    /// Frames per Opus packet at 48 kHz: 2.5 ms, the shortest frame Opus has.
    public static let opusFrameSize = 120
    /// The Opus bitrate, bits per second, unless told otherwise (2.5 ms CELT frames need more than long ones: a
    /// 440 Hz tone comes out about 34 dB above the coding noise at 96 kbit/s, 27 dB at 64).
    public static let defaultOpusBitrate = 96_000

    /// The format of the captured frames.
    public let format: AudioFormat
    /// The format of the packets: `format`, or 48 kHz with the same channels for Opus.
    public let wireFormat: AudioFormat
    /// How the samples travel.
    public let encoding: SampleEncoding
    /// Most frames per packet (in `wireFormat`).
    public let maximumFramesPerPacket: Int
    /// The codec's delay in wire frames besides packetization: the resampler's and Opus's look-ahead (0 for PCM).
    public var codecDelayFrames: Int { opus?.delayFrames ?? 0 }
    private let opus: OpusFramer?
    /// Sequence number of the next packet.
    public private(set) var nextSequence: UInt32
    /// Host report carried in every packet: the capture device's delay in frames (update it from the source's
    /// `stats.delayFrames`).
    public var hostLatencyFrames: UInt32 = 0
    /// The Int16 encoding's dither, carried across packets.
    private var dither = TPDFDither()

    /// Throws when `format` is unsupported (Opus takes one or two channels) or when not even one frame fits
    /// `maximumPacketSize`. `opusBitrate` applies to `.opus` only.
    public init(format: AudioFormat, encoding: SampleEncoding = .float32, firstSequence: UInt32 = 0,
                maximumPacketSize: Int = AudioPacket.maximumSize,
                opusBitrate: Int = Packetizer.defaultOpusBitrate) throws(AudioPacketError)
    {
        do { try format.validate() } catch { throw .unsupportedFormat }
        self.format = format
        self.encoding = encoding
        self.nextSequence = firstSequence
        if encoding == .opus {
            let framer = try OpusFramer(inputFormat: format, frameSize: Self.opusFrameSize, bitrate: opusBitrate)
            opus = framer
            wireFormat = framer.wireFormat
            maximumFramesPerPacket = framer.frameSize
            return
        }
        let maxFrames = AudioPacket.maximumFrames(for: format, encoding: encoding,
                                                  maximumSize: min(maximumPacketSize, AudioPacket.maximumSize))
        guard maxFrames >= 1 else { throw .tooLarge(AudioPacket.encodedSize(frames: 1, format: format, encoding: encoding) ?? 0) }
        opus = nil
        wireFormat = format
        self.maximumFramesPerPacket = maxFrames
    }

    /// Number of PCM packets a chunk of `frames` frames becomes (Opus: see the type's doc).
    public func packetCount(frames: Int) -> Int {
        frames <= 0 ? 0 : (frames + maximumFramesPerPacket - 1) / maximumFramesPerPacket
    }

    /// Encodes the chunk `samples` (`chunk.frames × channels` interleaved samples) into `scratch` (at least
    /// `AudioPacket.maximumSize` bytes) one packet at a time and hands each encoded packet to `emit`, in order.
    /// Returns the number of packets emitted.
    @discardableResult
    public mutating func packetize(
        _ samples: UnsafeBufferPointer<Float>, chunk: ChunkInfo, scratch: UnsafeMutableRawBufferPointer,
        emit: (UnsafeRawBufferPointer) throws -> Void
    ) rethrows -> Int {
        let channels = format.channels
        let frames = min(chunk.frames, samples.count / channels)
        if let opus {
            precondition(scratch.count >= AudioPacket.maximumSize, "Packetizer scratch buffer too small")
            return try opus.frame(samples, chunk: chunk, sequence: &nextSequence,
                                  hostLatencyFrames: opus.hostReport(captureDelayFrames: hostLatencyFrames),
                                  scratch: scratch, emit: emit)
        }
        let count = packetCount(frames: frames)
        guard count > 0 else { return 0 }
        precondition(scratch.count >= AudioPacket.encodedSize(frames: maximumFramesPerPacket, format: format, encoding: encoding)!,
                     "Packetizer scratch buffer too small")
        let base = frames / count, extra = frames % count
        var offset = 0
        for i in 0..<count {
            let n = base + (i < extra ? 1 : 0)
            let time = chunk.timestampNanos &+ UInt64(Double(offset) * 1e9 / Double(format.sampleRate))
            let header = AudioPacketHeader(
                sequence: nextSequence, firstFrameIndex: chunk.firstFrameIndex &+ UInt64(offset), frameCount: n,
                format: format, captureTimeNanos: time, hostLatencyFrames: hostLatencyFrames, encoding: encoding)
            let slice = UnsafeBufferPointer(rebasing: samples[(offset * channels)..<((offset + n) * channels)])
            // Our own invariants (validated format, size within bounds) make encoding infallible here.
            let size = try! AudioPacket.encode(header, samples: slice, into: scratch, dither: &dither)
            nextSequence &+= 1
            offset += n
            try emit(UnsafeRawBufferPointer(rebasing: scratch[0..<size]))
        }
        return count
    }

    /// Convenience (allocating) form for tests and tools: the encoded packets of one chunk.
    public mutating func packets(_ samples: [Float], chunk: ChunkInfo) -> [[UInt8]] {
        var out: [[UInt8]] = []
        var scratch = [UInt8](repeating: 0, count: AudioPacket.maximumSize)
        _ = samples.withUnsafeBufferPointer { s in
            scratch.withUnsafeMutableBytes { b in
                packetize(s, chunk: chunk, scratch: b) { out.append(Array($0)) }
            }
        }
        return out
    }
}
