import Testing
import Foundation
import Synchronization
import MeshTestSupport
@testable import MeshAudio

/// Device errors that need no JACK server: they run everywhere.
@Suite("ALSA device errors")
struct DeviceErrorTests {
    @Test func missingCaptureDeviceSaysWhatToDo() {
        #expect {
            _ = try Recorder(device: "pm_no_such_device")
        } throws: { error in
            guard let error = error as? ALSAError else { return false }
            let text = error.description
            return error.kind == .deviceNotFound && text.contains("pm_no_such_device") && text.contains("arecord -L")
                && error.call == "snd_pcm_open" && !error.message.isEmpty
        }
    }

    @Test func missingPlaybackDeviceSaysWhatToDo() {
        #expect {
            _ = try Player(device: "pm_no_such_device")
        } throws: { error in
            guard let error = error as? ALSAError else { return false }
            return error.kind == .deviceNotFound && error.description.contains("pm_no_such_device")
                && error.description.contains("aplay -L")
        }
    }

    @Test func unsupportedFormatIsRefusedBeforeOpening() {
        #expect(throws: AudioFormatError.unsupportedChannels(9)) {
            _ = try Recorder(device: "pm_no_such_device", format: AudioFormat(sampleRate: 44_100, channels: 9))
        }
    }

    @Test func plugNamesWrapOnce() {
        #expect(PCMHandle.plugName(for: "pm_s16") == "plug:pm_s16")
        #expect(PCMHandle.plugName(for: "hw:0,0") == "plug:'hw:0,0'")
        #expect(PCMHandle.plugName(for: "plug:pm_s16") == nil)
        #expect(PCMHandle.plugName(for: "plughw:0") == nil)
    }
}

/// How many frames an overrun cost, from the capture clock: what the capture loop skips in the index after one.
@Suite("Capture overrun gap (pure)")
struct OverrunGapTests {
    private static let due: UInt64 = 1_000 * 1_000_000_000

    private static func lost(lateNanos: Int64, rate: UInt64 = 44_100, period: Int = 128) -> UInt64 {
        CaptureLoop.framesLost(timestampNanos: UInt64(Int64(due) + lateNanos), dueNanos: due, sampleRate: rate,
                               periodFrames: period)
    }

    @Test("A chunk on time, early, or late by less than half a period costs nothing: jitter never moves the index")
    func jitterIsNotAGap() {
        #expect(Self.lost(lateNanos: 0) == 0)
        #expect(Self.lost(lateNanos: -5_000_000) == 0, "never back")
        #expect(Self.lost(lateNanos: 1_000_000) == 0, "1 ms: 44 frames, under half of 128")
        #expect(Self.lost(lateNanos: 1_450_000) == 0, "64 frames is half a period, not more")
    }

    @Test("A stall costs its length rounded to frames")
    func stallsCostTheirLength() {
        #expect(Self.lost(lateNanos: 1_480_000) == 65)
        #expect(Self.lost(lateNanos: 12_000_000) == 529, "12 ms at 44.1 kHz is 529.2 frames")
        #expect(Self.lost(lateNanos: 300_000_000) == 13_230)
        #expect(Self.lost(lateNanos: 300_000_000, rate: 48_000, period: 480) == 14_400)
        #expect(Self.lost(lateNanos: 10_000_011_000) == 441_000, "10 s and 0.49 frames: rounded down")
        #expect(Self.lost(lateNanos: 10_000_011_338) == 441_001, "10 s and 0.50 frames: rounded up")
        // A day's stall does not overflow.
        #expect(Self.lost(lateNanos: 86_400 * 1_000_000_000, rate: 384_000) == 86_400 * 384_000)
    }
}

/// Real capture and playback through ALSA's jack plugin on the JACK dummy rig (scripts/lib/jack-rig.sh).
@Suite("ALSA devices on the JACK rig", .serialized, .enabled(if: JackRig.isRunning, "needs MESH_JACK_RIG=1 (scripts/lib/jack-rig.sh)"))
struct DeviceRigTests {
    @Test func captureDeliversTheKnownSignalExactlyAtRealTimePace() throws {
        let known = try JackRig.knownSignal()
        let recorder = try Recorder(device: "pm_knowncap", periodFrames: 128)
        #expect(!recorder.usesPlugConversion)
        try recorder.start()
        let capture = collect(recorder, frames: 44_100)
        recorder.stop()

        #expect(capture.samples.count >= 44_100)
        let n = min(capture.samples.count, 44_100)
        #expect(bits(capture.samples.prefix(n)) == bits(known.prefix(n)), "captured bytes equal known.raw")
        #expect(capture.isContiguous)
        #expect(capture.chunks.first?.firstFrameIndex == 0)
        #expect(capture.elapsedSeconds >= 0.7 && capture.elapsedSeconds <= 3, "1 s of audio took \(capture.elapsedSeconds) s")
        let stats = recorder.stats
        #expect(stats.xruns == 0)
        #expect(stats.overflowFrames == 0 && stats.overrunFrames == 0)
        #expect(stats.framesOut == UInt64(capture.samples.count))
        #expect(stats.framesIn >= stats.framesOut)
        #expect(recorder.failure == nil)
        // Timestamps track the frames: 1 s of frames spans about 1 s of monotonic time. The bound is generous: on a
        // loaded 2-core machine the JACK dummy server (synchronous mode) can stall for a period or two at start,
        // which shortens the span by that much (a CI run once saw 0.14 s); a broken clock would be off by whole
        // seconds or by the ratio of two rates.
        if let first = capture.chunks.first, let last = capture.chunks.last {
            let span = Double(last.timestampNanos - first.timestampNanos) / 1e9
            let frames = Double(last.firstFrameIndex - first.firstFrameIndex) / 44_100
            #expect(abs(span - frames) < 0.3, "timestamp span \(span) s for \(frames) s of frames")
        }
    }

    /// Push mode (what the relay uses): the capture thread itself hands every period to the consumer — the same
    /// bytes, in order, with no gap, on `pm-capture`, and no ring in between (nothing can overflow).
    @Test func pushModeHandsTheKnownSignalToTheConsumerOnTheCaptureThread() throws {
        final class Collector: CaptureConsumer {
            struct Taken { var samples: [Float] = []; var chunks: [ChunkInfo] = []; var threads: Set<String> = [] }
            let taken = Mutex(Taken())
            func consume(_ samples: UnsafeMutableBufferPointer<Float>, info: ChunkInfo, deviceDelayFrames: Int) {
                let comm = (try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)) ?? ""
                let thread = comm.trimmingCharacters(in: .newlines)
                taken.withLock {
                    $0.samples += samples
                    $0.chunks.append(info)
                    $0.threads.insert(thread)
                }
            }
        }
        let known = try JackRig.knownSignal()
        let recorder = try Recorder(device: "pm_knowncap", periodFrames: 128)
        let collector = Collector()
        try recorder.start(consumer: collector)
        let deadline = Date().addingTimeInterval(5)
        while collector.taken.withLock({ $0.samples.count }) < 22_050, Date() < deadline { usleep(10_000) }
        recorder.stop()
        let taken = collector.taken.withLock { $0 }
        #expect(taken.samples.count >= 22_050)
        let n = min(taken.samples.count, 22_050)
        #expect(bits(taken.samples.prefix(n)) == bits(known.prefix(n)), "the consumer got known.raw's bytes")
        #expect(taken.threads == ["pm-capture"])
        #expect(taken.chunks.first?.firstFrameIndex == 0)
        #expect(zip(taken.chunks, taken.chunks.dropFirst()).allSatisfy { $0.firstFrameIndex + UInt64($0.frames) == $1.firstFrameIndex })
        let stats = recorder.stats
        #expect(stats.framesOut == UInt64(taken.samples.count) && stats.overflowFrames == 0 && stats.xruns == 0)
        #expect(stats.overrunFrames == 0, "no overrun, no gap")
        // The ring is not used: a reader gets nothing.
        var buffer = [Float](repeating: 0, count: 128)
        #expect(buffer.withUnsafeMutableBufferPointer { recorder.read(into: $0, timeoutNanos: 1_000_000) } == nil)
    }

    /// A consumer late once by 300 ms makes the device overrun (its buffer holds 11.6 ms). The frames lost then leave
    /// a gap in `firstFrameIndex` as wide as the jump in the timestamps, so a receiver sees missing audio, not a
    /// timeline that slipped for good (measured before: index 0.30 s behind the clock, no gap).
    @Test func anOverrunLeavesAGapAsWideAsTheClockSays() throws {
        final class LateOnce: CaptureConsumer, @unchecked Sendable {  // `count` is touched only by the capture thread.
            let chunks = Mutex<[ChunkInfo]>([])
            private var count = 0
            func consume(_ samples: UnsafeMutableBufferPointer<Float>, info: ChunkInfo, deviceDelayFrames: Int) {
                count += 1
                if count == 100 { usleep(300_000) }
                chunks.withLock { $0.append(info) }
            }
        }
        let recorder = try Recorder(device: "pm_cap", periodFrames: 128)
        let consumer = LateOnce()
        try recorder.start(consumer: consumer)
        let deadline = Date().addingTimeInterval(5)
        while consumer.chunks.withLock({ $0.count }) < 400, Date() < deadline { usleep(10_000) }
        recorder.stop()
        let chunks = consumer.chunks.withLock { $0 }
        let stats = recorder.stats
        try #require(chunks.count >= 400 && stats.xruns >= 1, "\(chunks.count) chunks, \(stats.xruns) xruns")
        #expect(recorder.failure == nil)

        let gaps = zip(chunks, chunks.dropFirst()).map { Int64($1.firstFrameIndex) - Int64($0.firstFrameIndex) - Int64($0.frames) }
        #expect(gaps.allSatisfy { $0 >= 0 }, "the index never goes back")
        #expect(gaps.filter { $0 > 0 }.count <= Int(stats.xruns), "only an overrun leaves a gap")
        let skipped = gaps.reduce(0, +)
        #expect(UInt64(skipped) == stats.overrunFrames, "every frame skipped is counted")
        #expect(skipped > 8_820 && skipped < 22_050, "about the 300 ms the consumer was late: \(skipped) frames")
        // From chunk 20 on (the JACK dummy server may stall a period or two at start), index time tracks clock time.
        // Without the gap they part by the 0.3 s stall; jitter is a few milliseconds.
        let first = chunks[20], last = chunks[chunks.count - 1]
        let clock = Double(last.timestampNanos - first.timestampNanos) / 1e9
        let index = Double(last.firstFrameIndex - first.firstFrameIndex) / 44_100
        #expect(abs(clock - index) < 0.1, "clock span \(clock) s, index span \(index) s")
    }

    @Test func playedSignalComesBackSampleExact() throws {
        let signal = Array(try JackRig.knownSignal().prefix(22_050))  // 0.5 s, non-repeating
        // A period lost to the machine (an xrun on either side) breaks the loop's exactness: such a run is repeated.
        let (recorded, played, recorderStats) = try undisturbed("loopback") {
            // The capture side must exist before pm_loop_play connects to its port.
            let recorder = try Recorder(device: "pm_loop_cap", periodFrames: 128)
            try recorder.start()
            defer { recorder.stop() }
            let player = try Player(device: "pm_loop_play", periodFrames: 128)
            try player.start(renderer: SignalRenderer(signal))
            let capture = collect(recorder, frames: 66_150)  // 1.5 s
            player.stop()
            let (p, r) = (player.stats, recorder.stats)
            return ((capture.samples, p, r), p.xruns + r.xruns == 0 ? nil : "xruns: player \(p.xruns), recorder \(r.xruns)")
        }

        let head = bits(signal.prefix(4))
        let recordedBits = bits(recorded)
        let offset = (0..<(max(recordedBits.count - 4, 0))).first { Array(recordedBits[$0..<($0 + 4)]) == head }
        try #require(offset != nil, "the played signal's first samples never arrived")
        let start = offset!
        try #require(start + signal.count <= recorded.count, "recording too short to hold the signal after offset \(start)")
        #expect(Array(recordedBits[start..<(start + signal.count)]) == bits(signal), "sample-exact over the whole signal")
        #expect(recorded[..<start].allSatisfy { $0 == 0 }, "only silence before the signal")
        #expect(played.xruns == 0)
        #expect(played.framesOut >= UInt64(signal.count))
        #expect(recorderStats.xruns == 0)
    }

    @Test func playerRecoversFromAnUnderrunAndKeepsPlaying() throws {
        let player = try Player(device: "pm_play", periodFrames: 128)  // buffer 512 frames = 11.6 ms
        try player.start(renderer: StallingRenderer(stallOnPull: 40, stallNanos: 60_000_000))
        defer { player.stop() }
        let deadline = Date().addingTimeInterval(3)
        while player.stats.xruns == 0 && Date() < deadline { usleep(10_000) }
        let afterXrun = player.stats
        #expect(afterXrun.xruns >= 1)
        usleep(200_000)
        let later = player.stats
        #expect(later.framesOut > afterXrun.framesOut + 4_410, "kept playing: \(afterXrun.framesOut) → \(later.framesOut)")
        #expect(player.failure == nil)
    }

    @Test func slowConsumerOverflowIsCountedAndVisibleAsAGap() throws {
        let recorder = try Recorder(device: "pm_cap", periodFrames: 128, ringChunks: 4)
        try recorder.start()
        usleep(150_000)  // ~51 periods captured, only 4 fit
        var capture = collect(recorder, frames: 128 * 8)
        recorder.stop()
        // After stop, read returns what is still queued, then nil: drain it so every frame is accounted for.
        let rest = collect(recorder, frames: 1 << 20, timeoutSeconds: 1, stopAtNil: true)
        capture.chunks += rest.chunks
        let stats = recorder.stats
        #expect(stats.overflowFrames > 0)
        #expect(stats.framesIn == stats.framesOut + stats.overflowFrames, "every captured frame was read or counted as dropped")
        #expect(!capture.isContiguous, "dropped chunks leave a gap in firstFrameIndex")
    }

    @Test func floatlessPCMIsOpenedThroughPlug() throws {
        let known = try JackRig.knownSignal()
        let recorder = try Recorder(device: "pm_s16", periodFrames: 128)
        #expect(recorder.usesPlugConversion)
        #expect(recorder.deviceName == "plug:pm_s16")
        try recorder.start()
        let capture = collect(recorder, frames: 4_410)
        recorder.stop()
        try #require(capture.samples.count >= 4_410)
        // Through an integer format and back: equal within one 16-bit step (plug picks S32 here, closer still).
        let worst = zip(capture.samples.prefix(4_410), known).map { abs($0 - $1) }.max() ?? 1
        #expect(worst <= 1.0 / 32_768)

        let player = try Player(device: "pm_s16_play", periodFrames: 128)
        #expect(player.usesPlugConversion)
        try player.start(renderer: SignalRenderer(known))
        usleep(200_000)
        #expect(player.stats.framesOut > 0)
        player.stop()
    }

    @Test func stereo48kCaptureOpensThroughPlugAndDelivers() throws {
        let format = AudioFormat(sampleRate: 48_000, channels: 2)
        let recorder = try Recorder(device: "pm_knowncap", format: format, periodFrames: 128)
        #expect(recorder.usesPlugConversion, "the 44.1 kHz mono jack PCM cannot do 48 kHz stereo natively")
        try recorder.start()
        let capture = collect(recorder, frames: 24_000)  // 0.5 s
        recorder.stop()
        #expect(capture.samples.count >= 48_000)
        #expect(capture.isContiguous)
        #expect(capture.elapsedSeconds >= 0.3 && capture.elapsedSeconds <= 2, "0.5 s took \(capture.elapsedSeconds) s")
        var identical = true
        var energy: Double = 0
        for frame in 0..<(capture.samples.count / 2) {
            if capture.samples[2 * frame] != capture.samples[2 * frame + 1] { identical = false }
            energy += Double(capture.samples[2 * frame] * capture.samples[2 * frame])
        }
        #expect(identical, "mono upmixed to two equal channels")
        let rms = (energy / Double(capture.samples.count / 2)).squareRoot()
        #expect(rms > 0.2 && rms < 0.4, "the resampled known signal (uniform in ±0.5, rms 0.29) came through: \(rms)")
    }

    @Test func stereo48kPlaybackOpensThroughPlugAndPlays() throws {
        let format = AudioFormat(sampleRate: 48_000, channels: 2)
        let player = try Player(device: "pm_play", format: format, periodFrames: 128)
        #expect(player.usesPlugConversion)
        try player.start(renderer: StallingRenderer(stallOnPull: -1, stallNanos: 0))
        usleep(300_000)
        player.stop()
        let stats = player.stats
        #expect(stats.framesOut > 9_600, "0.3 s at 48 kHz is 14 400 frames; got \(stats.framesOut)")
        #expect(stats.framesOut < 48_000)
        #expect(stats.xruns == 0)
    }
}
