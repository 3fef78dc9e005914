import Testing
import MeshAudio
import MeshTestSupport
@testable import MeshPipeline

/// The jitter buffer's pure parts, each alone.
@Suite("Jitter buffer parts")
struct JitterBufferPartsTests {
    // MARK: FrameStore

    @Test func frameStoreStoresTakesAndForgets() {
        var store = FrameStore(channels: 2, capacityFrames: 8)
        store.restart(at: 100)
        let samples: [Float] = [1, -1, 2, -2, 3, -3]
        samples.withUnsafeBufferPointer { store.store($0, first: 100, count: 3) }
        #expect(store.holdsAll(first: 100, count: 3) && !store.holdsAll(first: 100, count: 4))
        var out = [Float](repeating: 9, count: 4)
        out.withUnsafeMutableBufferPointer { o in
            let first = store.take(101, into: o, frame: 1)
            let again = store.take(101, into: o, frame: 0)
            #expect(first)
            #expect(!again, "a taken frame is forgotten")
        }
        #expect(out == [9, 9, 2, -2])
        store.drop(first: 100, count: 1)
        #expect(!store.holdsAll(first: 100, count: 1) && store.holdsAll(first: 102, count: 1))
        store.clear()
        #expect(!store.holdsAll(first: 102, count: 1))
    }

    @Test func frameStoreSlotsStayContinuousAcrossTheIndexWrap() {
        var store = FrameStore(channels: 1, capacityFrames: 5)
        let start = UInt64.max - 2
        store.restart(at: start)
        let values: [Float] = [0, 1, 2, 3, 4]
        values.withUnsafeBufferPointer { store.store($0, first: start, count: 5) }   // frames max-2 … 1
        #expect(store.holdsAll(first: start, count: 5) && store.streamStart == start)
        var out = [Float](repeating: -1, count: 5)
        out.withUnsafeMutableBufferPointer { o in
            for i in 0..<5 {
                let present = store.take(start &+ UInt64(i), into: o, frame: i)
                #expect(present)
            }
        }
        #expect(out == values)
    }

    // MARK: LossTracker

    @Test func lossTrackerCountsGapsAndForgivesLatePackets() {
        var losses = LossTracker()
        #expect(losses.lostPackets == 0)
        losses.startStream(at: 10)
        for s: UInt32 in [11, 13, 14] {
            let new = losses.noteSequence(s)
            #expect(new)
            losses.countReceived()
        }
        #expect(losses.lostPackets == 1)
        #expect(losses.distance(to: 12) == -2)
        let late = losses.noteSequence(12)
        #expect(late, "late, but new")
        losses.countReceived()
        #expect(losses.lostPackets == 0)
        let duplicate = losses.noteSequence(13)
        #expect(!duplicate, "a duplicate is not new")
    }

    @Test func lossTrackerKeepsTheLossesOfClosedStreams() {
        var losses = LossTracker()
        losses.startStream(at: 0)
        _ = losses.noteSequence(5)
        losses.countReceived()
        #expect(losses.lostPackets == 4)
        losses.closeStream()
        #expect(losses.lostPackets == 4)
        losses.startStream(at: 1000)
        _ = losses.noteSequence(1002)
        losses.countReceived()
        #expect(losses.lostPackets == 5)
    }

    @Test func lossTrackerSequenceNumbersWrap() {
        var losses = LossTracker()
        losses.startStream(at: UInt32.max - 1)
        for s: UInt32 in [UInt32.max, 0, 1] {
            #expect(losses.distance(to: s) == 1)
            let new = losses.noteSequence(s)
            #expect(new)
            losses.countReceived()
        }
        #expect(losses.lostPackets == 0)
        // Too old to tell: never marked, never a duplicate.
        let tooOld = losses.noteSequence(1 &- 1500), stillTooOld = losses.noteSequence(1 &- 1500)
        #expect(tooOld && stillTooOld)
    }

    /// Counts `sequences` received, in the order given.
    private static func receive(_ sequences: [UInt32], into losses: inout LossTracker) {
        for s in sequences where losses.noteSequence(s) { losses.countReceived() }
    }

    @Test func oneWildSequenceNumberCountsNothingLostAndTheStreamCountsOn() {
        var losses = LossTracker()
        losses.startStream(at: 0)
        Self.receive(Array(1..<100), into: &losses)
        // Packet 100 numbered a million ahead, its frames in place (a host's bug, or a lie): received, on probation.
        Self.receive([1_000_100], into: &losses)
        Self.receive(Array(101..<200), into: &losses)
        #expect(losses.lostPackets == 0, "every packet came; one lied about its number")
        #expect(losses.expectedPackets == 200)
        // Duplicates are still told apart after it, and a real gap still counts.
        let duplicate = losses.noteSequence(150)
        #expect(!duplicate)
        Self.receive([201], into: &losses)
        #expect(losses.lostPackets == 1)
        // And it stays right after the stream closes.
        losses.closeStream()
        #expect(losses.lostPackets == 1 && losses.expectedPackets == 202)
    }

    @Test func aLongGapThatTheNextPacketConfirmsIsCountedLost() {
        var losses = LossTracker()
        losses.startStream(at: 0)
        Self.receive(Array(1..<10), into: &losses)
        let jump = UInt32(10 + LossTracker.maximumDropout + 500)
        Self.receive([jump], into: &losses)
        #expect(losses.lostPackets == 0, "not believed yet")
        Self.receive([jump + 1, jump + 2], into: &losses)
        #expect(losses.lostPackets == UInt64(jump) - 10, "every packet between 9 and the jump")
        #expect(losses.expectedPackets == UInt64(jump) + 3)
        // A jump within the dropout is taken at once.
        var near = LossTracker()
        near.startStream(at: 0)
        Self.receive([UInt32(LossTracker.maximumDropout)], into: &near)
        #expect(near.lostPackets == UInt64(LossTracker.maximumDropout) - 1)
    }

    // MARK: LargestValues

    @Test("LargestValues gives a sort's answer for any order of the values, any number kept, and forgets a pass at the next")
    func largestValuesMatchASort() {
        var rng = SeededRandom(seed: 0x1a2b)
        let n = 4096
        let random = (0..<n).map { _ in Double(rng.next() % 1_000_000) }
        let orders: [(String, [Double])] = [
            ("random", random),
            ("ascending", random.sorted()),
            ("descending", random.sorted(by: >)),
            ("all equal", Array(repeating: 7, count: n)),
            ("sawtooth", (0..<n).map { Double($0 % 97) }),
            ("few", [3, -1, 2]),
        ]
        var largest = LargestValues(capacity: 13)
        for (name, values) in orders {
            let sorted = values.sorted(by: >)
            for count in [1, 2, 13] {
                largest.start(keeping: count)
                for v in values { largest.offer(v) }
                #expect(largest.smallest == sorted[min(count, values.count) - 1], "\(name), keeping \(count)")
            }
        }
        largest.start(keeping: 1)
        #expect(largest.smallest == -.infinity, "nothing offered")
        largest.offer(-5)
        #expect(largest.smallest == -5, "a new pass forgets the last one's values")
    }

    // MARK: JitterEstimator

    @Test func jitterEstimatorSeesNoJitterInSteadyTransits() {
        var e = JitterEstimator(windowSeconds: 2)
        for k in 0..<100 { e.note(transitNanos: 1_000_000, arrivalNanos: UInt64(k) * 2_902_494 + 1) }
        #expect(e.interarrivalJitterNanos == 0 && e.deviationNanos == 0)
    }

    @Test func jitterEstimatorFollowsTransitDifferences() {
        var e = JitterEstimator(windowSeconds: 2)
        for k in 0..<400 { e.note(transitNanos: k % 2 == 0 ? 0 : 1_000_000, arrivalNanos: UInt64(k + 1) * 3_000_000) }
        #expect(abs(e.interarrivalJitterNanos - 1_000_000) < 1_000, "RFC 3550 converges to |D|")
        #expect(e.deviationNanos == 1_000_000)
        e.restart()
        e.note(transitNanos: 5_000_000, arrivalNanos: 2_000_000_000)
        #expect(e.deviationNanos == 0, "a new stream's window holds only its own packets")
        #expect(abs(e.interarrivalJitterNanos - 1_000_000) < 1_000, "no difference across streams")
    }

    @Test func jitterEstimatorIgnoresARareOutlierUnlessTheDelayStepped() {
        var e = JitterEstimator(windowSeconds: 2)
        for k in 0..<1000 { e.note(transitNanos: k == 500 ? 10_000_000 : 0, arrivalNanos: UInt64(k + 1) * 1_000_000) }
        #expect(e.deviationNanos == 0, "one packet in a thousand is an outlier")
        e.coverWholeWindow(nowNanos: 1_000_000_000)
        #expect(e.deviationNanos == 10_000_000)
    }

    // MARK: StallFilter

    static let ms: UInt64 = 1_000_000

    @Test func aShortBurstSecondsAfterTheLastIsARareStall() {
        var f = StallFilter(spacingSeconds: 2.5)
        #expect(f.classify(offsetNanos: 0, arrivalNanos: 1_000 * Self.ms) == .ordinary, "the stream starts")
        #expect(f.classify(offsetNanos: 5e6, arrivalNanos: 2_000 * Self.ms) == .ordinary, "too early in the stream")
        #expect(f.classify(offsetNanos: 0.5e6, arrivalNanos: 5_000 * Self.ms) == .ordinary, "within the margin")
        #expect(f.classify(offsetNanos: 5e6, arrivalNanos: 2_001 * Self.ms) == .ordinary, "a burst, too early")
        // 3 s calm since that burst: four held-back packets arriving together are held (the first alone is an
        // outlier until the second confirms the burst).
        let verdicts = (0..<4).map { k in
            f.classify(offsetNanos: 11e6 - Double(k) * 2.9e6, arrivalNanos: (5_000 + UInt64(k)) * Self.ms)
        }
        #expect(verdicts == [.ordinary, .holdWithLone, .hold, .hold])
        #expect(f.classify(offsetNanos: 0, arrivalNanos: 5_010 * Self.ms) == .ordinary, "on time again")
        #expect(f.classify(offsetNanos: 0, arrivalNanos: 5_040 * Self.ms) == .ordinary)
        #expect(f.stalls == 1 && f.steps == 0)
        // A lone outlier does not count as a burst; a burst one second later is too soon: jitter, counted.
        #expect(f.classify(offsetNanos: 4e6, arrivalNanos: 5_500 * Self.ms) == .ordinary)
        #expect(f.classify(offsetNanos: 4e6, arrivalNanos: 6_000 * Self.ms) == .ordinary)
        #expect(f.classify(offsetNanos: 4e6, arrivalNanos: 6_001 * Self.ms) == .ordinary)
        // 2.5 s after that: held again.
        #expect(f.classify(offsetNanos: 4e6, arrivalNanos: 8_600 * Self.ms) == .ordinary)
        #expect(f.classify(offsetNanos: 4e6, arrivalNanos: 8_601 * Self.ms) == .holdWithLone)
        #expect(f.stalls == 2)
    }

    @Test func aBurstThatStaysOffTheSameWayIsATimelineStep() {
        var f = StallFilter(spacingSeconds: 2.5)
        _ = f.classify(offsetNanos: 0, arrivalNanos: Self.ms)
        var verdicts: [StallFilter.Verdict] = []
        for k in 0..<40 { verdicts.append(f.classify(offsetNanos: 5e6, arrivalNanos: (3_000 + UInt64(k) * 3) * Self.ms)) }
        // 3 ms apart: packets 1…16 are within 50 ms of the burst's start and held; the 18th rebases the window.
        #expect(verdicts[0] == .ordinary && verdicts[1] == .holdWithLone)
        #expect(verdicts[2...16].allSatisfy { $0 == .hold })
        #expect(verdicts[17] == .rebase)
        #expect(f.stalls == 0 && f.steps == 1)
        // A step down (transits below the least), seconds later: the same.
        var down: [StallFilter.Verdict] = []
        for k in 0..<20 { down.append(f.classify(offsetNanos: -3e6, arrivalNanos: (6_000 + UInt64(k) * 3) * Self.ms)) }
        #expect(down[1] == .holdWithLone && down[2...16].allSatisfy { $0 == .hold } && down[17] == .rebase)
        #expect(f.steps == 2)
    }

    @Test func aHeldBurstThatGoesUpAndDownIsJitter() {
        var f = StallFilter(spacingSeconds: 2.5)
        _ = f.classify(offsetNanos: 0, arrivalNanos: Self.ms)
        var verdicts: [StallFilter.Verdict] = []
        for k in 0..<40 {
            verdicts.append(f.classify(offsetNanos: k % 2 == 0 ? 5e6 : 0, arrivalNanos: (3_000 + UInt64(k) * 3) * Self.ms))
        }
        #expect(!verdicts.contains(.rebase))
        #expect(verdicts.suffix(10).allSatisfy { $0 == .ordinary }, "past 50 ms it counts in full")
        var off = StallFilter(spacingSeconds: 0)
        _ = off.classify(offsetNanos: 0, arrivalNanos: Self.ms)
        #expect(off.classify(offsetNanos: 5e6, arrivalNanos: 10_000 * Self.ms) == .ordinary, "0 turns the filter off")
        off.restart()
        #expect(off.stalls == 0)
    }

    @Test func theEstimateHoldsARareStallAtTheCoveredDeviation() {
        var e = JitterEstimator(windowSeconds: 2, stallSpacingSeconds: 2.5)
        var arrival: UInt64 = 0
        func steady(_ n: Int) {
            for k in 0..<n {
                arrival += 2_902_494
                e.note(transitNanos: Double(k % 2) * 100_000, arrivalNanos: arrival)   // 0.1 ms of jitter
            }
        }
        steady(1400)   // 4 s
        #expect(e.deviationNanos == 100_000)
        // A 10 ms capture stall: four packets held back arrive together.
        for k in 0..<4 {
            e.note(transitNanos: 10_000_000 - Double(k) * 2_902_494, arrivalNanos: arrival + 10_000_000 + UInt64(k) * 20_000)
        }
        #expect(e.deviationNanos == 100_000, "a rare stall does not raise the deviation")
        e.coverWholeWindow(nowNanos: arrival + 10_100_000)
        #expect(e.deviationNanos == 100_000, "nor does a late run's whole-window cover")
        #expect(e.rareStalls == 1)
        arrival += 11_000_000
        steady(340)    // a second later the same stall is jitter
        for k in 0..<4 {
            e.note(transitNanos: 10_000_000 - Double(k) * 2_902_494, arrivalNanos: arrival + 10_000_000 + UInt64(k) * 20_000)
        }
        #expect(e.deviationNanos > 4_000_000, "a second burst within 2.5 s raises it at once (all but 2 outliers)")
        e.coverWholeWindow(nowNanos: arrival + 10_100_000)
        #expect(e.deviationNanos == 10_000_000, "and a late run covers all of it")
        #expect(e.rareStalls == 1)
    }

    @Test func theEstimateStartsOverAfterATimelineStep() {
        var e = JitterEstimator(windowSeconds: 2, stallSpacingSeconds: 2.5)
        var arrival: UInt64 = 0
        var deviations: [Double] = []
        for k in 0..<3000 {   // 8.7 s; the host's timeline steps 35 ms later at 4 s
            arrival += 2_902_494
            let step: Double = k >= 1400 ? 35_000_000 : 0
            e.note(transitNanos: step + Double(k % 2) * 100_000, arrivalNanos: arrival)
            if k >= 100 { deviations.append(e.deviationNanos) }
        }
        #expect(deviations.allSatisfy { $0 <= 100_000 }, "never covers the step: max \(deviations.max()!)")
        #expect(e.timelineSteps == 1 && e.rareStalls == 0)
    }

    /// Feeds 2,000 packets 128 frames apart (2.9 ms) whose transit is `transit(index, arrival)`; returns the last
    /// arrival.
    @discardableResult
    func feedPacketStream(_ e: inout JitterEstimator, transit: (Int, UInt64) -> Double) -> UInt64 {
        var arrival: UInt64 = 0
        for k in 0..<2000 {
            arrival += 2_902_494
            e.note(transitNanos: transit(k, arrival), arrivalNanos: arrival)
        }
        return arrival
    }

    @Test func aDeviceClockThatRunsSlowIsNoJitter() {
        // One JACK graph 2000 ppm slow against the monotonic clock: the sender's transits creep 2 ms a second while
        // the playout follows them exactly.
        var e = JitterEstimator(windowSeconds: 2)
        e.deviceClockPPM = 2000
        let arrival = feedPacketStream(&e) { k, arrival in Double(arrival) * 0.002 + Double(k % 2) * 100_000 }
        #expect(abs(e.deviationNanos - 100_000) < 1_000, "the 0.1 ms of jitter, not the 4 ms of creep: \(e.deviationNanos)")
        e.deviceClockPPM = 0
        e.coverWholeWindow(nowNanos: arrival)
        #expect(e.deviationNanos > 3_900_000, "measured on the monotonic clock, the creep would be covered")
    }

    @Test func aDeviceClockFigureThatExplainsNoCreepAddsNoJitter() {
        // Seen on the JACK rig (one start in about twenty): 3.3 s into a stream the deviation rose from 0.2 to 2.9 ms
        // with no packet off, then faded as 1/t — the clock meter's first figure, read over a device stall, taken
        // out of transits that do not creep. The target stayed up while it faded.
        var e = JitterEstimator(windowSeconds: 2)
        e.deviceClockPPM = 1500
        feedPacketStream(&e) { k, _ in 5_000_000 + Double(k % 2) * 100_000 }
        #expect(abs(e.deviationNanos - 100_000) < 1_000, "the 0.1 ms of jitter, not 3 ms of slope: \(e.deviationNanos)")
    }

    @Test func theDeviceClockMeterMeasuresPullsAgainstTheClock() {
        var m = DeviceClockMeter(rate: 44_100)
        var now: UInt64 = 5_000_000_000
        var jitter = RelayRNG(seed: 7)
        for k in 0..<(344 * 60) {   // a minute of 128-frame pulls from a device 1500 ppm slow, ±1 ms late
            let ideal = Double(k) * 128 / 44_100 * 1e9 * (1 + 1500e-6)
            now = 5_000_000_000 + UInt64(ideal) + jitter.next() % 1_000_000
            m.notePull(frames: 128, nowNanos: now)
            if k == 344 * 2 { #expect(m.ppm == 0, "nothing before 1 s of settling and 3 s of span") }
        }
        #expect(abs(m.ppm - 1500) < 40, "measured \(m.ppm)")
    }

    @Test func jitterEstimatorForgetsTransitsOlderThanTheWindow() {
        var e = JitterEstimator(windowSeconds: 0.5)
        e.note(transitNanos: 5_000_000, arrivalNanos: 1_000_000)
        for k in 0..<10 { e.note(transitNanos: 0, arrivalNanos: 1_000_000_000 + UInt64(k) * 30_000_000) }
        #expect(e.deviationNanos == 0)
    }

    // MARK: LatencyTarget

    @Test func lowAndFixedTargets() {
        var low = LatencyTarget(configuration: .init(mode: .low), rate: 44_100)
        low.update(nowNanos: 1, structuralFrames: 256, deviationNanos: 5e6, maximumFrames: 1e6)
        #expect(abs(low.frames - (256 + 22.05)) < 1e-9, "block + packet + 0.5 ms, whatever the jitter")
        var fixed = LatencyTarget(configuration: .init(mode: .fixed(milliseconds: 10)), rate: 44_100)
        fixed.update(nowNanos: 1, structuralFrames: 256, deviationNanos: 0, maximumFrames: 1e6)
        #expect(abs(fixed.frames - 441) < 1e-9)
        fixed.update(nowNanos: 2, structuralFrames: 600, deviationNanos: 0, maximumFrames: 1e6)
        #expect(fixed.frames == 600, "never below the structure")
    }

    @Test func autoTargetRisesAtOnceDecaysInSecondsAndIsBounded() {
        var target = LatencyTarget(configuration: .init(mode: .auto), rate: 44_100)   // decays over 5 s
        target.update(nowNanos: 1_000_000_000, structuralFrames: 256, deviationNanos: 0, maximumFrames: 1e6)
        #expect(abs(target.frames - 278.05) < 1e-9)
        target.update(nowNanos: 1_100_000_000, structuralFrames: 256, deviationNanos: 10_000_000, maximumFrames: 1e6)
        #expect(abs(target.frames - 719.05) < 1e-9)
        target.update(nowNanos: 2_100_000_000, structuralFrames: 256, deviationNanos: 0, maximumFrames: 1e6)
        #expect(abs(target.frames - (719.05 - 441 / 5)) < 1e-9, "a fifth of the way down after a second")
        target.update(nowNanos: 2_200_000_000, structuralFrames: 256, deviationNanos: 1e9, maximumFrames: 1000)
        #expect(target.frames == 1000)
    }

    @Test func inAStreamsFirstFiveSecondsTheTargetDecaysWithinASecond() {
        var target = LatencyTarget(configuration: .init(mode: .auto), rate: 44_100)
        target.streamStarted(atNanos: 1_000_000_000)
        target.update(nowNanos: 1_000_000_000, structuralFrames: 256, deviationNanos: 10_000_000, maximumFrames: 1e6)
        #expect(abs(target.frames - 719.05) < 1e-9, "a start-up burst raises it at once")
        target.update(nowNanos: 1_500_000_000, structuralFrames: 256, deviationNanos: 0, maximumFrames: 1e6)
        #expect(abs(target.frames - (719.05 - 441 / 2)) < 1e-9, "half the way down after half a second")
        // From 5 s into the stream on, the configured 5 s time constant.
        target.update(nowNanos: 6_000_000_000, structuralFrames: 256, deviationNanos: 10_000_000, maximumFrames: 1e6)
        target.update(nowNanos: 7_000_000_000, structuralFrames: 256, deviationNanos: 0, maximumFrames: 1e6)
        #expect(abs(target.frames - (719.05 - 441 / 5)) < 1e-9)
        // A new stream starts the fast window again.
        target.streamStarted(atNanos: 8_000_000_000)
        target.update(nowNanos: 8_500_000_000, structuralFrames: 256, deviationNanos: 0, maximumFrames: 1e6)
        let bound: Double = 719.05 - 441 / 5 - 100
        #expect(target.frames < bound)
    }

    @Test func aRiseInTheStartUpKeepsTheFastDecayAfterItUntilItIsGone() {
        // A start-up stall near the end of the first five seconds: the jitter window holds it for two more, so the
        // target starts down only after the start-up window. It still comes down within seconds.
        var target = LatencyTarget(configuration: .init(mode: .auto), rate: 44_100)
        target.streamStarted(atNanos: 1_000_000_000)
        target.update(nowNanos: 4_900_000_000, structuralFrames: 256, deviationNanos: 100_000_000, maximumFrames: 1e6)
        #expect(abs(target.frames - (278.05 + 4410)) < 1e-6)
        target.update(nowNanos: 7_000_000_000, structuralFrames: 256, deviationNanos: 100_000_000, maximumFrames: 1e6)
        target.update(nowNanos: 7_500_000_000, structuralFrames: 256, deviationNanos: 0, maximumFrames: 1e6)
        #expect(abs(target.frames - (278.05 + 4410 / 2)) < 1e-6, "half the excess gone in half a second")
        var t: UInt64 = 7_500_000_000
        while t < 12_000_000_000 {
            t += 10_000_000
            target.update(nowNanos: t, structuralFrames: 256, deviationNanos: 0, maximumFrames: 1e6)
        }
        // τ = 1 s: e^-4.5 of the excess (2,205 frames) is left, 24 frames; at the configured 5 s it would be 900.
        #expect(target.frames - 278.05 < 30, "gone within seconds: \(target.frames)")
        // A rise after the start-up decays at the configured pace.
        target.update(nowNanos: 20_000_000_000, structuralFrames: 256, deviationNanos: 10_000_000, maximumFrames: 1e6)
        target.update(nowNanos: 21_000_000_000, structuralFrames: 256, deviationNanos: 0, maximumFrames: 1e6)
        #expect(abs(target.frames - (719.05 - 441 / 5)) < 1e-6)
    }

    // MARK: LatencyCorrector

    static let block = 128, packet = 128

    func decide(_ c: inout LatencyCorrector, _ error: Double, at nanos: UInt64, target: Double = 300)
        -> LatencyCorrector.Correction
    {
        c.decide(errorFrames: error, targetFrames: target, frames: Self.block, blockFrames: Self.block,
                 packetFrames: Self.packet, nowNanos: nanos)
    }

    @Test func farTooLittleLatencyStretchesAtOnce() {
        var c = LatencyCorrector(rate: 44_100)
        #expect(decide(&c, -200, at: 1) == .stretchBlock)
        #expect(decide(&c, -100, at: 2) == .play, "within the block: evidence first")
    }

    @Test func aLastingSmallDeficitHoldsOnceForTheMissingFrames() {
        var c = LatencyCorrector(rate: 44_100)
        let t0: UInt64 = 1_000_000_000
        #expect(decide(&c, -30.2, at: t0) == .play)
        #expect(decide(&c, -30.2, at: t0 + 200_000_000) == .play)
        #expect(decide(&c, -30.2, at: t0 + 250_000_000) == .hold(frames: 31))
        #expect(decide(&c, -30.2, at: t0 + 260_000_000) == .play, "the evidence starts over")
    }

    @Test func aDeficitThatRecoversIsForgotten() {
        var c = LatencyCorrector(rate: 44_100)
        let t0: UInt64 = 1_000_000_000
        #expect(decide(&c, -30, at: t0) == .play)
        #expect(decide(&c, 0, at: t0 + 100_000_000) == .play)
        #expect(decide(&c, -30, at: t0 + 300_000_000) == .play)
        #expect(decide(&c, -30, at: t0 + 500_000_000) == .play)
        #expect(decide(&c, -30, at: t0 + 550_000_000) == .hold(frames: 30))
    }

    @Test func aLastingExcessSkipsTheLeastExcessSeen() {
        var c = LatencyCorrector(rate: 44_100)   // threshold: block + packet = 256 frames
        let t0: UInt64 = 1_000_000_000
        #expect(decide(&c, 400, at: t0) == .play)
        #expect(decide(&c, 300.7, at: t0 + 200_000_000) == .play)
        #expect(decide(&c, 350, at: t0 + 500_000_000) == .skip(frames: 300))
        #expect(decide(&c, 350, at: t0 + 600_000_000) == .play)
    }

    @Test func anExcessThatDipsOrARestartIsForgotten() {
        var c = LatencyCorrector(rate: 44_100)
        let t0: UInt64 = 1_000_000_000
        #expect(decide(&c, 400, at: t0) == .play)
        #expect(decide(&c, 20, at: t0 + 300_000_000) == .play, "within 0.5 ms of the target")
        #expect(decide(&c, 400, at: t0 + 400_000_000) == .play)
        #expect(decide(&c, 400, at: t0 + 800_000_000) == .play)
        c.restart(atNanos: t0 + 850_000_000)
        #expect(decide(&c, 400, at: t0 + 900_000_000) == .play)
        #expect(decide(&c, 400, at: t0 + 1_400_000_000) == .skip(frames: 400))
    }

    @Test func aLastingSmallExcessGivesBackWhatStretchesAdded() {
        // 0.5 ms (22 frames) < excess < the large threshold (256 frames): what a stretch leaves once the target has
        // decayed again. Without the drift loop engaged nothing else would take it away.
        var c = LatencyCorrector(rate: 44_100)
        let t0: UInt64 = 1_000_000_000
        #expect(decide(&c, 120, at: t0) == .play)
        #expect(decide(&c, 120, at: t0 + 2_000_000_000) == .play, "no stretch before: a drifting clock's, not ours")
        #expect(decide(&c, -300, at: t0 + 3_000_000_000) == .stretchBlock, "128 frames added")
        #expect(decide(&c, -40, at: t0 + 3_100_000_000) == .play)
        #expect(decide(&c, -40, at: t0 + 3_350_000_000) == .hold(frames: 40), "40 more: 168 in all")
        #expect(decide(&c, 120, at: t0 + 4_000_000_000) == .play)
        #expect(decide(&c, 90.4, at: t0 + 4_700_000_000) == .play, "a small excess is not skipped at 0.5 s")
        #expect(decide(&c, 130, at: t0 + 5_900_000_000) == .play)
        #expect(decide(&c, 110, at: t0 + 6_000_000_000) == .skip(frames: 90), "the least excess seen in 2 s")
        #expect(decide(&c, 20, at: t0 + 6_100_000_000) == .play)
        #expect(decide(&c, 20, at: t0 + 9_000_000_000) == .play, "within 0.5 ms: left to the drift controller")
        #expect(decide(&c, 200, at: t0 + 10_000_000_000) == .play)
        #expect(decide(&c, 200, at: t0 + 12_000_000_000) == .skip(frames: 78), "no more than the 168 stretched")
        #expect(decide(&c, 122, at: t0 + 12_100_000_000) == .play)
        #expect(decide(&c, 122, at: t0 + 14_100_000_000) == .play, "all given back")
        // A large excess is skipped soon, stretched or not.
        #expect(decide(&c, 500, at: t0 + 15_000_000_000) == .play)
        #expect(decide(&c, 400, at: t0 + 15_500_000_000) == .skip(frames: 400))
        // A target that falls (it had risen before the stream started, say) leaves latency to give back too.
        c.noteTarget(from: 400, to: 350)
        #expect(decide(&c, 80, at: t0 + 20_000_000_000) == .play)
        #expect(decide(&c, 80, at: t0 + 22_000_000_000) == .skip(frames: 50), "no more than the target fell")
        c.noteTarget(from: 350, to: 330)
        c.noteTarget(from: 330, to: 350)
        #expect(decide(&c, 80, at: t0 + 23_000_000_000) == .play)
        #expect(decide(&c, 80, at: t0 + 25_000_000_000) == .play, "a fall and an equal rise give nothing back")
    }

    @Test func aLateResumeSoonAfterASkipShowsTheLatencyTheStreamNeeds() {
        // Seen at period 64 on the JACK rig: the stream ran dry 44 frames short, the stretch was given back two
        // seconds later, and it ran dry again at once — an underrun every few seconds, for the whole stream. The
        // second late resume, within 5 s of the give-back, shows the stream needs the 344 frames it had before it.
        var c = LatencyCorrector(rate: 44_100)
        let t0: UInt64 = 10_000_000_000
        c.restart(atNanos: t0)
        c.noteLateResume(frames: 44, atNanos: t0 + 6_000_000_000)
        #expect(decide(&c, 44, at: t0 + 6_100_000_000) == .play)
        #expect(decide(&c, 44, at: t0 + 8_100_000_000) == .skip(frames: 44), "a lone late resume is given back")
        #expect(c.neededFrames == 0)
        // The packet that resumes may be stamped a little before the read that skipped.
        c.noteLateResume(frames: 44, atNanos: t0 + 8_098_000_000)
        #expect(c.neededFrames == 344, "300 after the skip + 44 short")
        #expect(decide(&c, 44, at: t0 + 8_200_000_000) == .play)
        #expect(decide(&c, 44, at: t0 + 10_200_000_000) == .play, "the 44 frames over the target stay")
        #expect(decide(&c, 44, at: t0 + 20_000_000_000) == .play)
        #expect(decide(&c, 44, at: t0 + 22_000_000_000) == .play, "still, ten seconds on")
        // The target falls 60 frames; the stream still needs 344: nothing is given back.
        c.noteTarget(from: 300, to: 240)
        #expect(decide(&c, 104, at: t0 + 23_000_000_000, target: 240) == .play)
        #expect(decide(&c, 104, at: t0 + 25_000_000_000, target: 240) == .play)
        // Latency above what it needs is given back, down to it (of the 104 returnable: 44 resumed + the fall).
        #expect(decide(&c, 160, at: t0 + 26_000_000_000, target: 240) == .play)
        #expect(decide(&c, 160, at: t0 + 28_000_000_000, target: 240) == .skip(frames: 56))
        // A target above what the stream needs leaves it to the target.
        #expect(decide(&c, 30, at: t0 + 30_000_000_000, target: 400) == .play)
        #expect(decide(&c, 30, at: t0 + 32_000_000_000, target: 400) == .skip(frames: 30))
        // A late resume long after a skip is not about it.
        c.noteLateResume(frames: 30, atNanos: t0 + 40_000_000_000)
        #expect(c.neededFrames == 344)
        // After a large skip, a late resume shows a need of what was left plus how late: not what was skipped.
        c.restart(atNanos: t0 + 50_000_000_000)
        #expect(decide(&c, 900, at: t0 + 56_000_000_000) == .play)
        #expect(decide(&c, 900, at: t0 + 56_500_000_000) == .skip(frames: 900))
        c.noteLateResume(frames: 20, atNanos: t0 + 56_600_000_000)
        #expect(c.neededFrames == 320)
        // A new stream starts over.
        c.restart(atNanos: t0 + 60_000_000_000)
        #expect(c.neededFrames == 0)
    }

    @Test func aSmallExcessThatAppearsAtTheStartIsGivenBackWhole() {
        // A start one packet too full: the measure settles 130 frames over the target within the first second
        // (seen with --latency low: 673 frames mouth-to-ear instead of 545, for the whole stream). No stretch added
        // it and the target never fell, but a clock cannot drift 3 ms in a few seconds: it is the start's.
        var c = LatencyCorrector(rate: 44_100, givesBackStartSteps: true)
        let start: UInt64 = 10_000_000_000
        c.restart(atNanos: start)
        #expect(decide(&c, 0, at: start + 500_000_000) == .play)
        #expect(decide(&c, 131, at: start + 1_000_000_000) == .play)
        #expect(decide(&c, 130.6, at: start + 2_000_000_000) == .play, "a small excess must last 2 s")
        #expect(decide(&c, 135, at: start + 3_000_000_000) == .skip(frames: 130), "the least excess seen, whole")
        #expect(decide(&c, 0, at: start + 3_100_000_000) == .play)
        // After the start-up window an excess nobody added is a clock's: left to the drift controller.
        #expect(decide(&c, 60, at: start + 5_500_000_000) == .play)
        #expect(decide(&c, 60, at: start + 8_000_000_000) == .play)
        #expect(decide(&c, 60, at: start + 12_000_000_000) == .play)
        // A step that began inside the window but is confirmed after it is still the start's.
        c.restart(atNanos: start + 20_000_000_000)
        #expect(decide(&c, 90, at: start + 24_500_000_000) == .play)
        #expect(decide(&c, 90, at: start + 26_500_000_000) == .skip(frames: 90))
        // A ramp (a clock drifting from the start) crosses the threshold just over it: not a step, left alone.
        c.restart(atNanos: start + 30_000_000_000)
        #expect(decide(&c, 10, at: start + 31_000_000_000) == .play)
        #expect(decide(&c, 23, at: start + 32_000_000_000) == .play)
        #expect(decide(&c, 40, at: start + 33_000_000_000) == .play)
        #expect(decide(&c, 60, at: start + 34_100_000_000) == .play, "nobody's to give back")
        // Under an adaptive target (the default) the start's step is left alone.
        var adaptive = LatencyCorrector(rate: 44_100)
        adaptive.restart(atNanos: start)
        #expect(decide(&adaptive, 131, at: start + 1_000_000_000) == .play)
        #expect(decide(&adaptive, 131, at: start + 3_000_000_000) == .play)
    }

    // MARK: CrossfadeGuard

    @Test func crossfadeGuardMarksFramesAndGuardsTransitions() {
        var g = CrossfadeGuard(rate: 44_100)
        #expect(g.guardFrames == 220)
        #expect(g.play(present: true) == FrameMark.present && !g.isGuarding)
        g.noteDiscontinuity()
        #expect(g.play(present: true) == FrameMark.discontinuity && g.isGuarding)
        for _ in 0..<219 { _ = g.play(present: true) }
        #expect(g.isGuarding)
        _ = g.play(present: true)
        #expect(!g.isGuarding)
        #expect(g.play(present: false) == FrameMark.missing && !g.isGuarding)
        #expect(g.play(present: true) == FrameMark.present && g.isGuarding, "a resumption after missing frames")
        for _ in 0..<220 { _ = g.play(present: true) }
        g.noteStretch()
        #expect(g.play(present: true) == FrameMark.present && g.isGuarding, "a resumption after a stretch")
    }

    // MARK: ResyncDetector

    func arrived(_ r: inout ResyncDetector, behind: Int64, sequence: Int64) -> Bool {
        r.packetArrived(behindFrames: behind, aheadEndFrames: 128 - behind, sequenceDistance: sequence,
                        targetFrames: 441, rate: 44_100, capacityFrames: 33_075)
    }

    @Test func resyncOnAJumpAheadOrAnIndexGoingBackWhileTheSequenceMovesOn() {
        var r = ResyncDetector()
        #expect(arrived(&r, behind: -100_000, sequence: 1), "beyond the buffer")
        #expect(!arrived(&r, behind: -128, sequence: 1))
        #expect(arrived(&r, behind: 10_000, sequence: 1), "far behind (> 100 ms), sequence moved on")
        #expect(!arrived(&r, behind: 10_000, sequence: -5), "far behind, an old copy")
        #expect(arrived(&r, behind: 10_000, sequence: -2000), "far behind, sequence jumped back")
        #expect(!arrived(&r, behind: 4_000, sequence: 1), "behind, but within 100 ms")
    }

    @Test func theEighthLatePacketInARowResyncs() {
        var r = ResyncDetector()
        for k in 1...7 {
            #expect(!arrived(&r, behind: 128, sequence: -1))
            #expect(r.packetLate() == (k >= 3), "the third late packet in a row is no outlier")
        }
        #expect(arrived(&r, behind: 128, sequence: -1))
        #expect(r.lateRun == 0)
        for _ in 1...7 { _ = r.packetLate() }
        r.packetStored()
        #expect(!arrived(&r, behind: 128, sequence: -1), "a stored packet ends the run")
    }
}
