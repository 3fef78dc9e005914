import Testing
import Foundation
@testable import MeshAudio

@Suite("Tone, WAV files and input specs")
struct FilesTests {
    // MARK: Tone

    @Test func toneSamplesFollowTheSineFormula() throws {
        let format = AudioFormat(sampleRate: 48_000, channels: 2)
        let tone = try ToneSource(frequency: 1000, amplitude: 0.25, format: format, periodFrames: 100, realtime: false)
        try tone.start()
        defer { tone.stop() }
        let capture = collect(tone, frames: 4_800)
        #expect(capture.samples.count == 4_800 * 2)
        #expect(capture.isContiguous)
        #expect(capture.chunks.first?.firstFrameIndex == 0)
        var worst: Float = 0
        for n in 0..<4_800 {
            let expected = Float(0.25 * sin(2 * Double.pi * 1000 * Double(n) / 48_000))
            worst = max(worst, abs(capture.samples[2 * n] - expected))
            #expect(capture.samples[2 * n] == capture.samples[2 * n + 1], "both channels carry the same sample")
        }
        #expect(worst < 1e-5)
        // 1 kHz over 0.1 s: 100 cycles, 200 sign changes (give or take the exact zero at n = 0).
        let left: [Float] = stride(from: 0, to: capture.samples.count, by: 2).map { capture.samples[$0] }
        let crossings = zip(left.dropFirst(), left.dropFirst(2)).filter { ($0 < 0) != ($1 < 0) }.count
        #expect((198...200).contains(crossings))
    }

    @Test func toneParsesValidSpecs() throws {
        #expect(try ToneSource.frequency(inSpec: "tone:440", sampleRate: 44_100) == 440)
        #expect(try ToneSource.frequency(inSpec: "tone:997.5", sampleRate: 44_100) == 997.5)
        let tone = try ToneSource.parse("tone:440", realtime: false)
        #expect(tone.frequency == 440)
        #expect(tone.format == .default)
    }

    @Test(arguments: ["tone:0", "tone:-5", "tone:22050", "tone:30000", "tone:nan", "tone:inf", "tone:abc", "tone:", "tune:440"])
    func toneRefusesInvalidSpecs(spec: String) {
        #expect {
            _ = try ToneSource.parse(spec, realtime: false)
        } throws: { error in
            guard let error = error as? ToneError else { return false }
            let text = error.description
            switch error {
            case .invalidFrequency: return text.contains("22050") && text.contains("above 0")
            case .invalidSpec(let s): return s == spec && text.contains("tone:440")
            case .invalidAmplitude: return false
            }
        }
    }

    @Test func toneRefusesBadAmplitude() {
        #expect(throws: ToneError.invalidAmplitude(1.5)) { try ToneSource(frequency: 440, amplitude: 1.5, realtime: false) }
    }

    @Test func realtimeToneIsPacedByTheClock() throws {
        let tone = try ToneSource(frequency: 440, periodFrames: 441, realtime: true)
        try tone.start()
        defer { tone.stop() }
        let capture = collect(tone, frames: 11_025)  // 0.25 s
        #expect(capture.samples.count == 11_025)
        #expect(capture.elapsedSeconds > 0.2 && capture.elapsedSeconds < 1.5, "took \(capture.elapsedSeconds) s")
        // Timestamps advance by exactly one period of time per chunk (10 ms), from a fixed origin.
        let steps = zip(capture.chunks, capture.chunks.dropFirst()).map { $1.timestampNanos - $0.timestampNanos }
        #expect(steps.allSatisfy { $0 == 10_000_000 })
    }

    // MARK: Input specs


    // MARK: WAV

    /// Writes `signal` through a non-real-time WAVFileSink, reads it back through a non-real-time WAVFileSource.
    private func roundTrip(_ signal: [Float], format: AudioFormat, encoding: SoundFileEncoding) throws -> (WAVFileSource, Capture) {
        let path = temporaryPath("roundtrip.wav")
        let frames = signal.count / format.channels
        let sink = try WAVFileSink(path: path, format: format, periodFrames: 100, encoding: encoding,
                                   realtime: false, maxFrames: frames)
        try sink.start(renderer: SignalRenderer(signal, channels: format.channels))
        #expect(sink.waitUntilFinished(timeoutNanos: 10_000_000_000))
        sink.stop()
        #expect(sink.failure == nil)
        #expect(sink.stats.framesOut == UInt64(frames))

        let source = try WAVFileSource(path: path, periodFrames: 64, realtime: false)
        try source.start()
        let capture = collect(source, frames: frames + 1_000, timeoutSeconds: 10)
        source.stop()
        return (source, capture)
    }

    @Test func wavFloatRoundTripIsExact() throws {
        let signal = (0..<10_007).map { Float(sin(Double($0) * 0.01)) * 0.9 }
        let (source, capture) = try roundTrip(signal, format: .default, encoding: .float32)
        #expect(source.format == .default)
        #expect(source.frameCount == signal.count)
        #expect(bits(capture.samples) == bits(signal))
        #expect(capture.isContiguous)
        #expect(capture.chunks.last?.frames == 10_007 % 64, "the last chunk is the file's remainder")
        #expect(source.isFinished)
    }

    @Test func wav48kStereoRoundTripIsExact() throws {
        let format = AudioFormat(sampleRate: 48_000, channels: 2)
        let signal: [Float] = (0..<(4_800 * 2)).map { (i: Int) -> Float in
            let x = Float(i)
            return i % 2 == 0 ? x / 9_600 - 0.5 : -x / 19_200
        }
        let (source, capture) = try roundTrip(signal, format: format, encoding: .float32)
        #expect(source.format == format)
        #expect(bits(capture.samples) == bits(signal))
    }

    @Test func wavPCM16RoundTripIsWithinOneStep() throws {
        let signal = (0..<4_410).map { Float(sin(Double($0) * 0.05)) * 0.8 }
        let (_, capture) = try roundTrip(signal, format: .default, encoding: .pcm16)
        #expect(capture.samples.count == signal.count)
        let worst = zip(capture.samples, signal).map { abs($0 - $1) }.max() ?? 1
        #expect(worst <= 1.0 / 32_768)
    }

    @Test("Every output encoding is written and read back: WAV s16/s24/f32, FLAC, Ogg; float WAV is WAVE_FORMAT_EXTENSIBLE")
    func everyEncodingRoundTrips() throws {
        let signal = (0..<8_000).map { Float(sin(Double($0) * 0.03)) * 0.5 }
        for encoding in SoundFileEncoding.allCases {
            let path = temporaryPath("enc-\(encoding).bin")
            try SoundFiles.write(path: path, format: .default, encoding: encoding, samples: signal)
            let (format, back) = try SoundFiles.read(path: path)
            #expect(format == .default, "\(encoding)")
            #expect(back.count >= signal.count - 1_024 && back.count <= signal.count + 1_024, "\(encoding): \(back.count) samples")
            let tolerance: Float = encoding == .oggVorbis ? 0.05 : (encoding == .pcm16 ? 1.0 / 16_384 : 1e-6)
            if encoding != .oggVorbis {
                #expect(zip(back, signal).allSatisfy { abs($0 - $1) <= tolerance }, "\(encoding) is lossless to its depth")
            }
            let header = Array(try Data(contentsOf: URL(fileURLWithPath: path)).prefix(120))
            switch encoding {
            case .pcm16, .pcm24:
                #expect(Array(header.prefix(4)) == Array("RIFF".utf8))
                #expect(header[20] == 1 && header[21] == 0, "WAVE_FORMAT_PCM: what every reader takes")
            case .float32:
                // Below 4 GiB the RF64 writer leaves a plain WAV, with a JUNK chunk where ds64 would go.
                #expect(Array(header.prefix(4)) == Array("RIFF".utf8), "a small RF64 output is a plain WAV")
                let fmt = try #require(wavChunk("fmt ", in: header), "a fmt chunk")
                #expect(fmt.size == 40, "a 40-byte extensible fmt chunk")
                #expect(header[fmt.offset] == 0xFE && header[fmt.offset + 1] == 0xFF, "WAVE_FORMAT_EXTENSIBLE")
            case .flac: #expect(Array(header.prefix(4)) == Array("fLaC".utf8))
            case .oggVorbis: #expect(Array(header.prefix(4)) == Array("OggS".utf8))
            }
        }
        #expect(SoundFileEncoding.forPath("x.WAV") == .pcm16 && SoundFileEncoding.forPath("x.wav", sampleFormat: "f32") == .float32)
        #expect(SoundFileEncoding.forPath("x.mp3") == nil && SoundFileEncoding.forPath("x.wav", sampleFormat: "u8") == nil)
    }

    /// A 32-bit float WAV past 4 GiB: RF64, whose 64-bit sizes read back every frame (a WAV's 32-bit sizes wrapped
    /// there, and the file read back as the 44 100 frames past 4 GiB). 4.3 GB written unpaced: about 10 s.
    @Test(.enabled(if: freeBytes(at: NSTemporaryDirectory()) >= 6_000_000_000, "needs 6 GB free"))
    func floatWAVPast4GiBIsRF64AndKeepsEveryFrame() throws {
        final class Quarter: AudioRenderer, @unchecked Sendable {
            func render(into buffer: UnsafeMutableBufferPointer<Float>, context: RenderContext) { buffer.update(repeating: 0.25) }
        }
        let path = temporaryPath("big.wav")
        defer { unlink(path) }
        let frames = (1 << 30) + 44_100  // mono Float32: 4 GiB and 1 s at 44.1 kHz
        let sink = try WAVFileSink(path: path, format: AudioFormat(sampleRate: 44_100, channels: 1), periodFrames: 1 << 16,
                                   encoding: .float32, realtime: false, maxFrames: frames)
        try sink.start(renderer: Quarter())
        #expect(sink.waitUntilFinished(timeoutNanos: 600_000_000_000))
        sink.stop()
        #expect(sink.failure == nil)
        let header = Array(try #require(FileHandle(forReadingAtPath: path)).readData(ofLength: 120))
        #expect(Array(header.prefix(4)) == Array("RF64".utf8))
        let ds64 = try #require(wavChunk("ds64", in: header), "a ds64 chunk")
        let dataBytes = header[(ds64.offset + 8)..<(ds64.offset + 16)].reversed().reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        #expect(dataBytes == UInt64(frames) * 4)
        #expect(try SoundFile.openForReading(path: path).frameCount == frames)
    }

    /// A 16- or 24-bit WAV stays WAVE_FORMAT_PCM (RF64 from libsndfile is WAVE_FORMAT_EXTENSIBLE), so it ends at its
    /// 4 GiB limit instead of wrapping: the write that would pass it is short and says why, and the file holds every
    /// frame up to it. Here with a limit of 4 000 bytes.
    @Test func integerWAVEndsAtItsLimitReadable() throws {
        let path = temporaryPath("limit.wav")
        defer { unlink(path) }
        let format = AudioFormat(sampleRate: 44_100, channels: 2)
        let file = try SoundFile.create(path: path, format: format, encoding: .pcm16, wavDataLimitBytes: 4_000)
        let block = [Float](repeating: 0.5, count: 600 * 2)
        #expect(block.withUnsafeBufferPointer { file.writeFrames(from: $0.baseAddress!, frames: 600) } == 600)
        #expect(file.error(operation: "write") == nil)
        #expect(block.withUnsafeBufferPointer { file.writeFrames(from: $0.baseAddress!, frames: 600) } == 400, "1 000 frames fit")
        let error = try #require(file.error(operation: "write"))
        #expect(error.message.contains("4 GiB") && error.message.contains("1000 frames"), "\(error)")
        #expect(block.withUnsafeBufferPointer { file.writeFrames(from: $0.baseAddress!, frames: 600) } == 0)
        try file.close()
        let back = try SoundFile.openForReading(path: path)
        #expect(back.frameCount == 1_000)
        let header = Array(try Data(contentsOf: URL(fileURLWithPath: path)).prefix(44))
        #expect(Array(header.prefix(4)) == Array("RIFF".utf8) && header[20] == 1 && header[21] == 0)
        #expect(SoundFile.wavDataLimitBytes + 44 <= Int(UInt32.max), "the real limit leaves room for the header")
    }

    /// What a microphone heard is for its owner: a recording is made 0600 whatever the umask lets through (sf_open
    /// would make it 0666 less the umask: 0644, readable by every local user); one written over keeps its mode.
    /// `exclusive` (names the program chose) writes neither over a file nor through a link planted in its place.
    @Test("Sound files are made 0600; exclusive ones never replace a file or follow a link")
    func soundFilesArePrivateAndExclusiveOnesNeverReplace() throws {
        let path = temporaryPath("private.wav")
        defer { unlink(path) }
        let previous = umask(0o022)
        defer { umask(previous) }
        let sink = try WAVFileSink(path: path, realtime: false)
        sink.stop()
        var info = stat()
        #expect(stat(path, &info) == 0 && info.st_mode & 0o777 == 0o600)
        // Written over (the user's own --output): truncated, its mode kept.
        #expect(chmod(path, 0o640) == 0)
        try SoundFiles.write(path: path, format: .default, encoding: .float32, samples: [0.5, 0.25])
        #expect(stat(path, &info) == 0 && info.st_mode & 0o777 == 0o640)
        #expect(try SoundFiles.read(path: path).samples == [0.5, 0.25])

        // Exclusive: an existing file is left as it is, and a link (here one that leads nowhere) is not followed.
        #expect(throws: SndfileError.self) { try WAVFileSink(path: path, realtime: false, exclusive: true) }
        #expect(try SoundFiles.read(path: path).samples == [0.5, 0.25])
        let link = temporaryPath("planted.wav"), target = temporaryPath("planted-target.wav")
        defer { unlink(link); unlink(target) }
        #expect(symlink(target, link) == 0)
        do {
            _ = try WAVFileSink(path: link, realtime: false, exclusive: true)
            Issue.record("an exclusive sink wrote through a link")
        } catch let error as SndfileError {
            #expect(error.operation == "create" && error.message == "file exists", "\(error)")
        }
        #expect(access(target, F_OK) != 0, "nothing was made where the link leads")
        let fresh = temporaryPath("fresh.wav")
        defer { unlink(fresh) }
        try WAVFileSink(path: fresh, realtime: false, exclusive: true).stop()
        #expect(stat(fresh, &info) == 0 && info.st_mode & 0o777 == 0o600)
    }

    @Test("libsndfile's errors come in our words, without its \"System error :\" prefix")
    func sndfileErrorsAreReworded() {
        #expect(reworded("System error : No such file or directory.") == "no such file or directory")
        #expect(reworded("File contains data in an unknown format.") == "not a sound file libsndfile can read (WAV, FLAC, Ogg…)")
        #expect(reworded("WAV file has no data.") == "WAV file has no data")
        do {
            _ = try WAVFileSource(path: "/nonexistent/x.wav", periodFrames: 64, realtime: false)
            Issue.record("opened a missing file")
        } catch {
            #expect("\(error)".contains("no such file or directory") && !"\(error)".contains("System error"), "\(error)")
        }
    }

    @Test func wavSourceLoopsWhenAsked() throws {
        let path = temporaryPath("loop.wav")
        let sink = try WAVFileSink(path: path, periodFrames: 10, realtime: false, maxFrames: 30)
        try sink.start(renderer: SignalRenderer((0..<30).map(Float.init)))
        #expect(sink.waitUntilFinished(timeoutNanos: 5_000_000_000))
        sink.stop()
        let source = try WAVFileSource(path: path, periodFrames: 16, loop: true, realtime: false)
        try source.start()
        let capture = collect(source, frames: 75)
        source.stop()
        let expected: [Float] = (0..<75).map { Float($0 % 30) }
        #expect(Array(capture.samples.prefix(75)) == expected)
        #expect(!source.loops || capture.isContiguous)
    }

    @Test func wavSinkHeaderIsValidBeforeStop() throws {
        // The header is updated as frames are written, so a crash before stop() still leaves a readable file.
        let path = temporaryPath("live.wav")
        let sink = try WAVFileSink(path: path, periodFrames: 50, realtime: false, maxFrames: 500)
        try sink.start(renderer: SignalRenderer([Float](repeating: 0.5, count: 500)))
        #expect(sink.waitUntilFinished(timeoutNanos: 5_000_000_000))
        let reader = try WAVFileSource(path: path, realtime: false)
        #expect(reader.frameCount == 500)
        sink.stop()
    }

    @Test func waitingForeverForASinkWaitsUntilItHasFinished() throws {
        let path = temporaryPath("forever.wav")
        let sink = try WAVFileSink(path: path, periodFrames: 441, realtime: true, maxFrames: 4410)  // 0.1 s, paced
        try sink.start(renderer: SignalRenderer([Float](repeating: 0.5, count: 4410)))
        #expect(sink.waitUntilFinished(timeoutNanos: .max), "waitUntilFinished(timeoutNanos: .max) gave up")
        #expect(sink.stats.framesOut == 4410)
        sink.stop()
    }

    @Test func garbageWAVGivesAClearError() throws {
        let path = temporaryPath("garbage.wav")
        try Data((0..<4_000).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 11) }).write(to: URL(fileURLWithPath: path))
        #expect {
            _ = try WAVFileSource(path: path)
        } throws: { error in
            let text = "\(error)"
            return error is SndfileError && text.contains(path) && text.contains("open for reading")
                && text.count > path.count + 30
        }
    }

    @Test func wavWithHeaderCutShortGivesAClearError() throws {
        let good = temporaryPath("good.wav")
        let sink = try WAVFileSink(path: good, periodFrames: 100, realtime: false, maxFrames: 1_000)
        try sink.start(renderer: SignalRenderer([Float](repeating: 0.25, count: 1_000)))
        #expect(sink.waitUntilFinished(timeoutNanos: 5_000_000_000))
        sink.stop()
        let bytes = try Data(contentsOf: URL(fileURLWithPath: good))
        let cut = temporaryPath("cut.wav")
        try bytes.prefix(30).write(to: URL(fileURLWithPath: cut))
        #expect {
            _ = try WAVFileSource(path: cut)
        } throws: { error in
            guard let error = error as? SndfileError else { return false }
            return error.path == cut && !error.message.isEmpty && "\(error)".contains(cut)
        }
    }

    @Test func missingWAVNamesTheFile() {
        let path = "/nonexistent/dir/take.wav"
        #expect {
            _ = try WAVFileSource(path: path)
        } throws: { error in
            "\(error)".contains(path) && "\(error)".lowercased().contains("no such file")
        }
    }

    @Test func pacingClockMapsFramesWithoutDrift() {
        let clock = PacingClock(sampleRate: 44_100, originNanos: 1_000)
        #expect(clock.time(ofFrame: 0) == 1_000)
        #expect(clock.time(ofFrame: 44_100) == 1_000 + 1_000_000_000)
        #expect(clock.time(ofFrame: 44_100 * 3_600) == 1_000 + 3_600 * 1_000_000_000)
        #expect(clock.time(ofFrame: 441) == 1_000 + 10_000_000)
    }
}

/// Where the chunk `tag` of a RIFF/RF64 file starting with `bytes` has its body, and the size its header gives.
private func wavChunk(_ tag: String, in bytes: [UInt8]) -> (offset: Int, size: Int)? {
    var at = 12
    while at + 8 <= bytes.count {
        let size = bytes[(at + 4)..<(at + 8)].reversed().reduce(0) { $0 << 8 | Int($1) }
        if Array(bytes[at..<(at + 4)]) == Array(tag.utf8) { return (at + 8, size) }
        at += 8 + size + size % 2
    }
    return nil
}

/// Bytes free for an unprivileged writer on the file system holding `path` (0 if it cannot be told).
private func freeBytes(at path: String) -> Int {
    var fs = statvfs()
    guard statvfs(path, &fs) == 0 else { return 0 }
    return Int(fs.f_bavail) * Int(fs.f_frsize)
}
