import Testing
import MeshAudio
@testable import MeshPipeline

/// The listener's controls: the gain ramp, mute, the beep, and a held (paused) pipeline, in virtual time.
struct OutputControlsTests {
    @Test func decibelsBecomeLinearGain() {
        for (db, expected) in [(0.0, 1.0), (-6.0, 0.501187), (-20.0, 0.1), (-60.0, 0.001), (12.0, 3.981072), (-3.0, 0.707946)] {
            #expect(abs(OutputControls.linear(dB: db) - expected) < 1e-5, "\(db) dB")
        }
        let c = OutputControls()
        c.volumeDB = 40
        #expect(c.volumeDB == 12)
        c.volumeDB = -.infinity
        #expect(c.volumeDB == 0, "not finite: as sent")
        c.volumeDB = -6
        c.muted = true
        #expect(c.targetGain == 0)
    }

    @Test func aVolumeStepIsRampedNeverStepped() {
        var stage = OutputStage(sampleRate: 44_100, channels: 1)
        var block = [Float](repeating: 1, count: 2048)
        let target = Float(OutputControls.linear(dB: -6))
        block.withUnsafeMutableBufferPointer { stage.process($0.baseAddress!, frames: 2048, target: target, beeps: 0, muted: false) }
        // From 1 down to 0.501 in 1/441 steps: no step between frames larger than one ramp step.
        var largest: Float = 0
        for i in 1..<block.count { largest = max(largest, abs(block[i] - block[i - 1])) }
        #expect(largest <= 1 / Float(stage.rampFrames) + 1e-6)
        #expect(abs(block[2047] - target) < 1e-6 && block[0] < 1)
        // The ramp takes 10 ms for a full-scale change: 0.5 of it takes about 220 frames.
        #expect(block[300] == target)
    }

    @Test("Whatever reaches the last stage leaves it within full scale: over-range samples clipped, what is not finite silenced, at any gain")
    func theDeviceNeverGetsMoreThanFullScale() {
        for (target, beeps) in [(Float(1), UInt32(0)), (Float(OutputControls.linear(dB: 12)), 0), (1, 1)] {
            var stage = OutputStage(sampleRate: 44_100, channels: 2)
            var block: [Float] = [3, -3, .nan, .infinity, -.infinity, 0.5, -0.25, 1, -1, 0.999]
            block.withUnsafeMutableBufferPointer { stage.process($0.baseAddress!, frames: 5, target: target, beeps: beeps, muted: false) }
            #expect(block.allSatisfy { $0.isFinite && abs($0) <= 1 }, "gain \(target), beeps \(beeps): \(block)")
            #expect(block[2] == 0 && block[3] == 0 && block[4] == 0, "what is not finite is silence")
            #expect(block[0] == 1 && block[1] == -1)
        }
        // In range and at unity gain, nothing changes.
        var stage = OutputStage(sampleRate: 44_100, channels: 1)
        let clean: [Float] = [0.5, -0.25, 1, -1, 0]
        var block = clean
        block.withUnsafeMutableBufferPointer { stage.process($0.baseAddress!, frames: 5, target: 1, beeps: 0, muted: false) }
        #expect(block == clean)
    }

    @Test func theBeepIsA100msToneMixedOnceAndSilentWhenMuted() {
        var stage = OutputStage(sampleRate: 44_100, channels: 1)
        var block = [Float](repeating: 0, count: 8820)
        block.withUnsafeMutableBufferPointer { stage.process($0.baseAddress!, frames: 8820, target: 1, beeps: 1, muted: false) }
        let energy = block[0..<4410].reduce(0) { $0 + $1 * $1 }
        #expect(energy > 50, "a 0.25-amplitude tone for 0.1 s")
        #expect(block[4410..<8820].allSatisfy { $0 == 0 }, "once, 100 ms")
        // 880 Hz: 88 cycles in 0.1 s, so about 176 sign changes.
        var crossings = 0
        for i in 1..<4410 where (block[i - 1] < 0) != (block[i] < 0) { crossings += 1 }
        #expect(abs(crossings - 176) <= 4)
        var muted = OutputStage(sampleRate: 44_100, channels: 1)
        var quiet = [Float](repeating: 0, count: 4410)
        quiet.withUnsafeMutableBufferPointer { muted.process($0.baseAddress!, frames: 4410, target: 0, beeps: 1, muted: true) }
        #expect(quiet.allSatisfy { $0 == 0 })
    }

    @Test("A stage built for a new pipeline (a format change) goes on where the controls stand: no beep played again, no ramp from full volume")
    func aNewStageContinuesTheControls() {
        let controls = OutputControls()
        controls.volumeDB = -20
        controls.beep()
        var stage = OutputStage(sampleRate: 44_100, channels: 1, continuing: controls)
        var block = [Float](repeating: 0.5, count: 4410)
        block.withUnsafeMutableBufferPointer {
            stage.process($0.baseAddress!, frames: 4410, target: controls.targetGain, beeps: controls.beepCount, muted: false)
        }
        #expect(block.allSatisfy { $0 == 0.5 * controls.targetGain }, "at -20 dB from the first frame, and no beep")
        #expect(stage.gain == controls.targetGain)
        // The next beep asked for is played.
        controls.beep()
        var next = [Float](repeating: 0, count: 4410)
        next.withUnsafeMutableBufferPointer {
            stage.process($0.baseAddress!, frames: 4410, target: controls.targetGain, beeps: controls.beepCount, muted: false)
        }
        #expect(next.reduce(0) { $0 + $1 * $1 } > 50)
        // A stage made the old way (a pipeline's first) starts at unity and plays the count it has not seen.
        var fresh = OutputStage(sampleRate: 44_100, channels: 1)
        var first = [Float](repeating: 0, count: 4410)
        first.withUnsafeMutableBufferPointer {
            fresh.process($0.baseAddress!, frames: 4410, target: controls.targetGain, beeps: controls.beepCount, muted: false)
        }
        #expect(first.reduce(0) { $0 + $1 * $1 } > 50)
    }

    @Test func aHeldPipelinePlaysSilenceDropsWhatArrivesAndResumesAtTheLiveEdge() throws {
        var sim = try RelayRendererSim(mode: .auto)
        sim.periods = 1500
        sim.recordStatsEvery = 10
        let controls = sim.pipeline.controls
        // Held from render call 500 to 900 (about 1.2 s); the host sends this player nothing from packet 500 to 900.
        sim.beforeRender = { j in controls.held = (500..<900).contains(j) }
        try sim.run(network: { k in (500..<900).contains(k) ? [] : [1_000_000] })
        let s = sim.pipeline.stats
        // The first held block plays, fading out; the hold begins with the next.
        #expect(s.heldFrames == 399 * 128)
        #expect(s.lostPackets == 0, "the packets not sent while paused are not loss")
        // No click at either end: no sample steps further from its neighbour than the 440 Hz sine itself moves
        // (0.031 at 0.5) and a little more (a step to silence from the tone would be up to 0.5).
        func steepest(_ r: Range<Int>) -> Float { r.dropFirst().map { abs(sim.output[$0] - sim.output[$0 - 1]) }.max() ?? 0 }
        let pause = 500 * 128
        #expect(steepest((pause - 128)..<(pause + 256)) < 0.05, "the pause stepped to silence")
        #expect(sim.output[(pause - 128)..<pause].contains { abs($0) > 0.3 }, "the tone played up to the pause")
        // Silence exactly while held, from the end of the fading block.
        #expect(sim.output[(501 * 128)..<(900 * 128)].allSatisfy { $0 == 0 })
        #expect(steepest((900 * 128)..<(sim.output.count - 1)) < 0.05, "playing again stepped out of the silence")
        // Concealment: only what starting a stream costs, not the pause.
        #expect(s.concealedFrames < 1024, "\(s.concealedFrames)")
        // Playing again, at the latency it had before: no backlog.
        let before = sim.stats[40..<50].map(\.bufferedMilliseconds).max()!
        let after = sim.stats[(sim.stats.count - 20)...].map(\.bufferedMilliseconds)
        #expect(after.allSatisfy { $0 <= before + 3 }, "before \(before) ms, after \(after)")
        let tail = sim.output[(sim.output.count - 4096)...]
        #expect(tail.map { $0 * $0 }.reduce(0, +) / Float(tail.count) > 0.1, "the tone plays after the hold")
        #expect(!s.held)
    }
}
