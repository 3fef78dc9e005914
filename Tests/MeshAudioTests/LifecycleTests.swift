import Testing
import Foundation
import Synchronization
@testable import MeshAudio
import MeshPOSIX
import MeshTestSupport

/// The OS names of this process's threads (`/proc/self/task/*/comm`).
func threadNames() -> [String] {
    let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
    return tasks.compactMap { try? String(contentsOfFile: "/proc/self/task/\($0)/comm", encoding: .utf8) }
        .map { $0.trimmingCharacters(in: .newlines) }
}

/// The calling thread's OS name.
func currentThreadName() -> String {
    ((try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)) ?? "").trimmingCharacters(in: .newlines)
}

/// Something a thread body can write and the test read.
final class Box<Value: Sendable>: Sendable {
    private let value: Mutex<Value>
    init(_ value: Value) { self.value = Mutex(value) }
    var current: Value { value.withLock { $0 } }
    func set(_ v: Value) { value.withLock { $0 = v } }
}

@Suite("Stage lifecycle and thread names")
struct LifecycleTests {
    @Test func startRunsTheBodyOnANamedThreadUntilStop() throws {
        let lifecycle = StageLifecycle(stage: "TestStage", threadName: "pm-test")
        let name = Box(""), laps = Box(0)
        #expect(!lifecycle.isRunning)
        try lifecycle.start {
            name.set(currentThreadName())
            while lifecycle.isRunning {
                laps.set(laps.current + 1)
                usleep(1_000)
            }
        }
        #expect(lifecycle.isRunning)
        try lifecycle.start { Issue.record("a second start while running must not start another thread") }
        usleep(20_000)
        #expect(lifecycle.stop())
        #expect(!lifecycle.isRunning)
        let after = laps.current
        usleep(5_000)
        #expect(laps.current == after, "the thread was joined")
        #expect(name.current == "pm-test")
        #expect(!lifecycle.stop(), "a second stop finds no thread")
        #expect(throws: AudioStageError.restartNotSupported(stage: "TestStage")) { try lifecycle.start {} }
    }

    @Test func stopWakesBeforeJoiningAndWorksBeforeStart() throws {
        let idle = StageLifecycle(stage: "Idle", threadName: "pm-idle")
        var woken = false
        #expect(!idle.stop { woken = true })
        #expect(woken)

        let lifecycle = StageLifecycle(stage: "Waiting", threadName: "pm-wait")
        let signal = WakeSignal()
        try lifecycle.start { signal.wait(untilNanos: MonotonicClock.nowNanos() + 10_000_000_000) }
        let before = MonotonicClock.nowNanos()
        #expect(lifecycle.stop { signal.signal() })
        #expect(MonotonicClock.nowNanos() - before < 5_000_000_000, "the waiting thread was woken, not waited out")
    }

    @Test func aSecondConcurrentStopReturnsOnlyOnceTheThreadHasEnded() throws {
        let lifecycle = StageLifecycle(stage: "Slow", threadName: "pm-slow", scheduling: .normal)
        let ended = Box(false)
        try lifecycle.start {
            while lifecycle.isRunning { usleep(1_000) }
            usleep(300_000)  // the thread's last period, a file close…
            ended.set(true)
        }
        let first = Thread { lifecycle.stop() }
        first.start()
        usleep(50_000)  // the first stop is joining now
        #expect(!lifecycle.stop(), "the first stop stopped the thread")
        #expect(ended.current, "the second stop returned while the thread was still running")
        while !ended.current { usleep(10_000) }
    }

    @Test func aStageMayStopItselfFromItsOwnThread() throws {
        let lifecycle = StageLifecycle(stage: "Quitting", threadName: "pm-quit", scheduling: .normal)
        let stoppedItself = Box(false)
        try lifecycle.start {
            lifecycle.stop()
            stoppedItself.set(true)
        }
        #expect(eventually(5) { stoppedItself.current }, "stop() on the stage's own thread returned")
        lifecycle.stop()
        #expect(!lifecycle.isRunning)
    }

    @Test func everyJoinerWaitsForTheThreadToEnd() throws {
        let ended = Box(false)
        let sawEnd = (0..<3).map { _ in Box(false) }
        let thread = try OSThread(name: "pm-joined", scheduling: .normal) {
            usleep(300_000)
            ended.set(true)
        }
        let joiners = sawEnd.map { saw in
            Thread {
                thread.join()
                saw.set(ended.current)
            }
        }
        joiners.forEach { $0.start() }
        thread.join()
        #expect(ended.current)
        #expect(eventually(5) { sawEnd.allSatisfy(\.current) }, "a joiner returned before the thread ended")
    }

    @Test func aWaitWithTheLatestDeadlineWaitsForTheSignal() {
        let signal = WakeSignal()
        DispatchQueue.global().asyncAfter(deadline: .now() + 0.1) { signal.signal() }
        #expect(signal.wait(untilNanos: .max))
    }

    @Test func aFailedPrepareLeavesTheStageIdle() throws {
        struct Refused: Error {}
        let lifecycle = StageLifecycle(stage: "Refusing", threadName: "pm-refuse")
        #expect(throws: Refused.self) { try lifecycle.start(prepare: { throw Refused() }, body: {}) }
        #expect(!lifecycle.isRunning && !lifecycle.isRealtime)
        try lifecycle.start {}
        lifecycle.stop()
    }

    @Test func normalSchedulingIsNeverRealtime() throws {
        let thread = try OSThread(name: "pm-normal", scheduling: .normal) {}
        thread.join()
        #expect(!thread.isRealtime)
    }

    @Test func threadNamesAreCutToFifteenBytes() throws {
        #expect(OSThread.osName("pm-capture") == "pm-capture")
        #expect(OSThread.osName("0123456789abcdefgh") == "0123456789abcde")
        #expect(OSThread.osName("pm-aéééééééé") == "pm-aééééé", "cut on a character boundary (14 bytes)")
        let seen = Box("")
        let thread = try OSThread(name: "0123456789abcdefgh", scheduling: .normal) { seen.set(currentThreadName()) }
        thread.join()
        #expect(thread.name == "0123456789abcde" && seen.current == "0123456789abcde")
    }

    @Test func fileStagesNameTheirThreads() throws {
        let tone = try ToneSource(frequency: 440, realtime: false)
        try tone.start()
        #expect(threadNames().contains("pm-source"))
        tone.stop()

        final class NameRecorder: AudioRenderer, Sendable {
            let name = Box("")
            func render(into buffer: UnsafeMutableBufferPointer<Float>, context: RenderContext) {
                if name.current.isEmpty { name.set(currentThreadName()) }
                buffer.update(repeating: 0)
            }
        }
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("pm-names-\(getpid()).wav").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        let sink = try WAVFileSink(path: path, realtime: false, maxFrames: 1024)
        let renderer = NameRecorder()
        try sink.start(renderer: renderer)
        #expect(sink.waitUntilFinished(timeoutNanos: 5_000_000_000))
        sink.stop()
        #expect(renderer.name.current == "pm-wavsink")
    }
}

/// The devices' thread names, on the JACK rig.
@Suite("Device thread names on the JACK rig", .serialized, .enabled(if: JackRig.isRunning, "needs MESH_JACK_RIG=1 (scripts/lib/jack-rig.sh)"))
struct DeviceThreadNameTests {
    @Test func recorderAndPlayerNameTheirThreads() throws {
        let recorder = try Recorder(device: "pm_cap", periodFrames: 128)
        try recorder.start()
        #expect(threadNames().contains("pm-capture"))
        recorder.stop()

        final class Silence: AudioRenderer, Sendable {
            func render(into buffer: UnsafeMutableBufferPointer<Float>, context: RenderContext) { buffer.update(repeating: 0) }
        }
        let player = try Player(device: "pm_play", periodFrames: 128)
        try player.start(renderer: Silence())
        #expect(threadNames().contains("pm-playback"))
        player.stop()
    }
}
