import Testing
import MeshAudio

/// The sink's render clock, in virtual time: a device with a 2-period buffer at 44.1 kHz, period 128 (2.902 ms).
@Suite("RenderSchedule: when a sink renders each block (pure)")
struct RenderScheduleTests {
    private static let period: UInt64 = 2_902_494   // 128 frames at 44.1 kHz, ns
    private static let slack: UInt64 = period - 1_000_000

    private func schedule(resync: Int = 32) -> RenderSchedule {
        var c = RenderSchedule.Configuration(periodFrames: 128, bufferFrames: 256, sampleRate: 44_100)
        c.resyncBlocks = resync
        return RenderSchedule(configuration: c)
    }

    @Test func theSlackIsTheQueueLeftAtRoomLessTheMargin() {
        #expect(schedule().slackNanos == Self.slack)
        var c = RenderSchedule.Configuration(periodFrames: 128, bufferFrames: 128, sampleRate: 44_100)
        c.marginNanos = 500_000
        #expect(RenderSchedule(configuration: c).slackNanos == 0, "a one-period buffer leaves no time to wait")
    }

    @Test func withoutAnInputEveryBlockIsRenderedAtRoomAsOfThen() {
        var s = schedule()
        #expect(s.next(nowNanos: 1_000, roomFrames: 256, hasInput: false, ready: true) == .render(asOfNanos: 1_000))
        s.rendered()
        #expect(s.next(nowNanos: 2_000, roomFrames: 128, hasInput: false, ready: true) == .render(asOfNanos: 2_000))
        s.rendered()
        #expect(s.next(nowNanos: 3_000, roomFrames: 0, hasInput: false, ready: true) == .wait(untilNanos: nil, forDevice: true))
    }

    @Test func aBlockWaitsForItsDataUntilTheDeadlineAndIsRenderedAsOfTheDeadline() {
        var s = schedule()
        let t0: UInt64 = 10_000_000
        // The device woke the loop: room is exact. The packet is not in: wait for it (the input alone) until the deadline.
        #expect(s.next(nowNanos: t0, roomFrames: 0, hasInput: true, ready: false) == .wait(untilNanos: nil, forDevice: true))
        #expect(s.next(nowNanos: t0, roomFrames: 128, hasInput: true, ready: false) == .wait(untilNanos: t0 + Self.slack, forDevice: false))
        // It arrives 150 µs later: render now, as of the deadline.
        #expect(s.next(nowNanos: t0 + 150_000, roomFrames: 128, hasInput: true, ready: true) == .render(asOfNanos: t0 + Self.slack))
        s.rendered()
        // No room now; the next packet is still to come: wait for the input alone, until the next block's deadline.
        let next = t0 + Self.period
        #expect(s.next(nowNanos: t0 + 200_000, roomFrames: 0, hasInput: true, ready: false) == .wait(untilNanos: next + Self.slack, forDevice: false))
        // The packet arrives after the room (the usual order): one wake-up, and the block is rendered at once, as of its
        // deadline on the predicted room.
        #expect(s.next(nowNanos: next + 120_000, roomFrames: 128, hasInput: true, ready: true) == .render(asOfNanos: next + Self.slack))
    }

    @Test func aPacketThatDoesNotComeIsConcealedAtTheDeadline() {
        var s = schedule()
        let t0: UInt64 = 10_000_000
        _ = s.next(nowNanos: t0, roomFrames: 0, hasInput: true, ready: false)
        #expect(s.next(nowNanos: t0, roomFrames: 128, hasInput: true, ready: false) == .wait(untilNanos: t0 + Self.slack, forDevice: false))
        #expect(s.next(nowNanos: t0 + Self.slack, roomFrames: 128, hasInput: true, ready: false) == .render(asOfNanos: t0 + Self.slack))
        s.rendered()
        // Woken late: still as of the deadline (the renderer's clock stays regular).
        let next = t0 + Self.period
        #expect(s.next(nowNanos: next + Self.slack + 300_000, roomFrames: 128, hasInput: true, ready: false) == .render(asOfNanos: next + Self.slack))
    }

    @Test func aPacketBeforeTheRoomWaitsForTheDeviceAndRoomSeenOnItsWakeIsExact() {
        var s = schedule()
        let t0: UInt64 = 10_000_000
        _ = s.next(nowNanos: t0, roomFrames: 0, hasInput: true, ready: false)
        _ = s.next(nowNanos: t0, roomFrames: 128, hasInput: true, ready: true)
        s.rendered()
        // The next packet is in before the device has room: wait for the device.
        #expect(s.next(nowNanos: t0 + 2_000_000, roomFrames: 0, hasInput: true, ready: true) == .wait(untilNanos: nil, forDevice: true))
        // The device wakes the loop 50 µs after the predicted room: that room is the exact one.
        let woke = t0 + Self.period + 50_000
        #expect(s.next(nowNanos: woke, roomFrames: 128, hasInput: true, ready: true) == .render(asOfNanos: woke + Self.slack))
    }

    @Test func aLateDeviceIsWaitedForAndTheRoomClockFollowsIt() {
        var s = schedule()
        let t0: UInt64 = 10_000_000
        _ = s.next(nowNanos: t0, roomFrames: 0, hasInput: true, ready: false)
        _ = s.next(nowNanos: t0, roomFrames: 128, hasInput: true, ready: true)
        s.rendered()
        let next = t0 + Self.period
        // The data came but the device has no room past the predicted deadline: wait for the device itself.
        #expect(s.next(nowNanos: next + Self.slack, roomFrames: 0, hasInput: true, ready: false) == .wait(untilNanos: nil, forDevice: true))
        let woke = next + 700_000
        #expect(s.next(nowNanos: woke, roomFrames: 128, hasInput: true, ready: true) == .render(asOfNanos: woke + Self.slack))
    }

    @Test func theRoomClockIsReanchoredOnADeviceWakeEveryResyncBlocks() {
        var s = schedule(resync: 4)
        var room: UInt64 = 10_000_000
        _ = s.next(nowNanos: room, roomFrames: 0, hasInput: true, ready: false)
        var waits: [RenderSchedule.Decision] = []
        for _ in 0..<6 {
            _ = s.next(nowNanos: room + 100_000, roomFrames: 128, hasInput: true, ready: true)
            s.rendered()
            waits.append(s.next(nowNanos: room + 200_000, roomFrames: 0, hasInput: true, ready: false))
            room += Self.period
        }
        // Blocks 1–3 wait for the input alone; after the 4th the loop waits for the device once, then for the input again.
        #expect(waits.map { if case .wait(_, let device) = $0 { device } else { false } } == [false, false, false, true, false, false])
    }

    @Test func roomForTwoBlocksRendersBothAtOnce() {
        var s = schedule()
        let t0: UInt64 = 10_000_000
        _ = s.next(nowNanos: t0, roomFrames: 0, hasInput: true, ready: false)
        _ = s.next(nowNanos: t0, roomFrames: 128, hasInput: true, ready: true)
        s.rendered()
        // The loop was held up for two periods: both blocks are past their deadlines.
        let late = t0 + 2 * Self.period + Self.slack + 1
        #expect(s.next(nowNanos: late, roomFrames: 256, hasInput: true, ready: false) == .render(asOfNanos: t0 + Self.period + Self.slack))
        s.rendered()
        #expect(s.next(nowNanos: late + 10_000, roomFrames: 128, hasInput: true, ready: false) == .render(asOfNanos: t0 + 2 * Self.period + Self.slack))
    }

    @Test func aRestartForgetsTheRoomClock() {
        var s = schedule()
        let t0: UInt64 = 10_000_000
        _ = s.next(nowNanos: t0, roomFrames: 0, hasInput: true, ready: false)
        _ = s.next(nowNanos: t0, roomFrames: 128, hasInput: true, ready: true)
        s.rendered()
        s.restart()
        #expect(s.next(nowNanos: t0 + 1_000, roomFrames: 0, hasInput: true, ready: false) == .wait(untilNanos: nil, forDevice: true),
                "no predicted room after a restart: the device shows it")
    }
}
