import Testing
@testable import MeshAudio

/// A pause of the host, the network or the VM delivers a stretch of packets in one burst; a real delay step keeps
/// every later packet late. The adaptive buffer must cover the step at once, and not keep a pause's latency.
@Suite("Relay stall and delay step")
struct RelayStallTests {
    static let packetNanos = 128.0 * 1e9 / 44_100

    @Test func aStallIsConcealedWithoutKeepingItsLatency() throws {
        var sim = try RelayRendererSim(mode: .auto)
        sim.periods = 344 * 20
        sim.recordStatsEvery = 86
        // 10 s in, the host stalls for 300 ms: that stretch's packets all arrive together when it resumes.
        let stallStart = 3_440, stallPackets = 103
        try sim.run { k in
            guard k >= stallStart, k < stallStart + stallPackets else { return [1_000_000] }
            return [1_000_000 + UInt64(Double(stallStart + stallPackets - k) * Self.packetNanos)]
        }
        let trace = zip(sim.statsAt, sim.stats).filter { $0.0 >= 44_100 * 9 }.map { (Double($0.0) / 44_100, $0.1.targetMilliseconds) }
        print("stall: target over time " + trace.map { String(format: "%.1fs:%.1f", $0.0, $0.1) }.joined(separator: " "))
        let s = sim.renderer.stats
        print("stall: late \(s.late), resyncs \(s.resyncs), concealed \(s.concealedMilliseconds) ms")
        #expect(trace.allSatisfy { $0.1 < 20 }, "a 300 ms pause does not raise the target")
        #expect(s.resyncs == 0, "the late burst is the same stream")
        #expect(s.concealedMilliseconds < 400, "the pause is concealed once")
    }

    @Test func aDelayStepIsCoveredAtOnce() throws {
        var sim = try RelayRendererSim(mode: .auto)
        sim.periods = 344 * 14
        sim.recordStatsEvery = 86
        // 10 s in, the path's delay steps up by 30 ms for good.
        try sim.run { k in [k < 3_440 ? 1_000_000 : 31_000_000] }
        let trace = zip(sim.statsAt, sim.stats).filter { $0.0 >= 44_100 * 9 }.map { (Double($0.0) / 44_100, $0.1.targetMilliseconds) }
        print("delay step: target over time " + trace.map { String(format: "%.1fs:%.1f", $0.0, $0.1) }.joined(separator: " "))
        let s = sim.renderer.stats
        // The step is covered at once (the target jumps past 30 ms), so only the packets of the step itself come
        // late; then the new, higher floor of the delay is the reference and the target decays back.
        #expect(trace.contains { $0.0 <= 10.5 && $0.1 >= 30 }, "covered within half a second")
        #expect(s.late < 20, "only the packets of the step itself come late (\(s.late))")
    }
}
