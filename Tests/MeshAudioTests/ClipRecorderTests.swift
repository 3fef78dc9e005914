import Testing
import Foundation
import Synchronization
import MeshTestSupport
@testable import MeshAudio

/// Clip capture on the host: what a clip holds (the pre-roll, then what follows, exactly), its name, and what happens
/// when it cannot be written.
@Suite(.serialized)
struct ClipRecorderTests {
    static func directory() throws -> String {
        let dir = NSTemporaryDirectory() + "peermesh-clips-\(getpid())-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        return dir
    }

    /// A started recorder in a fresh directory (0.1 s of pre-roll, clips up to 60 s), and the outcomes it reported.
    final class Clips: Sendable {
        /// The outcomes, in the order reported.
        final class Reported: Sendable { let list = Mutex<[ClipRecorder.Outcome]>([]) }
        let directory: String
        let reported: Reported
        let recorder: ClipRecorder

        init() throws {
            directory = try ClipRecorderTests.directory()
            let reported = Reported()
            self.reported = reported
            recorder = try ClipRecorder(configuration: .init(directory: directory, name: "h", prerollSeconds: 0.1, maximumSeconds: 60),
                                        format: .default) { o in reported.list.withLock { $0.append(o) } }
            try recorder.start()
        }

        var outcomes: [ClipRecorder.Outcome] { reported.list.withLock { $0 } }
        func remove() { try? FileManager.default.removeItem(atPath: directory) }
    }

    /// Taps `count` samples of a ramp that counts up from `start` (a value per sample, so order and gaps show).
    static func tap(_ recorder: ClipRecorder, from start: inout Int, count: Int) {
        let samples = (0..<count).map { Float((start + $0) % 100_000) / 100_000 }
        start += count
        samples.withUnsafeBufferPointer { recorder.tap($0) }
    }

    @Test func aClipHoldsThePrerollThenWhatFollowsContiguouslyUpToItsLength() throws {
        let dir = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let outcome = Mutex<ClipRecorder.Outcome?>(nil)
        let recorder = try ClipRecorder(configuration: .init(directory: dir, name: "Kitchen mic/1", prerollSeconds: 0.5, maximumSeconds: 0.25),
                                        format: .default) { o in outcome.withLock { $0 = o } }
        try recorder.start()
        var next = 0
        for _ in 0..<40 { Self.tap(recorder, from: &next, count: 1_323); usleep(5_000) } // 1.2 s of capture
        usleep(60_000)
        let name = try recorder.open(clip: 1, prerollOnly: false)
        #expect(name.hasPrefix("Kitchen_mic_1-") && name.hasSuffix(".wav"))
        for _ in 0..<20 { Self.tap(recorder, from: &next, count: 1_323); usleep(5_000) }
        #expect(eventually(5) { outcome.withLock { $0 } != nil })
        #expect(outcome.withLock { $0 } == .saved(clip: 1, name: name))
        let (samples, format) = try readWAV(dir + "/" + name)
        #expect(format == .default)
        #expect(samples.count == 22_050 + 11_025, "0.5 s of pre-roll and 0.25 s after the press")
        // Contiguous: every sample is the one after the previous (no gap, no repeat), from the capture itself.
        let first = Int((samples[0] * 100_000).rounded())
        let contiguous = samples.indices.allSatisfy { Int((samples[$0] * 100_000).rounded()) == (first + $0) % 100_000 }
        #expect(contiguous)
        #expect(first >= 1_323 * 40 - 22_050 - 1_323 * 2 && first <= 1_323 * 40 - 22_050, "the pre-roll ends at the press")
        recorder.stop()
        #expect(recorder.droppedSamples == 0)
    }

    @Test func noClipIsStartedWithoutRoomForItAndTheReserve() throws {
        let dir = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        var config = ClipRecorder.Configuration(directory: dir, name: "h", prerollSeconds: 1, maximumSeconds: 1)
        config.reservedBytes = 1 << 62  // more than any disk here has
        let recorder = try ClipRecorder(configuration: config, format: .default) { _ in }
        #expect(recorder.largestClipBytes == 88_200 * 4 + 4096)
        try recorder.start()
        do {
            _ = try recorder.open(clip: 1, prerollOnly: true)
            Issue.record("a clip was started without the free space it needs")
        } catch let e as ClipError {
            #expect(e.description.contains("not enough free space in \(dir)"), "\(e.description)")
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir).isEmpty, "no file was made")
        recorder.stop()
    }

    @Test func aFullRingTakesWholeFramesOnlySoChannelsNeverShift() throws {
        let dir = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        // Three channels: the ring (8000 × 3 rounded up to 32 768 samples) does not hold a whole number of frames.
        let format = AudioFormat(sampleRate: 8_000, channels: 3, sampleType: .float32LE)
        let saved = Mutex<String?>(nil)
        let recorder = try ClipRecorder(configuration: .init(directory: dir, name: "three", prerollSeconds: 4),
                                        format: format) { o in if case .saved(_, let n) = o { saved.withLock { $0 = n } } }
        // The clip thread is not running yet (stalled on a disk, as it were): the ring fills, and then overflows.
        var frame = 0
        for _ in 0..<12 {
            var samples: [Float] = []
            for i in 0..<1_000 {
                let base = Float((frame + i) % 10_000) / 100_000
                samples += [base, base + 0.3, base + 0.6]
            }
            frame += 1_000
            samples.withUnsafeBufferPointer { recorder.tap($0) }
        }
        #expect(recorder.droppedSamples == 36_000 - 32_766, "10 922 whole frames kept, the rest dropped whole")
        try recorder.start()
        usleep(100_000)
        let name = try recorder.open(clip: 1, prerollOnly: true)
        #expect(eventually(5) { saved.withLock { $0 } == name })
        let (samples, read) = try readWAV(dir + "/" + name)
        #expect(read == format && samples.count == 10_922 * 3)
        // Every frame's channels are where they belong: channel c is channel 0 plus 0.3 c.
        let aligned = stride(from: 0, to: samples.count, by: 3).allSatisfy { (f: Int) -> Bool in
            let d1: Float = samples[f + 1] - samples[f], d2: Float = samples[f + 2] - samples[f]
            return abs(d1 - 0.3) < 1e-5 && abs(d2 - 0.6) < 1e-5
        }
        #expect(aligned)
        recorder.stop()
    }

    @Test func thePrerollAloneIsSavedAtOnceAndNamesNeverCollide() throws {
        let dir = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let saved = Mutex<[String]>([])
        let recorder = try ClipRecorder(configuration: .init(directory: dir, name: "h", prerollSeconds: 0.2),
                                        format: .default) { o in if case .saved(_, let n) = o { saved.withLock { $0.append(n) } } }
        try recorder.start()
        var next = 0
        Self.tap(recorder, from: &next, count: 44_100)
        usleep(80_000)
        let a = try recorder.open(clip: 1, prerollOnly: true)
        #expect(eventually(5) { saved.withLock { $0.count } == 1 })
        let b = try recorder.open(clip: 2, prerollOnly: true)
        #expect(eventually(5) { saved.withLock { $0.count } == 2 })
        #expect(a != b, "two clips in the same second get different names")
        #expect(try readWAV(dir + "/" + a).samples.count == 8_820)
        recorder.stop()
    }

    @Test func discardRemovesTheFileAndStopSavesAClipInProgress() throws {
        let clips = try Clips()
        defer { clips.remove() }
        let (dir, recorder) = (clips.directory, clips.recorder)
        var next = 0
        Self.tap(recorder, from: &next, count: 8_820)
        let gone = try recorder.open(clip: 1, prerollOnly: false)
        usleep(60_000)
        recorder.discard(clip: 1)
        #expect(eventually(5) { !FileManager.default.fileExists(atPath: dir + "/" + gone) })
        let kept = try recorder.open(clip: 2, prerollOnly: false)
        Self.tap(recorder, from: &next, count: 4_410)
        usleep(60_000)
        recorder.stop()
        #expect(clips.outcomes == [.discarded(clip: 1), .saved(clip: 2, name: kept)],
                "a discarded clip says so; stop saves the one in progress")
    }

    @Test func finishAndDiscardActOnlyOnTheClipTheyNameSoALateOneCannotTouchTheNextClip() throws {
        let dir = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let outcomes = Mutex<[ClipRecorder.Outcome]>([])
        let recorder = try ClipRecorder(configuration: .init(directory: dir, name: "h", prerollSeconds: 0.1, maximumSeconds: 0.05),
                                        format: .default) { o in outcomes.withLock { $0.append(o) } }
        try recorder.start()
        var next = 0
        Self.tap(recorder, from: &next, count: 8_820)
        usleep(60_000)
        // Clip 1 reaches its length (0.05 s) by itself, and is saved.
        let first = try recorder.open(clip: 1, prerollOnly: false)
        // Fed until it is saved: a tap that the clip thread drains before it opens the clip goes to the pre-roll.
        #expect(eventually(5) {
            Self.tap(recorder, from: &next, count: 441)
            return outcomes.withLock { $0 } == [.saved(clip: 1, name: first)]
        })
        // Its owner's cancel comes after that: the saved clip stays, and nothing more is reported.
        recorder.discard(clip: 1)
        let second = try recorder.open(clip: 2, prerollOnly: false)
        // A late finish or discard of clip 1 does not touch clip 2.
        recorder.finish(clip: 1)
        recorder.discard(clip: 1)
        usleep(100_000)
        #expect(outcomes.withLock { $0 } == [.saved(clip: 1, name: first)], "clip 2 is still being recorded")
        #expect(FileManager.default.fileExists(atPath: dir + "/" + first))
        recorder.discard(clip: 2)
        #expect(eventually(5) { outcomes.withLock { $0.count } == 2 })
        #expect(outcomes.withLock { $0 } == [.saved(clip: 1, name: first), .discarded(clip: 2)])
        #expect(!FileManager.default.fileExists(atPath: dir + "/" + second))
        recorder.stop()
    }

    @Test func aDirectoryThatCannotBeWrittenFailsWithTheReasonAndLeavesNothing() throws {
        #expect(throws: ClipError.self) {
            _ = try ClipRecorder(configuration: .init(directory: "/nonexistent/clips", name: "h"), format: .default) { _ in }
        }
        let dir = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let readOnly = try ReadOnlyDirectory(dir)
        defer { readOnly.undo() }
        let recorder = try ClipRecorder(configuration: .init(directory: dir, name: "h"), format: .default) { _ in }
        try recorder.start()
        defer { recorder.stop() }
        do {
            _ = try recorder.open(clip: 1, prerollOnly: false)
            Issue.record("a read-only directory took a clip")
        } catch {
            let text = "\(error)"
            #expect(text.contains("cannot write h-") && (text.contains("read-only file system") || text.contains("permission denied")), "\(text)")
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir).isEmpty)
    }

    @Test func clipsAreTheHostOwnersOnly() throws {
        let dir = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let saved = Mutex<String?>(nil)
        let recorder = try ClipRecorder(configuration: .init(directory: dir, name: "h", prerollSeconds: 0.1), format: .default) { o in
            if case .saved(_, let n) = o { saved.withLock { $0 = n } }
        }
        try recorder.start()
        defer { recorder.stop() }
        var next = 0
        Self.tap(recorder, from: &next, count: 4_410)
        usleep(60_000)
        let name = try recorder.open(clip: 1, prerollOnly: true)
        #expect(eventually(5) { saved.withLock { $0 } == name })
        let mode = try #require(try FileManager.default.attributesOfItem(atPath: dir + "/" + name)[.posixPermissions] as? Int)
        #expect(mode == 0o600, "what the microphone heard is readable by the host's owner only: mode \(String(mode, radix: 8))")
        #expect(try readWAV(dir + "/" + name).samples.count == 4_410, "the pre-roll, whole, through the descriptor made for it")
    }

    @Test func stopsFromManyThreadsAtOnceSaveTheClipOnce() throws {
        for round in 0..<20 {
            let clips = try Clips()
            defer { clips.remove() }
            let recorder = clips.recorder
            var next = 0
            Self.tap(recorder, from: &next, count: 4_410)
            let name = try recorder.open(clip: 1, prerollOnly: false)
            Self.tap(recorder, from: &next, count: 4_410)
            DispatchQueue.concurrentPerform(iterations: 8) { _ in recorder.stop() }
            #expect(clips.outcomes == [.saved(clip: 1, name: name)], "round \(round): saved once")
            #expect(try readWAV(clips.directory + "/" + name).samples.count == 8_820, "round \(round): the pre-roll and what followed")
        }
    }
}
