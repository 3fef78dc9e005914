import MeshAudio

/// Turns each captured period into audio packets immediately (no batching).
///
/// A period that does not fit one packet (`AudioPacket.maximumSize`) (48 kHz stereo, 256 frames, for instance) is split into
/// the fewest packets that fit, of near-equal size (the first ones one frame longer when it does not divide),
/// with consecutive sequence numbers and frame indices. Encoding goes into a caller-provided buffer: no
/// allocation per packet.
public struct Packetizer: Sendable {
    /// The format of the captured frames.
    public let format: AudioFormat
    /// How the samples travel.
    public let encoding: SampleEncoding
    /// Most frames per packet.
    public let maximumFramesPerPacket: Int
    /// Sequence number of the next packet.
    public private(set) var nextSequence: UInt32
    /// Host report carried in every packet: the capture device's delay in frames (update it from the source's
    /// `stats.delayFrames`).
    public var hostLatencyFrames: UInt32 = 0
    /// The Int16 encoding's dither, carried across packets.
    private var dither = TPDFDither()

    /// Throws when `format` is unsupported or when not even one frame fits `maximumPacketSize`.
    public init(format: AudioFormat, encoding: SampleEncoding = .float32, firstSequence: UInt32 = 0,
                maximumPacketSize: Int = AudioPacket.maximumSize) throws(AudioPacketError)
    {
        do { try format.validate() } catch { throw .unsupportedFormat }
        let maxFrames = AudioPacket.maximumFrames(for: format, encoding: encoding,
                                                  maximumSize: min(maximumPacketSize, AudioPacket.maximumSize))
        guard maxFrames >= 1 else { throw .tooLarge(AudioPacket.encodedSize(frames: 1, format: format, encoding: encoding)) }
        self.format = format
        self.encoding = encoding
        self.maximumFramesPerPacket = maxFrames
        self.nextSequence = firstSequence
    }

    /// Number of packets a chunk of `frames` frames becomes.
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
        let count = packetCount(frames: frames)
        guard count > 0 else { return 0 }
        precondition(scratch.count >= AudioPacket.encodedSize(frames: maximumFramesPerPacket, format: format, encoding: encoding),
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
