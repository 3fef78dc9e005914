// The one file in MeshAudio that talks to libsndfile (CSndfile). Everything else uses `SoundFile`.
//
// libsndfile is loaded when the first sound file is opened (`dlopen`): a CLI that only uses devices does not map it,
// nor the FLAC, Vorbis, Ogg and MP3 libraries it pulls in (0.7 MB of resident memory).
import CSndfile
import MeshPOSIX
#if canImport(Glibc)
import Glibc
#endif

/// libsndfile's entry points, resolved once, when the first file is opened.
private struct LibSndfile: Sendable {
    let open: pm_sf_open_fn
    let openDescriptor: pm_sf_open_fd_fn
    let close: pm_sf_close_fn
    let strerror: pm_sf_strerror_fn
    let error: pm_sf_error_fn
    let errorNumber: pm_sf_error_number_fn
    let formatCheck: pm_sf_format_check_fn
    let command: pm_sf_command_fn
    let readFloat: pm_sf_readf_float_fn
    let writeFloat: pm_sf_writef_float_fn
    let seek: pm_sf_seek_fn

    /// A message libsndfile returned (nil: none).
    static func text(_ message: UnsafePointer<CChar>?) -> String { message.map { String(cString: $0) } ?? "unknown error" }

    /// Loaded on first use; a failure (the library is missing) is kept and reported by every open.
    static let shared = Result { () throws(SharedLibrary.LoadError) -> LibSndfile in
        let lib = try SharedLibrary.load(["libsndfile.so.1"])
        return LibSndfile(open: try lib.function("sf_open", as: pm_sf_open_fn.self),
                          openDescriptor: try lib.function("sf_open_fd", as: pm_sf_open_fd_fn.self),
                          close: try lib.function("sf_close", as: pm_sf_close_fn.self),
                          strerror: try lib.function("sf_strerror", as: pm_sf_strerror_fn.self),
                          error: try lib.function("sf_error", as: pm_sf_error_fn.self),
                          errorNumber: try lib.function("sf_error_number", as: pm_sf_error_number_fn.self),
                          formatCheck: try lib.function("sf_format_check", as: pm_sf_format_check_fn.self),
                          command: try lib.function("sf_command", as: pm_sf_command_fn.self),
                          readFloat: try lib.function("sf_readf_float", as: pm_sf_readf_float_fn.self),
                          writeFloat: try lib.function("sf_writef_float", as: pm_sf_writef_float_fn.self),
                          seek: try lib.function("sf_seek", as: pm_sf_seek_fn.self))
    }.mapError { SndfileError(path: "libsndfile", operation: "load", message: $0.description) }
}

/// A sound file could not be opened, read, written or closed: names the file and carries libsndfile's text.
public struct SndfileError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The file's path.
    public var path: String
    /// What we were doing, e.g. "open for reading".
    public var operation: String
    /// libsndfile's explanation (`sf_strerror`), or ours when the file is readable but unusable.
    public var message: String

    public var description: String { "\(path): cannot \(operation): \(message)" }
}

/// The sample encoding of a WAV file written by `WAVFileSink`.
///
/// A WAV file's sizes are 32-bit, so it holds at most 4 GiB. A 32-bit float WAV goes on past that as RF64 (EBU Tech
/// 3306: the same chunks with 64-bit sizes, which libsndfile, ffmpeg and sox read) and stays a plain WAV below it. The
/// 16- and 24-bit WAVs stay WAVE_FORMAT_PCM, which every reader takes (libsndfile writes RF64 only as
/// WAVE_FORMAT_EXTENSIBLE, which Python's `wave` before 3.12 refuses), so they end at their limit instead: the write
/// that would pass it is short, and the file holds everything up to it.
public enum SoundFileEncoding: Sendable, Equatable, CaseIterable, CustomStringConvertible {
    /// WAV, 16-bit signed integer (clipped to [-1, 1)): what every tool reads. At most 4 GiB.
    case pcm16
    /// WAV, 24-bit signed integer. At most 4 GiB.
    case pcm24
    /// WAV, 32-bit IEEE float, as WAVE_FORMAT_EXTENSIBLE: lossless for the pipeline's samples. RF64 past 4 GiB.
    case float32
    /// FLAC, 24-bit: lossless and about half the size.
    case flac
    /// Ogg Vorbis: lossy, small.
    case oggVorbis

    /// The encoding a file name asks for: `.wav` (with `sampleFormat` s16, s24 or f32), `.flac` or `.ogg`; nil for
    /// any other extension or sample format.
    public static func forPath(_ path: String, sampleFormat: String = "s16") -> SoundFileEncoding? {
        let lower = path.lowercased()
        if lower.hasSuffix(".wav") {
            switch sampleFormat {
            case "s16": return .pcm16
            case "s24": return .pcm24
            case "f32": return .float32
            default: return nil
            }
        }
        if lower.hasSuffix(".flac") { return .flac }
        if lower.hasSuffix(".ogg") || lower.hasSuffix(".oga") { return .oggVorbis }
        return nil
    }

    public var description: String {
        switch self {
        case .pcm16: "WAV 16-bit"
        case .pcm24: "WAV 24-bit"
        case .float32: "WAV 32-bit float"
        case .flac: "FLAC 24-bit"
        case .oggVorbis: "Ogg Vorbis"
        }
    }

    fileprivate var sndfileFormat: Int32 {
        switch self {
        case .pcm16: Int32(SF_FORMAT_WAV | SF_FORMAT_PCM_16)
        case .pcm24: Int32(SF_FORMAT_WAV | SF_FORMAT_PCM_24)
        case .float32: Int32(SF_FORMAT_RF64 | SF_FORMAT_FLOAT)
        case .flac: Int32(SF_FORMAT_FLAC | SF_FORMAT_PCM_24)
        case .oggVorbis: Int32(SF_FORMAT_OGG | SF_FORMAT_VORBIS)
        }
    }

    /// Whether libsndfile can rewrite the header as it goes (WAV), so a killed process leaves a valid file.
    fileprivate var updatesHeader: Bool {
        switch self {
        case .pcm16, .pcm24, .float32: true
        case .flac, .oggVorbis: false
        }
    }

    /// Bytes per sample of a WAV that ends at its 32-bit limit; nil for the encodings that have none.
    fileprivate var limitedSampleBytes: Int? {
        switch self {
        case .pcm16: 2
        case .pcm24: 3
        case .float32, .flac, .oggVorbis: nil
        }
    }
}

/// An open libsndfile handle reading or writing interleaved Float32 frames; closed when released.
final class SoundFile: @unchecked Sendable {  // Used by one thread at a time: the opener, then the file thread.
    private let lib: LibSndfile
    private var file: OpaquePointer?
    let path: String
    /// Frames in the file when opened for reading (libsndfile's count); 0 for writing.
    let frameCount: Int
    let sampleRate: Int
    let channels: Int
    /// Frames a WAV that ends at its 32-bit limit can hold (nil: no limit), frames written, and whether a write
    /// reached the limit.
    private let limitFrames: Int?
    private var framesWritten = 0
    private var reachedLimit = false

    /// The data a 16- or 24-bit WAV holds at most: 4 GiB less room for its header (44 bytes from libsndfile), so the
    /// RIFF and data sizes never wrap.
    static let wavDataLimitBytes = Int(UInt32.max) - 4_095

    private init(lib: LibSndfile, file: OpaquePointer, path: String, info: SF_INFO, limitFrames: Int? = nil) {
        self.lib = lib
        self.file = file
        self.path = path
        self.frameCount = Int(info.frames)
        self.sampleRate = Int(info.samplerate)
        self.channels = Int(info.channels)
        self.limitFrames = limitFrames
    }

    deinit {
        if let file { _ = lib.close(file) }
    }

    /// Opens any file libsndfile can read; samples are delivered as Float32 whatever the file's encoding.
    static func openForReading(path: String) throws(SndfileError) -> SoundFile {
        let lib = try LibSndfile.shared.get()
        var info = SF_INFO()
        guard let file = lib.open(path, Int32(SFM_READ), &info) else {
            throw SndfileError(path: path, operation: "open for reading", message: reworded(LibSndfile.text(lib.strerror(nil))))
        }
        guard info.channels > 0, info.samplerate > 0 else {
            _ = lib.close(file)
            throw SndfileError(path: path, operation: "open for reading",
                               message: "header declares \(info.channels) channels at \(info.samplerate) Hz")
        }
        return SoundFile(lib: lib, file: file, path: path, info: info)
    }

    /// Opens `path` for reading as an audio source: its format must be one the pipeline carries.
    static func openSource(path: String) throws -> (SoundFile, AudioFormat) {
        let file = try openForReading(path: path)
        let format = AudioFormat(sampleRate: file.sampleRate, channels: file.channels)
        do {
            try format.validate()
        } catch {
            throw SndfileError(path: path, operation: "use as an audio source", message: error.description)
        }
        return (file, format)
    }

    /// Creates (or truncates) a sound file in `encoding`. A WAV header is rewritten after every write, so the file
    /// stays valid even if the process dies before `close()`; FLAC and Ogg are finalized by `close()`. A 16- or
    /// 24-bit WAV takes at most `wavDataLimitBytes` of samples (see `SoundFileEncoding`).
    ///
    /// A new file is made mode 0600, not sf_open's 0666 less the umask: what a microphone heard is for its owner (a
    /// file that exists keeps its mode). `exclusive` makes only a new file, and never follows a link put in its
    /// place (`O_EXCL | O_NOFOLLOW`): for names the program chose, not the user.
    static func create(path: String, format: AudioFormat, encoding: SoundFileEncoding, exclusive: Bool = false,
                       wavDataLimitBytes: Int = wavDataLimitBytes) throws(SndfileError) -> SoundFile {
        // Checked before the file is touched: a format libsndfile cannot write leaves an existing file as it was.
        _ = try writer(for: format, encoding: encoding, path: path)
        let flags = O_WRONLY | O_CREAT | O_CLOEXEC | (exclusive ? O_EXCL | O_NOFOLLOW : O_TRUNC)
        var descriptor: Int32
        repeat { descriptor = Glibc.open(path, flags, 0o600) } while descriptor < 0 && errno == EINTR
        guard descriptor >= 0 else {
            throw SndfileError(path: path, operation: "create", message: reworded(String(cString: strerror(errno))))
        }
        do {
            return try create(path: path, descriptor: descriptor, format: format, encoding: encoding,
                              wavDataLimitBytes: wavDataLimitBytes)
        } catch {
            if exclusive { unlink(path) }  // made by this call, and left empty: not a file anyone wrote
            throw error
        }
    }

    /// Creates a sound file in `encoding` on `descriptor`, a new, empty file opened for writing (as sf_open opens one), which the
    /// `SoundFile` then owns (closed with it, also when this throws); `path` only names it in errors. The file is never
    /// reopened by name, so what was created (exclusively, with its mode) is what is written.
    static func create(descriptor: Int32, path: String, format: AudioFormat,
                       encoding: SoundFileEncoding) throws(SndfileError) -> SoundFile {
        try create(path: path, descriptor: descriptor, format: format, encoding: encoding, wavDataLimitBytes: wavDataLimitBytes)
    }

    /// libsndfile, and the `SF_INFO` that asks it for `format` in `encoding`, once it has said it can write them.
    private static func writer(for format: AudioFormat, encoding: SoundFileEncoding,
                               path: String) throws(SndfileError) -> (lib: LibSndfile, info: SF_INFO) {
        let lib = try LibSndfile.shared.get()
        var info = SF_INFO()
        info.samplerate = Int32(format.sampleRate)
        info.channels = Int32(format.channels)
        info.format = encoding.sndfileFormat
        guard lib.formatCheck(&info) != 0 else {
            throw SndfileError(path: path, operation: "create", message: "this libsndfile cannot write \(encoding) at \(format)")
        }
        return (lib, info)
    }

    private static func create(path: String, descriptor: Int32, format: AudioFormat, encoding: SoundFileEncoding,
                               wavDataLimitBytes: Int) throws(SndfileError) -> SoundFile {
        let lib: LibSndfile
        var info: SF_INFO
        do { (lib, info) = try writer(for: format, encoding: encoding, path: path) } catch {
            Glibc.close(descriptor)
            throw error
        }
        // sf_open_fd closes the descriptor with the file (SF_TRUE), and on failure too.
        guard let file = lib.openDescriptor(descriptor, Int32(SFM_WRITE), &info, Int32(SF_TRUE)) else {
            throw SndfileError(path: path, operation: "create", message: reworded(LibSndfile.text(lib.strerror(nil))))
        }
        // RF64 is written as a plain WAV until the file passes 4 GiB (decided before the first write).
        if encoding == .float32 && lib.command(file, Int32(SFC_RF64_AUTO_DOWNGRADE), nil, Int32(SF_TRUE)) != SF_TRUE {
            _ = lib.close(file)
            throw SndfileError(path: path, operation: "create", message: "this libsndfile cannot write RF64 as WAV below 4 GiB")
        }
        if encoding.updatesHeader { _ = lib.command(file, Int32(SFC_SET_UPDATE_HEADER_AUTO), nil, Int32(SF_TRUE)) }
        _ = lib.command(file, Int32(SFC_SET_CLIPPING), nil, Int32(SF_TRUE))
        let limitFrames = encoding.limitedSampleBytes.map { wavDataLimitBytes / ($0 * format.channels) }
        return SoundFile(lib: lib, file: file, path: path, info: info, limitFrames: limitFrames)
    }

    /// Reads up to `frames` interleaved frames; returns the number read (0 at the end or on error, see `error`).
    func readFrames(into buffer: UnsafeMutablePointer<Float>, frames: Int) -> Int {
        guard let file else { return 0 }
        return Int(lib.readFloat(file, buffer, sf_count_t(frames)))
    }

    /// Writes `frames` interleaved frames; returns the number written. Short at a WAV's size limit too, and `error`
    /// then says so.
    func writeFrames(from buffer: UnsafePointer<Float>, frames: Int) -> Int {
        guard let file else { return 0 }
        guard let limitFrames else { return Int(lib.writeFloat(file, buffer, sf_count_t(frames))) }
        let fits = min(frames, limitFrames - framesWritten)
        let written = fits > 0 ? Int(lib.writeFloat(file, buffer, sf_count_t(fits))) : 0
        framesWritten += written
        if fits < frames { reachedLimit = true }
        return written
    }

    /// Seeks back to the first frame. Returns `false` if the file cannot seek.
    func rewind() -> Bool {
        guard let file else { return false }
        return lib.seek(file, 0, SEEK_SET) == 0
    }

    /// libsndfile's error for this handle, if its last operation failed, or the size limit a write reached.
    func error(operation: String) -> SndfileError? {
        guard let file else { return nil }
        if lib.error(file) == 0 {
            guard reachedLimit, let limitFrames else { return nil }
            return SndfileError(path: path, operation: operation, message: "a 16- or 24-bit WAV holds at most 4 GiB "
                                + "(\(limitFrames) frames here); a 32-bit float WAV (RF64 past 4 GiB) or FLAC has no such limit")
        }
        return SndfileError(path: path, operation: operation, message: reworded(LibSndfile.text(lib.strerror(file))))
    }

    /// Closes the file (finalizing a written header). Safe to call twice.
    func close() throws(SndfileError) {
        guard let file else { return }
        self.file = nil
        let result = lib.close(file)
        if result != 0 {
            throw SndfileError(path: path, operation: "close", message: reworded(LibSndfile.text(lib.errorNumber(result))))
        }
    }
}

/// libsndfile's messages in our words: "System error : No such file or directory." becomes "no such file or
/// directory"; "File contains data in an unknown format." becomes "not a sound file libsndfile can read (WAV, FLAC,
/// Ogg…)"; others lose their trailing period and capital.
func reworded(_ text: String) -> String {
    var t = Substring(text)
    while let c = t.first, c.isWhitespace { t.removeFirst() }
    while let c = t.last, c.isWhitespace { t.removeLast() }
    let prefix = "System error : "
    if t.hasPrefix(prefix) { t = t.dropFirst(prefix.count) }
    if t.lowercased().contains("unknown format") || t.lowercased().contains("format not recognised") {
        return "not a sound file libsndfile can read (WAV, FLAC, Ogg…)"
    }
    if t.hasSuffix(".") { t.removeLast() }
    // Lower-case the first letter, unless it starts an acronym ("WAV…").
    if let first = t.first, t.dropFirst().first?.isLowercase ?? true { return first.lowercased() + t.dropFirst() }
    return String(t)
}
