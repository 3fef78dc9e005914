import Testing
import MeshAudio
@testable import MeshPipeline

@Suite("Relay concealer")
struct RelayConcealerTests {
    static let gaps: [Range<Int>] = [5000..<5128, 10_000..<10_256, 20_000..<20_100, 30_000..<33_000]

    /// Runs a 440 Hz sine through the concealer in 128-frame blocks with `gaps` missing.
    static func conceal(channels: Int) -> (concealed: [Float], zeroFilled: [Float], count: UInt64) {
        let total = 44_100
        let input = relaySine(start: 0, count: total, channels: channels)
        var c = Concealer(format: AudioFormat(sampleRate: 44_100, channels: channels))
        var out = input, zero = input
        var marks = [UInt8](repeating: FrameMark.present, count: total)
        for g in gaps { for i in g { marks[i] = FrameMark.missing
            for ch in 0..<channels { out[i * channels + ch] = 0; zero[i * channels + ch] = 0 } } }
        out.withUnsafeMutableBufferPointer { o in
            marks.withUnsafeBufferPointer { m in
                var f = 0
                while f < total {
                    let n = min(128, total - f)
                    c.process(UnsafeMutableBufferPointer(rebasing: o[(f * channels)..<((f + n) * channels)]),
                              marks: UnsafeBufferPointer(rebasing: m[f..<(f + n)]), frames: n)
                    f += n
                }
            }
        }
        return (out, zero, c.concealedFrames)
    }

    static func maxJump(_ x: [Float], channels: Int) -> Float {
        var m: Float = 0
        for i in channels..<x.count { m = max(m, abs(x[i] - x[i - channels])) }
        return m
    }

    @Test(arguments: [1, 2])
    func boundaryJumpsFarBelowZeroFill(channels: Int) {
        let (concealed, zero, count) = Self.conceal(channels: channels)
        let ours = Self.maxJump(concealed, channels: channels)
        let zeros = Self.maxJump(zero, channels: channels)
        let natural = Float(0.5 * 2 * Double.pi * 440 / 44_100)   // the sine's own largest step
        print("concealment max jump \(ours) vs zero-fill \(zeros) (sine's own step \(natural))")
        #expect(ours <= zeros / 4)
        #expect(ours <= natural * 2)
        #expect(count == UInt64(Self.gaps.reduce(0) { $0 + $1.count }))
        // A long gap fades to silence (10 ms hold + 40 ms fade = 2205 frames) ...
        #expect(concealed[(32_300 * channels)..<(33_000 * channels)].allSatisfy { $0 == 0 })
        // ... and the short gaps are filled with signal, not silence.
        #expect(concealed[(5_000 * channels)..<(5_128 * channels)].map { abs($0) }.max()! > 0.4)
        // Real audio resumes exactly after the crossfade.
        let input = relaySine(start: 0, count: 44_100, channels: channels)
        #expect(Array(concealed[(33_200 * channels)...]) == Array(input[(33_200 * channels)...]))
    }

    @Test func discontinuityFadesInFromSilence() {
        var c = Concealer(format: .default)
        var block = relaySine(start: 1000, count: 512)   // starts mid-waveform
        var marks = [UInt8](repeating: FrameMark.present, count: 512)
        marks[0] = FrameMark.discontinuity
        block.withUnsafeMutableBufferPointer { b in
            marks.withUnsafeBufferPointer { m in _ = c.process(b, marks: m, frames: 512) } }
        #expect(abs(block[0]) < 0.01)
        #expect(Self.maxJump(block, channels: 1) < 0.05)
        #expect(c.concealedFrames == 0)
    }

    /// A skip to the opposite phase (a crossfade between two phases), then a lost packet that starts anywhere from
    /// mid-crossfade to 150 frames after it. The period repeated then holds part of the crossfade, where the
    /// waveform is not periodic; its loop must still be seamless (before it was, such a loss clicked on each wrap,
    /// up to 16× the sine's own step).
    @Test(arguments: [1, 2])
    func lossJustAfterACrossfadeLoopsSeamlessly(channels: Int) {
        let natural = Float(0.5 * 2 * Double.pi * 440 / 44_100)
        var worst: Float = 0, worstAt = 0
        for lossStart in stride(from: 2_020, to: 2_330, by: 7) {
            let total = 3_000
            // Frames 0..<2000 of the sine, then the sine 50 frames (half a period) further on.
            var out = relaySine(start: 0, count: 2_000, channels: channels) + relaySine(start: 2_050, count: total - 2_000, channels: channels)
            var marks = [UInt8](repeating: FrameMark.present, count: total)
            marks[2_000] = FrameMark.discontinuity
            for f in lossStart..<(lossStart + 128) { marks[f] = FrameMark.missing }
            var c = Concealer(format: AudioFormat(sampleRate: 44_100, channels: channels))
            out.withUnsafeMutableBufferPointer { o in
                marks.withUnsafeBufferPointer { m in
                    for f in stride(from: 0, to: total, by: 128) {
                        let n = min(128, total - f)
                        c.process(UnsafeMutableBufferPointer(rebasing: o[(f * channels)..<((f + n) * channels)]),
                                  marks: UnsafeBufferPointer(rebasing: m[f..<(f + n)]), frames: n)
                    }
                }
            }
            let jump = Self.maxJump(out, channels: channels)
            if jump > worst { (worst, worstAt) = (jump, lossStart) }
            #expect(c.concealedFrames == 128)
        }
        print("loss after a crossfade (\(channels) ch): worst step \(worst / natural)× the sine's, loss at \(worstAt)")
        #expect(worst < 1.5 * natural)
    }

    /// The loudest sample and the largest step between samples a concealer plays after its first 0.1 s, for a 440 Hz
    /// sine at 0.5 on `channels` channels with `marks` (in 128-frame blocks; the sine's phase jumps by `jump` at each
    /// discontinuity).
    static func loudestAndLargestStep(_ marks: [UInt8], channels: Int, jump: Double = 0) -> (loudest: Float, step: Float) {
        var c = Concealer(format: AudioFormat(sampleRate: 44_100, channels: channels))
        var phase = 0.0
        var out = [Float](repeating: 0, count: marks.count * channels)
        for f in marks.indices {
            if marks[f] == FrameMark.discontinuity { phase += jump }
            let v = Float(0.5 * relaySin(2 * Double.pi * 440 * Double(f) / 44_100 + phase))
            for ch in 0..<channels { out[f * channels + ch] = v }
        }
        out.withUnsafeMutableBufferPointer { o in
            marks.withUnsafeBufferPointer { m in
                var f = 0
                while f < marks.count {
                    let n = min(128, marks.count - f)
                    c.process(UnsafeMutableBufferPointer(rebasing: o[(f * channels)..<((f + n) * channels)]),
                              marks: UnsafeBufferPointer(rebasing: m[f..<(f + n)]), frames: n)
                    f += n
                }
            }
        }
        let body = Array(out[(4_410 * channels)...])
        return (body.map(abs).max() ?? 0, maxJump(body, channels: channels))
    }

    @Test("Concealment is never louder than what was played, nor steps harder than the tone: a gap, a gap after a return cut short or after a whole fade-in (bridged, or looped from a period whose level ramps), a bridge cut short again, a jump",
          arguments: [1, 2])
    func concealmentNeverOvershoots(channels: Int) {
        func present(_ n: Int) -> [UInt8] { Array(repeating: FrameMark.present, count: n) }
        func missing(_ n: Int) -> [UInt8] { Array(repeating: FrameMark.missing, count: n) }
        let natural = Float(0.5 * 2 * Double.pi * 440 / 44_100)   // the tone's largest step
        var loudest: Float = 0, loudestCase = "", step: Float = 0, stepCase = ""
        func check(_ marks: [UInt8], jump: Double = 0, _ name: @autoclosure () -> String) {
            let (l, s) = Self.loudestAndLargestStep(marks, channels: channels, jump: jump)
            if l > loudest { (loudest, loudestCase) = (l, name()) }
            if s > step { (step, stepCase) = (s, name()) }
        }
        for start in stride(from: 10_000, to: 10_101, by: 20) {      // where in the sine's period the loss falls
            for gap in [1, 20, 128, 300, 2_000] {
                check(present(start) + missing(gap) + present(12_000), "gap \(gap) at \(start)")
                check(present(start) + missing(gap) + [FrameMark.discontinuity] + present(12_000), jump: 1.5,
                      "gap \(gap) at \(start), then a jump")
                // Real frames for less than a period (a bridge), more (a frozen mixture), a whole fade-in (4 ms).
                for back in [1, 50, 99, 150, 176, 250] {
                    for gap2 in [1, 128] {
                        check(present(start) + missing(gap) + present(back) + missing(gap2) + present(12_000),
                              "gap \(gap) at \(start), \(back) back, gap \(gap2)")
                    }
                }
                // A bridge cut short again within its 3 ms.
                check(present(start) + missing(gap) + present(99) + missing(1) + present(1) + missing(20) + present(12_000),
                      "gap \(gap) at \(start), 99 back, 1 missing, 1 back, 20 missing")
            }
        }
        #expect(loudest <= 0.5 + 1e-3, "\(loudest) at \(loudestCase)")
        #expect(step < 1.5 * natural, "a step of \(step / natural)× the tone's at \(stepCase)")
    }
}
