import Testing
@testable import MeshAudio

/// Virtual-time host → network → PlayoutRenderer run. The host captures a 440 Hz sine in 128-frame periods on a
/// clock running at rate·(1+ppm); `network(k)` gives the arrival delays (ns) of packet k's copies (empty = lost).
struct RelayRendererSim {
    let renderer: PlayoutRenderer
    var ppm = 0.0
    var periods = 1000
    var block = 128
    var rate = 44_100.0
    var output: [Float] = []
    var stats: [PlayoutStats] = []
    var recordStatsEvery = 0

    init(mode: JitterBuffer.Mode) throws { renderer = try PlayoutRenderer(format: .default, configuration: .init(mode: mode)) }

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
        let renders = Int(Double(periods * 128) / Double(block) * rate / sender) + 1
        output.reserveCapacity(renders * block)
        var buf = [Float](repeating: 0, count: block)
        for j in 0..<renders {
            let now = UInt64((Double(j * block) * 1e9 / rate).rounded()) + 1_300_000
            while qi < queue.count && queue[qi].0 <= now {
                _ = queue[qi].1.withUnsafeBytes { renderer.enqueue(packet: $0, arrivalNanos: queue[qi].0) }
                qi += 1
            }
            buf.withUnsafeMutableBufferPointer {
                renderer.render(into: $0, context: RenderContext(frames: block, deviceDelayFrames: 256, nowNanos: now))
            }
            output += buf
            if recordStatsEvery > 0 && j % recordStatsEvery == 0 { stats.append(renderer.stats) }
        }
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
        let s = sim.renderer.stats
        #expect(!s.resampling && s.driftPPM == 0)
        #expect(s.late == 0 && s.duplicates == 0 && s.lostPackets == 0 && s.lostFrames == 0 && s.underruns == 0)
        #expect(s.concealedFrames == 0 && s.malformed == 0)
        // Playback begins with frame 0 at the first nonzero output (after a 4 ms fade-in), then every sample is
        // exactly the host's.
        let input = relaySine(start: 0, count: sim.periods * 128)
        let begin = sim.start - 1
        let fade = 176
        let played = sim.output.count - begin
        #expect(relayFirstMismatch(Array(sim.output[(begin + fade)...]), Array(input[fade..<played])) == nil)
        // Latency: .low target = 256 + 22 frames, ± one packet of phase.
        #expect(abs(s.bufferedMilliseconds - s.targetMilliseconds) < 1)
        #expect(s.targetMilliseconds < 6.5)
        #expect(abs(s.playoutLatencyMilliseconds - s.bufferedMilliseconds - 256 / 44.1) < 1e-9)
    }

    @Test func reorderedStreamIsBitExact() throws {
        var sim = try RelayRendererSim(mode: .fixed(milliseconds: 10))
        // Every 4th packet is overtaken by the next one (delayed by 1.5 periods).
        try sim.run { k in [k % 4 == 1 ? 1_000_000 + 4_354_000 : 1_000_000] }
        let s = sim.renderer.stats
        #expect(!s.resampling && s.late == 0 && s.lostFrames == 0 && s.underruns == 0)
        let input = relaySine(start: 0, count: sim.periods * 128)
        let begin = sim.start - 1
        #expect(relayFirstMismatch(Array(sim.output[(begin + 176)...]), Array(input[176..<(sim.output.count - begin)])) == nil)
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
        let s = sim.renderer.stats
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
        let worst = settled.map { abs($0.bufferedMilliseconds - $0.targetMilliseconds) }.max()!
        let last = sim.renderer.stats
        print("renderer at \(ppm) ppm: worst |buffered - target| after 30 s = \(worst) ms, correction \(last.driftPPM) ppm")
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
        let s = sim.renderer.stats
        #expect(s.resyncs == 1)
        #expect(s.late == 7)
        #expect(s.underruns <= 12)
        #expect(sim.output.suffix(44_100 / 4).map { abs($0) }.max()! > 0.45)   // playing again
    }

    @Test func renderIsExactSizeForAnyPull() throws {
        let r = try PlayoutRenderer(format: AudioFormat(sampleRate: 48_000, channels: 2))
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

/// Index of the first differing element (or of the length difference); nil when equal. Avoids Swift Testing's
/// (very slow) collection diff on large arrays.
func relayFirstMismatch(_ a: [Float], _ b: [Float]) -> Int? {
    for i in 0..<min(a.count, b.count) where a[i] != b[i] { return i }
    return a.count == b.count ? nil : min(a.count, b.count)
}
