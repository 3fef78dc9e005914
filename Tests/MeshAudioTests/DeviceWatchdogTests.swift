import Testing
#if canImport(Glibc)
import Glibc
#endif
@testable import MeshAudio

/// The device loops' watchdog, in virtual time: when a silent device counts as stalled, and how long each wait may be.
@Suite("DeviceWatchdog: a device that stops moving (pure)")
struct DeviceWatchdogTests {
    private static let second: UInt64 = 1_000_000_000
    private static let start: UInt64 = 1_000 * second

    @Test("Silent for the limit is not a stall; a nanosecond more is")
    func stallsJustAfterTheLimit() {
        let watchdog = DeviceWatchdog(limitNanos: 4 * Self.second, nowNanos: Self.start)
        #expect(!watchdog.isStalled(nowNanos: Self.start))
        #expect(!watchdog.isStalled(nowNanos: Self.start + 4 * Self.second))
        #expect(watchdog.isStalled(nowNanos: Self.start + 4 * Self.second + 1))
        // A clock reading from before the last progress (another thread's stamp) is never a stall.
        #expect(!watchdog.isStalled(nowNanos: Self.start - Self.second))
    }

    @Test("Each period the device moves restarts the count; an older reading does not move it back")
    func progressRestartsTheCount() {
        var watchdog = DeviceWatchdog(limitNanos: 4 * Self.second, nowNanos: Self.start)
        // A device that moves every 2.9 ms for ten seconds never stalls.
        var now = Self.start
        for _ in 0..<3_446 {
            now += 2_902_494
            #expect(!watchdog.isStalled(nowNanos: now))
            watchdog.progressed(nowNanos: now)
        }
        watchdog.progressed(nowNanos: now - Self.second)
        #expect(!watchdog.isStalled(nowNanos: now + 4 * Self.second))
        #expect(watchdog.isStalled(nowNanos: now + 4 * Self.second + 1))
    }

    @Test("A wait ends at the wanted time, after one recheck at the most, and by the moment the device would stall")
    func waitsAreBounded() {
        var watchdog = DeviceWatchdog(limitNanos: 4 * Self.second, recheckNanos: 100_000_000, nowNanos: Self.start)
        let now = Self.start + 10_000_000
        #expect(watchdog.waitDeadline(nowNanos: now, wanted: now + 2_000_000) == now + 2_000_000)
        #expect(watchdog.waitDeadline(nowNanos: now, wanted: nil) == now + 100_000_000)
        #expect(watchdog.waitDeadline(nowNanos: now, wanted: now + Self.second) == now + 100_000_000)
        // 50 ms before the stall, the wait ends just past it, so that the loop sees the stall when it wakes.
        let late = Self.start + 4 * Self.second - 50_000_000
        #expect(watchdog.waitDeadline(nowNanos: late, wanted: nil) == Self.start + 4 * Self.second + 1)
        #expect(watchdog.isStalled(nowNanos: watchdog.waitDeadline(nowNanos: late, wanted: nil)))
        // Past the stall, a wait ends at once.
        let past = Self.start + 5 * Self.second
        #expect(watchdog.waitDeadline(nowNanos: past, wanted: nil) == past)
        watchdog.progressed(nowNanos: past)
        #expect(watchdog.waitDeadline(nowNanos: past, wanted: nil) == past + 100_000_000)
    }

    @Test("Waits in milliseconds round up and never reach zero (snd_pcm_wait's 0 would not wait at all)")
    func millisecondWaits() {
        let watchdog = DeviceWatchdog(limitNanos: 4 * Self.second, recheckNanos: 100_000_000, nowNanos: Self.start)
        #expect(watchdog.waitMilliseconds(nowNanos: Self.start) == 100)
        #expect(watchdog.waitMilliseconds(nowNanos: Self.start + 4 * Self.second - 1_500_000) == 2)
        #expect(watchdog.waitMilliseconds(nowNanos: Self.start + 4 * Self.second) == 1)
        #expect(watchdog.waitMilliseconds(nowNanos: Self.start + 9 * Self.second) == 1)
    }

    @Test("The limit is eight buffers, and at least the floor")
    func limitFromTheBuffer() {
        #expect(DeviceWatchdog.limit(bufferNanos: 5_804_988) == 4 * Self.second)
        #expect(DeviceWatchdog.limit(bufferNanos: Self.second) == 8 * Self.second)
        #expect(DeviceWatchdog.limit(bufferNanos: 100_000_000, floorNanos: 500_000_000) == 800_000_000)
    }

    @Test("A suspended device is resumed a try at a time: still waking, nap and go round; past the limit, a stall; no resume, start afresh")
    func suspendIsResumedWithoutLongWaits() {
        let limit = 4 * Self.second
        func step(_ code: Int32, after elapsed: UInt64) -> DeviceFault.ResumeStep {
            DeviceFault.resumeStep(code, suspendedSince: Self.start, nowNanos: Self.start + elapsed, limitNanos: limit)
        }
        #expect(step(0, after: 0) == .resumed)
        #expect(step(0, after: 10 * Self.second) == .resumed, "running again is running, however late")
        #expect(step(-EAGAIN, after: 0) == .napAndRetry)
        #expect(step(-EAGAIN, after: limit) == .napAndRetry)
        #expect(step(-EAGAIN, after: limit + 1) == .stalled)
        #expect(step(-ENOSYS, after: 0) == .prepare, "a driver without resume")
        #expect(step(-EBADFD, after: 0) == .prepare)
        // The nap is short: the loop sees stop() and its watchdog at least every 10 ms.
        #expect(DeviceFault.suspendNapNanos <= 10_000_000)
    }
}
