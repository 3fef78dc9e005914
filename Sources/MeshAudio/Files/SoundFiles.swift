/// Whole-file reads through libsndfile, for tools and the fuzzer (the audio path streams through `WAVFileSource`).
package enum SoundFiles {
    /// Reads at most `maximumFrames` interleaved Float32 frames of the file at `path`, whatever its format
    /// (WAV, FLAC, Ogg…). Throws `SndfileError` for a file libsndfile cannot read or a format the pipeline cannot
    /// carry.
    package static func read(path: String, maximumFrames: Int = 1 << 20) throws -> (format: AudioFormat, samples: [Float]) {
        let (file, format) = try SoundFile.openSource(path: path)
        var samples: [Float] = []
        let chunk = 4096
        var buffer = [Float](repeating: 0, count: chunk * format.channels)
        while samples.count / format.channels < maximumFrames {
            let n = buffer.withUnsafeMutableBufferPointer { file.readFrames(into: $0.baseAddress!, frames: chunk) }
            if n <= 0 { break }
            samples.append(contentsOf: buffer[0..<(n * format.channels)])
        }
        if let e = file.error(operation: "read") { throw e }
        return (format, samples)
    }

    /// Writes `samples` (interleaved) to a new file at `path` in `encoding`.
    package static func write(path: String, format: AudioFormat, encoding: SoundFileEncoding, samples: [Float]) throws {
        let file = try SoundFile.create(path: path, format: format, encoding: encoding)
        let frames = samples.count / format.channels
        let written = samples.withUnsafeBufferPointer { file.writeFrames(from: $0.baseAddress!, frames: frames) }
        if written != frames { throw file.error(operation: "write") ?? SndfileError(path: path, operation: "write", message: "short write") }
        try file.close()
    }
}
