/// What a command line names as audio input: an ALSA device, a test tone or a sound file.
///
/// Syntax: `tone:<Hz>` is a sine (`tone:440`); `file:<path>` or any path ending in `.wav` is a file;
/// anything else is an ALSA device name (`default`, `pm_cap`, `plug:hw:0`).
public enum InputSpec: Equatable, Sendable {
    case device(String)
    case tone(frequency: Double)
    case file(path: String)

    /// Parses `text`; a tone's frequency is validated against `sampleRate` (throws `ToneError`).
    public static func parse(_ text: String, sampleRate: Int = AudioFormat.default.sampleRate) throws -> InputSpec {
        if text.hasPrefix("tone:") {
            return .tone(frequency: try ToneSource.frequency(inSpec: text, sampleRate: sampleRate))
        }
        if text.hasPrefix("file:") { return .file(path: String(text.dropFirst(5))) }
        if text.lowercased().hasSuffix(".wav") { return .file(path: text) }
        return .device(text)
    }

    /// Opens the source this spec names. A file source takes its format from the file; the others use `format`.
    /// `realtime` applies to tones and files (devices are always real time).
    public func makeSource(format: AudioFormat = .default, periodFrames: Int = 128,
                           realtime: Bool = true) throws -> any AudioSource {
        switch self {
        case .device(let name):
            try Recorder(device: name, format: format, periodFrames: periodFrames)
        case .tone(let frequency):
            try ToneSource(frequency: frequency, format: format, periodFrames: periodFrames, realtime: realtime)
        case .file(let path):
            try WAVFileSource(path: path, periodFrames: periodFrames, realtime: realtime)
        }
    }
}
