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
}
