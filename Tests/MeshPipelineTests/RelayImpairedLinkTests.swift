import Testing
import MeshAudio
@testable import MeshPipeline

/// The playout chain behind a lossy, jittery, reordering link (what `mesh-impair --loss 2% --delay-ms 5
/// --jitter-ms 5` does), in virtual time on one clock: the auto target must settle near the delay spread, with no
/// stretch/skip churn, rare late packets, and concealment only for real losses.
@Suite("Relay impaired link")
struct RelayImpairedLinkTests {
    @Test(arguments: Array(UInt64(1)...20))
    func uniformDelayJitterSettlesWithoutChurn(seed: UInt64) throws {
        var sim = try RelayRendererSim(mode: .auto)
        sim.periods = 344 * 60                   // one minute
        sim.recordStatsEvery = 344               // about once a second
        var net = RelayRNG(seed: seed), ren = RelayRNG(seed: seed &+ 500)
        var lost = 0
        // Independent uniform 0–10 ms delay per packet (so packets reorder), 2 % loss.
        try sim.run { _ in
            if Double.random(in: 0..<1, using: &net) < 0.02 { lost += 1; return [] }
            return [UInt64.random(in: 0...10_000_000, using: &net)]
        }
        _ = ren.next()
        // (Run again with ±0.5 ms render-call jitter: the run above is the clean-render reference.)
        var sim2 = try RelayRendererSim(mode: .auto)
        sim2.periods = 344 * 60
        sim2.recordStatsEvery = 344
        var net2 = RelayRNG(seed: seed)
        var lost2 = 0
        sim2.renderLateness = { _ in UInt64.random(in: 0...1_000_000, using: &ren) }
        try sim2.run { _ in
            if Double.random(in: 0..<1, using: &net2) < 0.02 { lost2 += 1; return [] }
            return [UInt64.random(in: 0...10_000_000, using: &net2)]
        }
        for (name, run, lostPackets) in [("steady renders", sim, lost), ("±0.5 ms renders", sim2, lost2)] {
            let s = run.pipeline.stats
            let at10 = zip(run.stats, run.statsAt).first { $0.1 >= 44_100 * 10 }!.0
            let settled = zip(run.stats, run.statsAt).filter { $0.1 >= 44_100 * 10 }.map { $0.0 }
            let targets = settled.map(\.targetMilliseconds)
            let churn = (s.stretchedFrames + s.skippedFrames) - (at10.stretchedFrames + at10.skippedFrames)
            let played = Double(run.output.count - 44_100 * 10)
            print("impaired link (seed \(seed), \(name)): target \(targets.min()!)…\(targets.max()!) ms, stretched \(s.stretchedFrames) skipped \(s.skippedFrames) (after 10 s: \(churn)), late \(s.late) of \(s.received), lost \(s.lostPackets) (sent lost \(lostPackets)), lostFrames \(s.lostFrames), concealed \(s.concealedFrames) frames = \(s.concealedMilliseconds) ms, underruns \(s.underruns), resampling \(s.resampling)")
            #expect(targets.allSatisfy { $0 >= 10 && $0 <= 20 })
            #expect(Double(churn) <= 0.01 * played)
            #expect(Double(s.late) <= 0.005 * Double(s.received))
            #expect(abs(Int(s.lostPackets) - lostPackets) <= 2)
            #expect(Double(s.concealedFrames) <= 1.5 * Double(lostPackets * 128) + 2048)
            #expect(!s.resampling)
        }
    }
}
