import Testing
import MeshAudio
@testable import MeshPipeline

/// The auto target on a clean link whose host stalls now and then (a capture or scheduling hiccup holds back a few
/// packets, which then arrive together), in virtual time: a rare stall is concealed once and leaves the target at
/// the floor; stalls that keep coming are jitter, and the target covers them.
@Suite("Rare stalls and the auto target")
struct RareStallTests {
    /// Delay of packet `k` (2.9 ms each) when the host stalls for `stallMs` at packets `k0 + m·every`.
    static func stalls(every: Int, first k0: Int, stallMs: Double) -> (Int) -> [UInt64] {
        let period = 128.0 / 44_100 * 1e3
        let held = Int((stallMs / period).rounded(.up))
        return { k in
            guard k >= k0 else { return [0] }
            let i = (k - k0) % every
            guard i < held else { return [0] }
            return [UInt64(((stallMs - Double(i) * period) * 1e6).rounded())]
        }
    }

    /// Target and loss figures after the first `settle` seconds.
    struct Outcome {
        var targetsMs: [Double]
        var late: UInt64
        var lostFrames: UInt64
        var churnFrames: UInt64
    }

    static func run(every: Int, stallSpacing: Double? = nil, seconds: Int = 40, settle: Int = 5) throws -> Outcome {
        var configuration = PlayoutPipeline.Configuration(mode: .auto)
        if let stallSpacing { configuration.jitter.stallSpacingSeconds = stallSpacing }
        var sim = try RelayRendererSim(configuration: configuration)
        sim.periods = 344 * seconds
        sim.recordStatsEvery = 86
        try sim.run(network: stalls(every: every, first: 344 * 8, stallMs: 10))
        let settled = zip(sim.stats, sim.statsAt).filter { $0.1 >= 44_100 * settle }.map { $0.0 }
        let s = sim.pipeline.stats
        return Outcome(targetsMs: settled.map(\.targetMilliseconds), late: s.late, lostFrames: s.lostFrames,
                       churnFrames: s.stretchedFrames + s.skippedFrames)
    }

    @Test("a 10 ms stall every 6 s: concealed each time, the target stays at the floor")
    func rareStallsKeepTheFloor() throws {
        let o = try Self.run(every: 344 * 6)
        let floor = (256 + 22.05) / 44.1   // block + packet + 0.5 ms
        print("rare stalls: target \(o.targetsMs.min()!)…\(o.targetsMs.max()!) ms (floor \(floor)), late \(o.late), lostFrames \(o.lostFrames), churn \(o.churnFrames)")
        #expect(o.targetsMs.allSatisfy { $0 < floor + 1 }, "the target never rose for a stall")
        // 6 stalls in the run (at 8, 14, …, 38 s), each of 4 held-back packets: some arrive late and are concealed.
        #expect(o.late > 0 && o.late <= 6 * 4)
        #expect(o.lostFrames <= 6 * 4 * 128 + 6 * 256)
    }

    @Test("the same stalls with the filter off raise the target (the behaviour it replaces)")
    func withoutTheFilterTheTargetRises() throws {
        let o = try Self.run(every: 344 * 6, stallSpacing: 0)
        print("rare stalls, filter off: target up to \(o.targetsMs.max()!) ms, late \(o.late)")
        #expect(o.targetsMs.max()! > (256 + 22.05) / 44.1 + 3, "the stall raised it by most of its length")
    }

    @Test("a 10 ms stall every second is jitter: the target rises to cover it and late packets stop")
    func frequentStallsRaiseTheTarget() throws {
        let o = try Self.run(every: 344, seconds: 30)
        print("stalls every second: target \(o.targetsMs.min()!)…\(o.targetsMs.max()!) ms, late \(o.late), lostFrames \(o.lostFrames)")
        let last = o.targetsMs.suffix(40)   // the last 10 s
        #expect(last.allSatisfy { $0 > 6.3 + 9 }, "covers the 10 ms held back")
        #expect(o.late <= 3 * 4, "late only until the target covered the stalls")
    }

    @Test("after the jitter ends the target comes back down within seconds")
    func theTargetDecaysInSeconds() throws {
        var sim = try RelayRendererSim(mode: .auto)
        sim.periods = 344 * 30
        sim.recordStatsEvery = 86
        let jittery = Self.stalls(every: 344, first: 344 * 4, stallMs: 10)
        try sim.run { k in k < 344 * 14 ? jittery(k) : [0] }   // stalls every second from 4 s to 14 s, then clean
        let at = { (t: Double) in Array(zip(sim.stats, sim.statsAt)).last { Double($0.1) <= t * 44_100 }!.0.targetMilliseconds }
        print("decay: target at 13 s \(at(13)) ms, 18 s \(at(18)) ms, 22 s \(at(22)) ms, 29 s \(at(29)) ms")
        #expect(at(13) > 15)
        #expect(at(22) < 9, "the 2 s window, then a 5 s time constant")
        #expect(at(29) < 7.2, "within 1 ms of the floor 15 s after the jitter ended")
    }
}
