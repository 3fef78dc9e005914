import Synchronization

/// Plays a sound file as a capture source, the file sibling of `Recorder`: chunks of `periodFrames` through the
/// same ring hand-over, paced in real time unless `realtime` is false.
///
/// Reads any WAV (or other) file libsndfile understands, converted to Float32; the format is the file's.
/// At the end of the file it either loops or stops producing: `read` returns `nil` once the queued chunks are
/// drained, and `isFinished` turns true.
public final class WAVFileSource: PacedSourceBacked {
    /// The file's path.
    public let path: String
    /// Frames in the file, as libsndfile counts them.
    public let frameCount: Int
    /// Whether the file restarts at its end.
    public let loops: Bool
    private let reader: FileReader
    let source: PacedSource

    /// Opens `path`. Throws `SndfileError` naming the file with libsndfile's explanation when it is missing,
    /// truncated or not a sound file, and when its rate or channel count is outside what the pipeline carries.
    public init(path: String, periodFrames: Int = 128, loop: Bool = false, realtime: Bool = true,
                ringChunks: Int = 64) throws {
        let (file, format) = try SoundFile.openSource(path: path)
        self.path = path
        self.frameCount = file.frameCount
        self.loops = loop
        self.reader = FileReader(file: file, loop: loop)
        self.source = PacedSource(name: "WAVFileSource(\(path))", format: format, periodFrames: periodFrames,
                                  realtime: realtime, ringChunks: ringChunks, producer: reader)
    }

    deinit {
        source.stop()
    }


    /// True once the source will produce nothing more (end of file without looping, a read error, or `stop()`)
    /// and every chunk has been read.
    public var isFinished: Bool { source.ring.isDrained }

    /// The read error that ended the file early, if any.
    public var failure: SndfileError? { reader.failure }

    public var fault: (any Error)? { failure }
}

/// Reads a `SoundFile` chunk by chunk on the source thread, looping if asked.
final class FileReader: ChunkProducer, @unchecked Sendable {  // `file` is used only by the source thread once started.
    private let file: SoundFile
    private let loop: Bool
    private let failureStore = Mutex<SndfileError?>(nil)

    init(file: SoundFile, loop: Bool) {
        self.file = file
        self.loop = loop
    }

    var failure: SndfileError? { failureStore.withLock { $0 } }

    func produce(into buffer: UnsafeMutablePointer<Float>, frames: Int) -> Int {
        var got = file.readFrames(into: buffer, frames: frames)
        if got == 0, let error = file.error(operation: "read") {
            failureStore.withLock { $0 = error }
            return 0
        }
        if got == 0 && loop && file.frameCount > 0 && file.rewind() {
            got = file.readFrames(into: buffer, frames: frames)
        }
        return got
    }
}
