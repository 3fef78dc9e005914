/// The shape of a PCM stream: sample rate, interleaved channel count and sample type.
///
/// The relay's native format is 44.1 kHz mono Float32 little-endian (`.default`). Other rates and channel
/// counts (48 kHz stereo, for instance) flow through the same code: nothing in MeshAudio assumes mono.
public struct AudioFormat: Hashable, Sendable, CustomStringConvertible {
    /// The encoding of one sample. Only Float32 little-endian travels through the pipeline; devices that
    /// cannot do it natively are opened through ALSA's `plug` conversion.
    public enum SampleType: UInt8, Hashable, Sendable {
        case float32LE = 1
    }

    /// Frames per second.
    public var sampleRate: Int
    /// Interleaved channels per frame.
    public var channels: Int
    /// Encoding of each sample.
    public var sampleType: SampleType

    /// 44.1 kHz, one channel, Float32 little-endian.
    public static let `default` = AudioFormat(sampleRate: 44_100, channels: 1, sampleType: .float32LE)

    public init(sampleRate: Int = 44_100, channels: Int = 1, sampleType: SampleType = .float32LE) {
        self.sampleRate = sampleRate
        self.channels = channels
        self.sampleType = sampleType
    }

    /// Bytes in one frame (one sample for each channel).
    public var bytesPerFrame: Int { channels * 4 }

    /// Throws `AudioFormatError` when the rate or channel count is outside what the pipeline supports
    /// (8 kHz–192 kHz, 1–8 channels).
    public func validate() throws(AudioFormatError) {
        guard (8_000...192_000).contains(sampleRate) else { throw .unsupportedRate(sampleRate) }
        guard (1...8).contains(channels) else { throw .unsupportedChannels(channels) }
    }

    /// Converts a frame count to milliseconds at this rate.
    public func milliseconds(frames: Int) -> Double { Double(frames) * 1000 / Double(sampleRate) }

    public var description: String { "\(sampleRate) Hz, \(channels) ch, Float32LE" }
}

/// A format the pipeline cannot carry.
public enum AudioFormatError: Error, Equatable, CustomStringConvertible {
    case unsupportedRate(Int)
    case unsupportedChannels(Int)

    public var description: String {
        switch self {
        case .unsupportedRate(let r): "sample rate \(r) Hz is outside 8000–192000 Hz"
        case .unsupportedChannels(let c): "channel count \(c) is outside 1–8"
        }
    }
}
