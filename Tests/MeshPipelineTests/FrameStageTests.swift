import Testing
import MeshAudio
@testable import MeshPipeline

/// The frame stages of the playout chain, alone: the jitter buffer's `FrameStage` form and the drift resampler.
@Suite("Frame stages")
struct FrameStageTests {
    @Test func theJitterBufferStageReadsWithWhatIsQueuedDownstreamAndTheDriftOffset() {
        var direct = JitterBuffer(format: .default, configuration: .init(mode: .fixed(milliseconds: 5)))
        var staged = direct
        var directOut: [[Float]] = [], stagedOut: [[Float]] = []
        for k in 0..<40 {
            let (_, h, s) = relayIndexPacket(first: UInt64(k * 128), frames: 128, sequence: UInt32(k))
            let now = relayNanos(Double(k * 128))
            direct.insert(h, s, arrival: now)
            staged.insert(h, s, arrival: now)
            directOut.append(direct.read(frames: 128, now: now, pipeline: 100 + 20).samples)
            var samples = [Float](repeating: -1, count: 128), marks = [UInt8](repeating: 9, count: 128)
            samples.withUnsafeMutableBufferPointer { sp in
                marks.withUnsafeMutableBufferPointer { mp in
                    staged.process(FrameBlock(samples: sp, marks: mp, frames: 128, nowNanos: now, downstreamFrames: 100),
                                   feedback: .init(steadyOffsetFrames: 20, holdStart: false))
                }
            }
            stagedOut.append(samples)
        }
        #expect(directOut == stagedOut)
        #expect(staged.isPlaying)
    }

    static let steadyBypass = DriftSteering(measuredLatencyFrames: 0, steadyLatencyFrames: 0, correctionPPM: 0,
                                            engaged: false, floorsReady: true)

    /// An upstream stage counting 0, 1, 2… and noting what each pull said was queued downstream.
    struct Ramp: FrameStage {
        var next: Float = 0
        var downstream: [Double] = []
        mutating func process(_ block: FrameBlock, feedback: Void) {
            downstream.append(block.downstreamFrames)
            for i in 0..<block.frames {
                block.samples[i] = next
                next += 1
            }
        }
    }

    /// An upstream stage playing the tests' 440 Hz sine.
    struct Sine: FrameStage {
        var frame = 0
        mutating func process(_ block: FrameBlock, feedback: Void) {
            for i in 0..<block.frames {
                block.samples[i] = Float(0.5 * relaySin(2 * Double.pi * 440 * Double(frame) / 44_100))
                frame += 1
            }
        }
    }

    @Test func bypassIsBitExactAndReportsWhatIsQueued() throws {
        let resampler = try DriftResampler(format: .default, maximumPeriodFrames: 256, quality: 5, maximumCorrectionPPM: 1000)
        var ramp = Ramp()
        var played: [Float] = []
        var out = [Float](repeating: 0, count: 128)
        for _ in 0..<10 {
            out.withUnsafeMutableBufferPointer { o in
                resampler.render(into: o.baseAddress!, frames: 128, nowNanos: 0, steering: Self.steadyBypass,
                                 from: &ramp, feedback: ())
            }
            played += out
        }
        #expect(played == (0..<1280).map(Float.init))
        #expect(!resampler.isResampling && resampler.lookAheadFrames == 0 && resampler.stagedFrames == 0)
        #expect(ramp.downstream.count == 10 && ramp.downstream.allSatisfy { $0 == 0 })
    }

    @Test func engagingSwitchesToTheResamplerWithoutAClick() throws {
        let resampler = try DriftResampler(format: .default, maximumPeriodFrames: 256, quality: 5, maximumCorrectionPPM: 1000)
        var sine = Sine()
        var output: [Float] = []
        var out = [Float](repeating: 0, count: 128)
        for block in 0..<100 {
            let engaged = block >= 50
            var steering = Self.steadyBypass
            steering.engaged = engaged
            steering.correctionPPM = engaged ? 100 : 0
            if block == 40 { steering.correctionPPM = nil }   // no stream playing: the ratio is left alone
            out.withUnsafeMutableBufferPointer { o in
                resampler.render(into: o.baseAddress!, frames: 128, nowNanos: 0, steering: steering, from: &sine, feedback: ())
            }
            output += out
        }
        #expect(resampler.isResampling && resampler.lookAheadFrames > 0)
        #expect(abs(resampler.ratio - (1 + SpeexResampler.quantizedPPM(100) * 1e-6)) < 1e-12)
        let bypassed = 50 * 128
        #expect(Array(output[0..<bypassed]) == relaySine(start: 0, count: bypassed), "bit-exact before engaging")
        let step: Float = 0.5 * 2 * .pi * 440 / 44_100
        var jump: Float = 0
        for i in 1..<output.count { jump = max(jump, abs(output[i] - output[i - 1])) }
        #expect(jump < 1.1 * step, "the switch leaves no click")
    }
}
