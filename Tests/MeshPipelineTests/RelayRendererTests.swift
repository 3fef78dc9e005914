import Testing
import MeshAudio
@testable import MeshPipeline

/// Virtual-time host → network → PlayoutPipeline run (its renderer pulled here, in virtual time). The host captures a 440 Hz sine in 128-frame periods on a
/// clock running at rate·(1+ppm); `network(k)` gives the arrival delays (ns) of packet k's copies (empty = lost).
struct RelayRendererSim {
    let pipeline: PlayoutPipeline
    var ppm = 0.0
    var periods = 1000
    var block = 128
    var rate = 44_100.0
    var output: [Float] = []
    var stats: [PlayoutStats] = []
    var recordStatsEvery = 0
    /// Output frame index at which each `stats` entry was taken.
    var statsAt: [Int] = []
    /// How late render call j comes after its nominal time, ns (a device never calls early).
    var renderLateness: ((Int) -> UInt64)?
    /// Frames of render call j (default: `block`).
    var blockSize: ((Int) -> Int)?
    /// Called before render call j (to change the pipeline's controls mid-run).
    var beforeRender: ((Int) -> Void)?

    init(mode: JitterBuffer.Mode) throws {
        try self.init(configuration: .init(mode: mode))
    }

    init(configuration: PlayoutPipeline.Configuration) throws {
        pipeline = try PlayoutPipeline(format: .default, configuration: configuration, sink: VirtualTimeSink())
    }

    mutating func run(extra: (Int) -> [UInt8]? = { _ in nil }, network: (Int) -> [UInt64]) throws {
        var pz = try Packetizer(format: .default)
        let sender = rate * (1 + ppm * 1e-6)
        var queue: [(UInt64, [UInt8])] = []
        for k in 0..<periods {
            let samples = relaySine(start: k * 128, count: 128)
            let captured = UInt64((Double((k + 1) * 128) / sender * 1e9).rounded())
            let bytes = pz.packets(samples, chunk: ChunkInfo(firstFrameIndex: UInt64(k * 128), frames: 128, timestampNanos: captured))[0]
            for d in network(k) { queue.append((captured + d, bytes)) }
            if let e = extra(k) { queue.append((captured, e)) }
        }
        queue.sort { $0.0 < $1.0 }
        var qi = 0
        let totalFrames = Int(Double(periods * 128) * rate / sender) + block
        output.reserveCapacity(totalFrames + 4096)
        var buf = [Float](repeating: 0, count: 8192)
        var rendered = 0, j = 0
        while rendered < totalFrames {
            let frames = min(8192, max(1, blockSize?(j) ?? block))
            let ideal = UInt64((Double(rendered) * 1e9 / rate).rounded()) + 1_300_000
            let now = ideal + (renderLateness?(j) ?? 0)
            while qi < queue.count && queue[qi].0 <= now {
                _ = queue[qi].1.withUnsafeBytes { pipeline.receive($0, arrivalNanos: queue[qi].0) }
                qi += 1
            }
            beforeRender?(j)
            buf.withUnsafeMutableBufferPointer {
                pipeline.renderer.render(into: UnsafeMutableBufferPointer(rebasing: $0[0..<frames]),
                                context: RenderContext(frames: frames, deviceDelayFrames: 256, nowNanos: now))
            }
            output += buf[0..<frames]
            if recordStatsEvery > 0 && j % recordStatsEvery == 0 { stats.append(pipeline.stats); statsAt.append(rendered) }
            rendered += frames
            j += 1
        }
    }

    /// Bit-exactness after the start: finds which host frame plays just after the start fade-in (the start point
    /// depends on when playback began) and compares everything from there with the host's sine. Returns the
    /// output index of the first mismatch, or nil when all equal (-1 when no offset was found).
    func firstMismatchAfterStart(fade: Int = 176) -> Int? {
        let input = relaySine(start: 0, count: periods * 128)
        let p = start + fade + 8
        guard p + 16 <= output.count else { return -1 }
        var worst: Int? = -1
        // The sine repeats (to within rounding) every 4410 frames: try each candidate offset.
        for k in 0..<(input.count - 16) where input[k] == output[p] && (0..<16).allSatisfy({ input[k + $0] == output[p + $0] }) {
            let n = min(output.count - p, input.count - k)
            var mismatch: Int?
            for i in 0..<n where output[p + i] != input[k + i] { mismatch = p + i; break }
            guard let m = mismatch else { return nil }
            worst = max(worst ?? -1, m)
        }
        return worst
    }

    /// Index of the first nonzero output sample.
    var start: Int { output.firstIndex { $0 != 0 } ?? output.count }

    func maxJump(from: Int = 0) -> Float {
        var m: Float = 0
        for i in max(1, from)..<output.count { m = max(m, abs(output[i] - output[i - 1])) }
        return m
    }
}

@Suite("Relay renderer end to end")
struct RelayRendererTests {
    static let sineStep: Float = 0.5 * 2 * .pi * 440 / 44_100

    @Test func sameClockInOrderIsBitExact() throws {
        var sim = try RelayRendererSim(mode: .low)
        try sim.run { _ in [1_000_000] }
        let s = sim.pipeline.stats
        #expect(!s.resampling && s.driftPPM == 0)
        #expect(s.late == 0 && s.duplicates == 0 && s.lostPackets == 0 && s.lostFrames == 0 && s.underruns == 0)
        #expect(s.concealedFrames == 0 && s.malformed == 0)
        // After the 4 ms fade-in every sample is exactly the host's.
        #expect(sim.firstMismatchAfterStart() == nil)
        // Latency: .low target = 256 + 22 frames, ± one packet of phase.
        #expect(abs(s.bufferedMilliseconds - s.targetMilliseconds) < 1)
        #expect(s.targetMilliseconds < 6.5)
        #expect(abs(s.playoutLatencyMilliseconds - s.bufferedMilliseconds - 256 / 44.1) < 1e-9)
    }

    @Test func reorderedStreamIsBitExact() throws {
        var sim = try RelayRendererSim(mode: .fixed(milliseconds: 10))
        // Every 4th packet is overtaken by the next one (delayed by 1.5 periods).
        try sim.run { k in [k % 4 == 1 ? 1_000_000 + 4_354_000 : 1_000_000] }
        let s = sim.pipeline.stats
        #expect(!s.resampling && s.late == 0 && s.lostFrames == 0 && s.underruns == 0)
        #expect(sim.firstMismatchAfterStart() == nil)
    }

    @Test func lossyStreamIsConcealedAndCountedExactly() throws {
        var sim = try RelayRendererSim(mode: .fixed(milliseconds: 10))
        var rng = RelayRNG(seed: 11)
        let lost = Set((0..<1000).filter { k in k > 20 && k < 990 && Double.random(in: 0..<1, using: &rng) < 0.05 })
        let dup = Set([100, 200, 300])
        var malformedSent = 0
        try sim.run(extra: { k in
            guard k % 97 == 0 else { return nil }
            malformedSent += 1
            return [0x4D, 0x41, 1, 1, 0, 0]   // truncated
        }) { k in lost.contains(k) ? [] : dup.contains(k) ? [1_000_000, 1_500_000] : [1_000_000] }
        let s = sim.pipeline.stats
        #expect(s.lostPackets == UInt64(lost.count))
        #expect(s.lostFrames == UInt64(lost.count * 128))
        #expect(s.concealedFrames == s.lostFrames)
        #expect(s.duplicates == 3 && s.late == 0 && s.underruns == 0)
        #expect(s.malformed == UInt64(malformedSent))
        #expect(s.received == UInt64(1000 - lost.count + 3))
        #expect(abs(s.lossPercent - Double(lost.count) / 10) < 1e-9)
        // Concealment keeps the waveform smooth: no click anywhere.
        let jump = sim.maxJump(from: sim.start)
        print("lossy stream (\(lost.count) of 1000 lost): max jump \(jump)")
        #expect(jump < 3 * Self.sineStep)
    }

    @Test(arguments: [200.0, -200.0])
    func driftIsTrackedWithinOneMillisecondAndStaysClean(ppm: Double) throws {
        var sim = try RelayRendererSim(mode: .fixed(milliseconds: 8))
        sim.ppm = ppm
        sim.periods = 344 * 120          // two minutes
        sim.recordStatsEvery = 1
        var rng = RelayRNG(seed: 5)
        try sim.run { _ in [1_000_000 + UInt64.random(in: 0...300_000, using: &rng)] }  // ±0.15 ms network jitter
        let settled = sim.stats.dropFirst(344 * 30)
        let worst = settled.map { abs($0.steadyLatencyMilliseconds - $0.targetMilliseconds) }.max()!
        let last = sim.pipeline.stats
        print("renderer at \(ppm) ppm: worst |steady latency - target| after 30 s = \(worst) ms, correction \(last.driftPPM) ppm")
        #expect(worst <= 1)
        #expect(last.resampling)
        #expect(abs(last.driftPPM - ppm) < 30)
        #expect(last.underruns == 0 && last.lostFrames == 0 && last.late == 0 && last.skippedFrames == 0)
        // The switch from bit-exact bypass to resampling and the ratio changes leave no click.
        #expect(sim.maxJump(from: sim.start + 200) < 1.1 * Self.sineStep)
        // SNR of the drift-corrected sine over the last 8192 samples.
        let tail = Array(sim.output.suffix(8192))
        let w0 = 2 * Double.pi * 440 / 44_100 * (1 + ppm * 1e-6)
        let fit = relayBestSNR(tail, around: w0, span: w0 * 100e-6)
        print("renderer at \(ppm) ppm: output SNR \(fit.snr) dB")
        #expect(fit.snr >= 60)
    }

    /// Realistic LAN + scheduler jitter: network delay 1 ms + uniform 0–2 ms, a 5 ms spike on 1 % of packets
    /// (reordering freely); render calls late by uniformly 0–2 ms (a ±1 ms spread around the device schedule).
    static func realisticJitter(seed: UInt64) -> (network: (Int) -> [UInt64], lateness: (Int) -> UInt64) {
        var net = RelayRNG(seed: seed), ren = RelayRNG(seed: seed &+ 1000)
        return ({ _ in
            var d = 1_000_000 + UInt64.random(in: 0...2_000_000, using: &net)
            if Double.random(in: 0..<1, using: &net) < 0.01 { d += 5_000_000 }
            return [d]
        }, { _ in UInt64.random(in: 0...2_000_000, using: &ren) })
    }

    @Test(arguments: [UInt64(21), 22])
    func sameClockWithRealisticJitterStaysBitExact(seed: UInt64) throws {
        var sim = try RelayRendererSim(mode: .fixed(milliseconds: 12))
        sim.periods = 344 * 60              // one minute
        sim.recordStatsEvery = 344
        let j = Self.realisticJitter(seed: seed)
        sim.renderLateness = j.lateness
        try sim.run(network: j.network)
        let s = sim.pipeline.stats
        let excursion = sim.stats.map { abs($0.clockExcursionMilliseconds) }.max()!
        let steadySpread = sim.stats.dropFirst(5).map { $0.steadyLatencyMilliseconds - $0.targetMilliseconds }
        print("same clock + jitter (seed \(seed)): resampling \(s.resampling), drift \(s.driftPPM) ppm, estimate \(s.estimatedDriftPPM) ppm, max |excursion| \(excursion) ms, steady error \(steadySpread.min()!)…\(steadySpread.max()!) ms, raw buffered \(s.bufferedMilliseconds) ms")
        #expect(!s.resampling && s.driftPPM == 0)
        #expect(sim.stats.allSatisfy { !$0.resampling && $0.driftPPM == 0 })
        #expect(s.late == 0 && s.lostFrames == 0 && s.underruns == 0 && s.stretchedFrames == 0 && s.skippedFrames == 0)
        #expect(sim.firstMismatchAfterStart() == nil)
        #expect(excursion < 0.1)
    }

    @Test(arguments: [200.0, -200.0])
    func driftWithRealisticJitterIsTracked(ppm: Double) throws {
        var sim = try RelayRendererSim(mode: .fixed(milliseconds: 13))
        sim.ppm = ppm
        sim.periods = 344 * 150             // two and a half minutes
        sim.recordStatsEvery = 1
        let j = Self.realisticJitter(seed: 9)
        sim.renderLateness = j.lateness
        try sim.run(network: j.network)
        let settled = zip(sim.stats, sim.statsAt).filter { $0.1 > 44_100 * 30 }.map { $0.0 }
        let errors = settled.map { $0.steadyLatencyMilliseconds - $0.targetMilliseconds }
        let last = sim.pipeline.stats
        let jump = sim.maxJump(from: sim.start + 200)
        let tail = Array(sim.output.suffix(8192))
        let w0 = 2 * Double.pi * 440 / 44_100 * (1 + ppm * 1e-6)
        let fit = relayBestSNR(tail, around: w0, span: w0 * 100e-6)
        print("renderer + jitter at \(ppm) ppm: steady latency − target after 30 s in \(errors.min()!)…\(errors.max()!) ms, correction \(last.driftPPM) ppm, estimate \(last.estimatedDriftPPM) ppm, SNR \(fit.snr) dB, max jump \(jump / Self.sineStep)× sine step, stretched \(last.stretchedFrames) skipped \(last.skippedFrames)")
        #expect(errors.allSatisfy { abs($0) <= 1 })
        #expect(last.resampling)
        #expect(abs(last.driftPPM - ppm) < 30 && abs(last.estimatedDriftPPM - ppm) < 10)
        print("  late \(last.late) of \(last.received), lostFrames \(last.lostFrames), underruns \(last.underruns)")
        // A 13 ms target against an 8 ms worst-case delay: the odd spike still comes late while resampling (the
        // resampler's look-ahead takes ~0.9 ms of the margin); no underrun, skip or stretch.
        #expect(last.underruns == 0 && last.skippedFrames == 0 && last.stretchedFrames < 128)
        #expect(Double(last.late) < 0.001 * Double(last.received))
        #expect(jump < 1.1 * Self.sineStep)
        #expect(fit.snr >= 60)
    }

    /// The network of the transition tests: 3 % loss after 3 s, a 100 ms burst loss at 35 s, a 1 ms delay with
    /// 0–1 ms of jitter, 0–6 ms between 8 and 12 s, and a 15 ms delay step up from 20 to 30 s.
    static func transitionsNetwork(seed: UInt64) -> (Int) -> [UInt64] {
        var net = RelayRNG(seed: seed)
        return { k in
            let t = Double(k) / 344
            if t > 3 && Double.random(in: 0..<1, using: &net) < 0.03 { return [] }     // 3 % loss
            if (35..<35.1).contains(t) { return [] }                                     // burst loss
            var d: UInt64 = 1_000_000
            let spread: UInt64 = (8..<12).contains(t) ? 6_000_000 : 1_000_000
            d += UInt64.random(in: 0...spread, using: &net)
            if (20..<30).contains(t) { d += 15_000_000 }                                // delay step
            return [d]
        }
    }

    /// Render sizes a sink may ask for (some odd ones, and 1000-frame pulls).
    static let oddBlockSizes = [1, 7, 64, 127, 128, 128, 128, 129, 256, 441, 1000]

    /// A sine through everything that can cut the waveform: arrival jitter that changes (the auto target rises
    /// and decays), a 15 ms delay step up (underruns, target growth, stretches) and back down (skips), random
    /// and burst losses, render calls with jittered times and odd sizes, with and without drift (the resampler
    /// switching in). The largest sample-to-sample step must stay within 1.5× the sine's own.
    @Test(arguments: [0.0, 300.0, -300.0])
    func everyTransitionIsClickFree(ppm: Double) throws {
        var sim = try RelayRendererSim(mode: .auto)
        sim.ppm = ppm
        sim.periods = 344 * 45
        var ren = RelayRNG(seed: 78), sizes = RelayRNG(seed: 79)
        try sim.run(network: Self.transitionsNetwork(seed: 77))
        sim.renderLateness = nil
        _ = ren.next(); _ = sizes.next()
        let s0 = sim.pipeline.stats
        var sim2 = try RelayRendererSim(mode: .auto)
        sim2.ppm = ppm
        sim2.periods = 344 * 45
        sim2.renderLateness = { _ in UInt64.random(in: 0...2_000_000, using: &ren) }
        sim2.blockSize = { _ in Self.oddBlockSizes[Int.random(in: 0..<Self.oddBlockSizes.count, using: &sizes)] }
        try sim2.run(network: Self.transitionsNetwork(seed: 77))
        for (name, run, st) in [("fixed 128-frame renders", sim, s0), ("jittered odd-size renders", sim2, sim2.pipeline.stats)] {
            let jump = run.maxJump(from: run.start)
            print("clicks at \(ppm) ppm, \(name): max jump \(jump) = \(jump / Self.sineStep)× sine step; lost \(st.lostPackets) concealed \(st.concealedFrames) stretched \(st.stretchedFrames) skipped \(st.skippedFrames) underruns \(st.underruns) late \(st.late) resampling \(st.resampling) drift \(st.driftPPM)")
            #expect(st.lostPackets > 300 && st.stretchedFrames > 0 && st.concealedFrames > 0 && st.underruns > 0)
            if name.hasPrefix("fixed") { #expect(st.skippedFrames > 0) }   // (1000-frame pulls raise the skip threshold)
            #expect(jump < 1.5 * Self.sineStep)
            #expect(st.resampling == (ppm != 0))
        }
    }

    /// The same transitions for 12 other network seeds, with fixed and with jittered odd-size renders: the
    /// fixed seeds above once hid a click (a lost packet just after a crossfade repeated a period that was not
    /// periodic: 99 of 360 such runs stepped by 1.5–12.6× the sine's own step; now the worst is 1.2×).
    @Test(arguments: [0.0, 300.0, -300.0])
    func transitionsAreClickFreeForOtherSeeds(ppm: Double) throws {
        var worst: (ratio: Float, seed: UInt64, odd: Bool) = (0, 0, false)
        var stretched: UInt64 = 0, skipped: UInt64 = 0, underruns: UInt64 = 0
        for seed in UInt64(100)..<112 {
            for odd in [false, true] {
                var sim = try RelayRendererSim(mode: .auto)
                sim.ppm = ppm
                sim.periods = 344 * 40
                if odd {
                    var ren = RelayRNG(seed: seed &+ 1), sizes = RelayRNG(seed: seed &+ 2)
                    sim.renderLateness = { _ in UInt64.random(in: 0...2_000_000, using: &ren) }
                    sim.blockSize = { _ in Self.oddBlockSizes[Int.random(in: 0..<Self.oddBlockSizes.count, using: &sizes)] }
                }
                try sim.run(network: Self.transitionsNetwork(seed: seed))
                let st = sim.pipeline.stats
                #expect(st.lostPackets > 300 && st.concealedFrames > 0)
                stretched += st.stretchedFrames
                skipped += st.skippedFrames
                underruns += st.underruns
                let ratio = sim.maxJump(from: sim.start) / Self.sineStep
                if ratio > worst.ratio { worst = (ratio, seed, odd) }
            }
        }
        print("transitions at \(ppm) ppm, seeds 100–111: worst step \(worst.ratio)× the sine's (seed \(worst.seed), odd renders \(worst.odd)); stretched \(stretched), skipped \(skipped), underruns \(underruns) frames/blocks in all")
        #expect(stretched > 0 && skipped > 0 && underruns > 0, "the runs went through every transition")
        #expect(worst.ratio < 1.5)
    }

    @Test func hostRestartResyncsAndPlaysOn() throws {
        var sim = try RelayRendererSim(mode: .fixed(milliseconds: 10))
        sim.periods = 600
        var pz = try Packetizer(format: .default, firstSequence: 0)
        // After packet 300 the host restarts: a fresh packetizer, frame index from 0 again.
        var restarted: [Int: [UInt8]] = [:]
        for k in 300..<600 {
            let j = k - 300
            restarted[k] = pz.packets(relaySine(start: j * 128, count: 128),
                                      chunk: ChunkInfo(firstFrameIndex: UInt64(j * 128), frames: 128, timestampNanos: 0))[0]
        }
        try sim.run(extra: { k in restarted[k] }) { k in k < 300 ? [1_000_000] : [] }
        let s = sim.pipeline.stats
        #expect(s.resyncs == 1)
        #expect(s.late == 7)
        #expect(s.underruns <= 12)
        #expect(sim.output.suffix(44_100 / 4).map { abs($0) }.max()! > 0.45)   // playing again
    }

    @Test func renderIsExactSizeForAnyPull() throws {
        let format = AudioFormat(sampleRate: 48_000, channels: 2)
        let r = try PlayoutPipeline(format: format, sink: VirtualTimeSink(format: format)).renderer
        for frames in [1, 64, 441, 5000] {
            var buf = [Float](repeating: 7, count: frames * 2 + 2)
            buf.withUnsafeMutableBufferPointer {
                r.render(into: $0, context: RenderContext(frames: frames, deviceDelayFrames: 0, nowNanos: 1))
            }
            #expect(buf.prefix(frames * 2).allSatisfy { $0 == 0 })
            #expect(buf.suffix(2) == [7, 7])
        }
    }
}

/// The host frame index playing at output index `at` (exact match of 16 samples of the host's sine), or nil.
func relayFindOffset(_ output: [Float], at: Int, input: [Float]) -> Int? {
    guard at + 16 <= output.count else { return nil }
    for k in 0..<(input.count - 16) where input[k] == output[at] {
        if (0..<16).allSatisfy({ input[k + $0] == output[at + $0] }) { return k }
    }
    return nil
}

/// Index of the first differing element (or of the length difference); nil when equal. Avoids Swift Testing's
/// (very slow) collection diff on large arrays.
func relayFirstMismatch(_ a: [Float], _ b: [Float]) -> Int? {
    for i in 0..<min(a.count, b.count) where a[i] != b[i] { return i }
    return a.count == b.count ? nil : min(a.count, b.count)
}
