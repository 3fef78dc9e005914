#if canImport(Glibc)
import Glibc
#endif

/// A tone specification that cannot be played.
public enum ToneError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The text is not `tone:<Hz>`, or `<Hz>` is not a number.
    case invalidSpec(String)
    /// The frequency is not above 0 and below half the sample rate (or is not finite).
    case invalidFrequency(Double, sampleRate: Int)
    /// The amplitude is not within 0…1.
    case invalidAmplitude(Float)

    public var description: String {
        switch self {
        case .invalidSpec(let spec):
            "'\(spec)' is not a tone: write tone:<frequency in Hz>, for example tone:440"
        case .invalidFrequency(let hz, let rate):
            "tone frequency \(hz) Hz is invalid: it must be above 0 and below \(rate / 2) Hz (half the \(rate) Hz sample rate)"
        case .invalidAmplitude(let amplitude):
            "tone amplitude \(amplitude) is outside 0…1"
        }
    }
}

/// A sine-wave source, the synthetic sibling of `Recorder`: the same sample on every channel, delivered in
/// chunks of `periodFrames` through the same ring hand-over, paced in real time unless `realtime` is false.
///
/// Sample *n* is `amplitude × sin(2π × frequency × n / sampleRate)`. It never finishes on its own.
public final class ToneSource: PacedSourceBacked {
    /// The tone's frequency, Hz.
    public let frequency: Double
    /// Its peak amplitude, 0–1 of full scale.
    public let amplitude: Float
    let source: PacedSource

    /// Creates a tone source. Throws `ToneError` for a frequency outside (0, sampleRate/2) or an amplitude outside
    /// 0…1, and `AudioFormatError` for an unsupported format.
    public init(frequency: Double, amplitude: Float = 0.5, format: AudioFormat = .default, periodFrames: Int = 128,
                realtime: Bool = true, ringChunks: Int = 64) throws {
        try format.validate()
        try Self.validate(frequency: frequency, sampleRate: format.sampleRate)
        guard amplitude.isFinite, (0...1).contains(amplitude) else { throw ToneError.invalidAmplitude(amplitude) }
        self.frequency = frequency
        self.amplitude = amplitude
        let generator = SineGenerator(frequency: frequency, amplitude: amplitude, format: format)
        self.source = PacedSource(name: "ToneSource(\(frequency) Hz)", format: format, periodFrames: periodFrames,
                                  realtime: realtime, ringChunks: ringChunks, producer: generator)
    }

    /// Parses `tone:<Hz>` (e.g. `tone:440`, `tone:997.5`) into a source. Throws `ToneError` for anything else.
    public static func parse(_ spec: String, format: AudioFormat = .default, periodFrames: Int = 128,
                             realtime: Bool = true) throws -> ToneSource {
        try ToneSource(frequency: frequency(inSpec: spec, sampleRate: format.sampleRate), format: format,
                       periodFrames: periodFrames, realtime: realtime)
    }

    /// The frequency in a `tone:<Hz>` spec, validated against `sampleRate`.
    public static func frequency(inSpec spec: String, sampleRate: Int) throws(ToneError) -> Double {
        guard spec.hasPrefix("tone:"), let hz = Double(spec.dropFirst(5)) else { throw .invalidSpec(spec) }
        try validate(frequency: hz, sampleRate: sampleRate)
        return hz
    }

    /// Throws unless `0 < frequency < sampleRate / 2`.
    public static func validate(frequency: Double, sampleRate: Int) throws(ToneError) {
        guard frequency.isFinite, frequency > 0, frequency < Double(sampleRate) / 2 else {
            throw .invalidFrequency(frequency, sampleRate: sampleRate)
        }
    }

    deinit {
        source.stop()
    }

}

/// Phase-accumulating sine generator (phase kept in [0, 1) so precision does not decay over time).
final class SineGenerator: ChunkProducer, @unchecked Sendable {  // Mutable phase is touched only by the source thread.
    private let increment: Double
    private let amplitude: Double
    private let channels: Int
    private var phase: Double = 0

    init(frequency: Double, amplitude: Float, format: AudioFormat) {
        self.increment = frequency / Double(format.sampleRate)
        self.amplitude = Double(amplitude)
        self.channels = format.channels
    }

    func produce(into buffer: UnsafeMutablePointer<Float>, frames: Int) -> Int {
        var sampleIndex = 0
        for _ in 0..<frames {
            let value = Float(amplitude * sin(2 * Double.pi * phase))
            for _ in 0..<channels {
                buffer[sampleIndex] = value
                sampleIndex += 1
            }
            phase += increment
            if phase >= 1 { phase -= 1 }
        }
        return frames
    }
}
