import MeshAudio

/// The host side of `--codec opus`, inside `Packetizer`: captured chunks at the source's rate → 48 kHz (libspeexdsp,
/// skipped for a 48 kHz source) → frames of `Packetizer.opusFrameSize` → one Opus packet each.
///
/// The wire stream is 48 kHz: a packet's `firstFrameIndex` counts 48 kHz frames from 0, and its capture time is the
/// host time at which the first sample it decodes to was captured: the decoder's output runs the encoder's
/// look-ahead behind its input, so that is taken off, and the resampler's hold-back makes the packet leave later.
/// Every latency the player measures from capture times therefore includes the codec's (`delayFrames`). The host
/// report carries the capture device's delay in 48 kHz frames. Allocation-free after `init`; one thread at a time.
final class OpusFramer: @unchecked Sendable {  // Owned by one Packetizer, which its one capture thread drives.
    /// The captured frames' format, and the wire format (48 kHz, the same channels).
    let inputFormat: AudioFormat, wireFormat: AudioFormat
    /// Frames (at 48 kHz) per Opus packet.
    let frameSize: Int
    /// The codec's delay at 48 kHz, besides the frame itself: the resampler's hold-back (converted) plus the
    /// encoder's look-ahead.
    let delayFrames: Int
    private let encoder: OpusStreamEncoder
    private let resampler: SpeexResampler?
    /// 48 kHz frames waiting for a whole Opus frame, and the resampler's output block.
    private let pending: UnsafeMutableBufferPointer<Float>
    private let resampled: UnsafeMutableBufferPointer<Float>
    private var pendingFrames = 0
    /// 48 kHz frames produced so far (the wire index of the next one), the frames a capture gap skipped included.
    private var producedFrames: UInt64 = 0
    /// The source frame the next chunk should start at (nil before the first): a chunk that starts later follows a
    /// gap (a capture overrun).
    private var nextInputIndex: UInt64?
    private static let blockFrames = 256

    init(inputFormat: AudioFormat, frameSize: Int, bitrate: Int) throws(AudioPacketError) {
        guard Opus.isFrameSize(frameSize), inputFormat.channels <= 2 else { throw .unsupportedFormat }
        self.inputFormat = inputFormat
        self.wireFormat = AudioFormat(sampleRate: Opus.sampleRate, channels: inputFormat.channels)
        self.frameSize = frameSize
        do {
            encoder = try OpusStreamEncoder(channels: inputFormat.channels, bitrate: bitrate)
            resampler = inputFormat.sampleRate == Opus.sampleRate ? nil
                : try SpeexResampler(channels: inputFormat.channels, inputRate: inputFormat.sampleRate,
                                     outputRate: Opus.sampleRate, quality: 5, maximumCorrectionPPM: 0)
        } catch let error as OpusError where error.loadFailure != nil {
            throw .codecUnavailable(error.description)
        } catch {
            throw .unsupportedFormat
        }
        try? resampler?.skipZeros()
        let resamplerDelay = resampler.map { ($0.inputLatency * Opus.sampleRate + inputFormat.sampleRate - 1) / inputFormat.sampleRate } ?? 0
        delayFrames = encoder.lookahead + resamplerDelay
        pending = .allocate(capacity: frameSize * inputFormat.channels)
        pending.initialize(repeating: 0)
        resampled = .allocate(capacity: Self.blockFrames * inputFormat.channels)
        resampled.initialize(repeating: 0)
    }

    deinit {
        pending.deallocate()
        resampled.deallocate()
    }

    /// Takes one captured chunk and hands each Opus packet it completes to `emit`, numbered from `sequence` on
    /// (which ends as the next packet's number). Returns how many packets it emitted.
    func frame(_ samples: UnsafeBufferPointer<Float>, chunk: ChunkInfo, sequence: inout UInt32, hostLatencyFrames: UInt32,
               scratch: UnsafeMutableRawBufferPointer, emit: (UnsafeRawBufferPointer) throws -> Void) rethrows -> Int {
        let channels = inputFormat.channels
        let frames = min(chunk.frames, samples.count / channels)
        // Where 48 kHz frame j sits on the host's clock: it is input frame j·in/48000 (below), and the chunk tells
        // the time of its own first input frame.
        let inRate = Double(inputFormat.sampleRate)
        let anchorIndex = Double(chunk.firstFrameIndex), anchorTime = Double(chunk.timestampNanos)
        var consumed = 0, emitted = 0
        if let expected = nextInputIndex, chunk.firstFrameIndex > expected {
            // The source lost frames (a capture overrun), or nobody listened for a while (unheard chunks are not
            // framed): the wire skips them too, so that the player conceals a gap there, as it does for PCM, and what
            // follows keeps its place on the host's clock. A gap shorter than the rest of the frame begun is silence
            // in that frame; a longer one drops the frame begun (it is part of what the player conceals: after an
            // unheard while, its audio would be stale).
            let lost = Int((Double(chunk.firstFrameIndex - expected) * Double(Opus.sampleRate) / inRate).rounded())
            if lost < frameSize - pendingFrames {
                UnsafeMutableBufferPointer(rebasing: pending[(pendingFrames * channels)..<((pendingFrames + lost) * channels)])
                    .update(repeating: 0)
                pendingFrames += lost
            } else {
                pendingFrames = 0
            }
            producedFrames &+= UInt64(lost)
        }
        nextInputIndex = chunk.firstFrameIndex &+ UInt64(frames)
        while consumed < frames {
            let input = UnsafeBufferPointer(rebasing: samples[(consumed * channels)..<(frames * channels)])
            let got: Int
            if let resampler {
                guard let r = try? resampler.process(input: input, output: resampled), r.consumed + r.produced > 0 else { break }
                consumed += r.consumed
                got = r.produced
            } else {
                got = min(input.count / channels, Self.blockFrames)
                _ = resampled.update(fromContentsOf: input.prefix(got * channels))
                consumed += got
            }
            var taken = 0
            while taken < got {
                let n = min(frameSize - pendingFrames, got - taken)
                let from = UnsafeBufferPointer(rebasing: resampled[(taken * channels)..<((taken + n) * channels)])
                _ = UnsafeMutableBufferPointer(rebasing: pending[(pendingFrames * channels)...]).update(fromContentsOf: from)
                pendingFrames += n
                taken += n
                producedFrames &+= UInt64(n)
                guard pendingFrames == frameSize else { continue }
                pendingFrames = 0
                let first = producedFrames &- UInt64(frameSize)
                // Wire frame j is source frame j·in/48000 (the resampler skipped its leading zeros, and a gap skipped
                // as many of each); the first sample this packet decodes to entered the encoder `lookahead` frames
                // earlier.
                let sourceFrame = (Double(first) - Double(encoder.lookahead)) * inRate / Double(Opus.sampleRate)
                let time = anchorTime + (sourceFrame - anchorIndex) * 1e9 / inRate
                let h = AudioPacketHeader(sequence: sequence, firstFrameIndex: first, frameCount: frameSize, format: wireFormat,
                                          captureTimeNanos: Opus.nanos(time),
                                          hostLatencyFrames: hostLatencyFrames, encoding: .opus)
                let body = UnsafeMutableRawBufferPointer(rebasing: scratch[AudioPacket.headerSize...])
                // Our own invariants (a valid encoder, a whole frame, room for the largest packet) make this
                // infallible; a failure would be a bug of ours, not of a peer.
                let size = try! encoder.encode(UnsafeBufferPointer(pending), frames: frameSize, into: body)
                AudioPacket.writeHeader(h, into: scratch)
                sequence &+= 1
                emitted += 1
                try emit(UnsafeRawBufferPointer(rebasing: scratch[0..<(AudioPacket.headerSize + size)]))
            }
        }
        return emitted
    }

    /// The host report in 48 kHz frames: the capture device's delay (given in source frames).
    func hostReport(captureDelayFrames: UInt32) -> UInt32 {
        UInt32(clamping: (Int(captureDelayFrames) * Opus.sampleRate) / inputFormat.sampleRate)
    }
}
