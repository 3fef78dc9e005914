// The one file in MeshAudio that talks to libsndfile (CSndfile). Everything else uses `SoundFile`.
import CSndfile
#if canImport(Glibc)
import Glibc
#endif

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
public enum WAVEncoding: Sendable, Equatable {
    /// 32-bit IEEE float: lossless for the pipeline's samples.
    case float32
    /// 16-bit signed integer, clipped to [-1, 1).
    case pcm16

    fileprivate var sndfileFormat: Int32 {
        let subtype = self == .float32 ? SF_FORMAT_FLOAT : SF_FORMAT_PCM_16
        return Int32(SF_FORMAT_WAV | subtype)
    }
}

/// An open libsndfile handle reading or writing interleaved Float32 frames; closed when released.
final class SoundFile: @unchecked Sendable {  // Used by one thread at a time: the opener, then the file thread.
    private var file: OpaquePointer?
    let path: String
    /// Frames in the file when opened for reading (libsndfile's count); 0 for writing.
    let frameCount: Int
    let sampleRate: Int
    let channels: Int

    private init(file: OpaquePointer, path: String, info: SF_INFO) {
        self.file = file
        self.path = path
        self.frameCount = Int(info.frames)
        self.sampleRate = Int(info.samplerate)
        self.channels = Int(info.channels)
    }

    deinit {
        if let file { sf_close(file) }
    }

    /// Opens any file libsndfile can read; samples are delivered as Float32 whatever the file's encoding.
    static func openForReading(path: String) throws(SndfileError) -> SoundFile {
        var info = SF_INFO()
        guard let file = sf_open(path, Int32(SFM_READ), &info) else {
            throw SndfileError(path: path, operation: "open for reading", message: String(cString: sf_strerror(nil)))
        }
        guard info.channels > 0, info.samplerate > 0 else {
            sf_close(file)
            throw SndfileError(path: path, operation: "open for reading",
                               message: "header declares \(info.channels) channels at \(info.samplerate) Hz")
        }
        return SoundFile(file: file, path: path, info: info)
    }

    /// Creates (or truncates) a WAV file. The header is rewritten after every write, so the file stays valid
    /// even if the process dies before `close()`.
    static func createWAV(path: String, format: AudioFormat, encoding: WAVEncoding) throws(SndfileError) -> SoundFile {
        var info = SF_INFO()
        info.samplerate = Int32(format.sampleRate)
        info.channels = Int32(format.channels)
        info.format = encoding.sndfileFormat
        guard sf_format_check(&info) != 0 else {
            throw SndfileError(path: path, operation: "create", message: "libsndfile rejects WAV \(encoding) at \(format)")
        }
        guard let file = sf_open(path, Int32(SFM_WRITE), &info) else {
            throw SndfileError(path: path, operation: "create", message: String(cString: sf_strerror(nil)))
        }
        sf_command(file, Int32(SFC_SET_UPDATE_HEADER_AUTO), nil, Int32(SF_TRUE))
        sf_command(file, Int32(SFC_SET_CLIPPING), nil, Int32(SF_TRUE))
        return SoundFile(file: file, path: path, info: info)
    }

    /// Reads up to `frames` interleaved frames; returns the number read (0 at the end or on error, see `error`).
    func readFrames(into buffer: UnsafeMutablePointer<Float>, frames: Int) -> Int {
        guard let file else { return 0 }
        return Int(sf_readf_float(file, buffer, sf_count_t(frames)))
    }

    /// Writes `frames` interleaved frames; returns the number written.
    func writeFrames(from buffer: UnsafePointer<Float>, frames: Int) -> Int {
        guard let file else { return 0 }
        return Int(sf_writef_float(file, buffer, sf_count_t(frames)))
    }

    /// Seeks back to the first frame. Returns `false` if the file cannot seek.
    func rewind() -> Bool {
        guard let file else { return false }
        return sf_seek(file, 0, SEEK_SET) == 0
    }

    /// libsndfile's error for this handle, if its last operation failed.
    func error(operation: String) -> SndfileError? {
        guard let file, sf_error(file) != 0 else { return nil }
        return SndfileError(path: path, operation: operation, message: String(cString: sf_strerror(file)))
    }

    /// Closes the file (finalizing a written header). Safe to call twice.
    func close() throws(SndfileError) {
        guard let file else { return }
        self.file = nil
        let result = sf_close(file)
        if result != 0 {
            throw SndfileError(path: path, operation: "close", message: String(cString: sf_error_number(result)))
        }
    }
}
