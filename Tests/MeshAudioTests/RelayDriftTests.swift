import Testing
@testable import MeshAudio

/// Least-squares fit of a·sin + b·cos + dc at angular frequency `w` (rad/sample); returns SNR in dB.
func relaySNR(_ y: [Float], w: Double) -> Double {
    // Normal equations for 3 unknowns.
    var m = [[Double]](repeating: [0, 0, 0], count: 3), r = [0.0, 0.0, 0.0]
    var basis = [[Double]]()
    basis.reserveCapacity(y.count)
    for i in 0..<y.count {
        let v = [relaySin(w * Double(i)), relayCos(w * Double(i)), 1]
        basis.append(v)
        for a in 0..<3 { r[a] += v[a] * Double(y[i]); for b in 0..<3 { m[a][b] += v[a] * v[b] } }
    }
    // Gaussian elimination.
    for c in 0..<3 {
        for rr in (c + 1)..<3 {
            let f = m[rr][c] / m[c][c]
            for k in c..<3 { m[rr][k] -= f * m[c][k] }
            r[rr] -= f * r[c]
        }
    }
    var x = [0.0, 0.0, 0.0]
    for c in stride(from: 2, through: 0, by: -1) {
        var s = r[c]
        for k in (c + 1)..<3 { s -= m[c][k] * x[k] }
        x[c] = s / m[c][c]
    }
    var sig = 0.0, err = 0.0
    for i in 0..<y.count {
        let fit = basis[i][0] * x[0] + basis[i][1] * x[1] + basis[i][2] * x[2]
        sig += fit * fit
        err += (Double(y[i]) - fit) * (Double(y[i]) - fit)
    }
    return 10 * log10ish(sig / max(err, 1e-30))
}

/// log10 without Foundation (enough precision for dB reports).
func log10ish(_ x: Double) -> Double {
    guard x.isFinite else { return x.isNaN ? -999 : 999 }
    guard x > 0 else { return -999 }
    var e = 0.0, v = x
    while v >= 10 { v /= 10; e += 1 }
    while v < 1 { v *= 10; e -= 1 }
    // ln(v)/ln(10) via atanh series.
    let t = (v - 1) / (v + 1), t2 = t * t
    var term = t, sum = 0.0
    for k in 0..<40 { sum += term / Double(2 * k + 1); term *= t2 }
    return e + 2 * sum / 2.302585092994046
}

/// Best SNR over a frequency search around `w0` (the drift-corrected output's frequency is not known exactly).
func relayBestSNR(_ y: [Float], around w0: Double, span: Double) -> (snr: Double, w: Double) {
    var lo = w0 - span, hi = w0 + span
    for _ in 0..<60 {  // golden-section on the (unimodal near the peak) SNR
        let a = lo + (hi - lo) * 0.382, b = lo + (hi - lo) * 0.618
        if relaySNR(y, w: a) > relaySNR(y, w: b) { hi = b } else { lo = a }
    }
    let w = (lo + hi) / 2
    return (relaySNR(y, w: w), w)
}

@Suite("Relay drift control and resampling")
struct RelayDriftTests {
    /// An hour at period granularity: the real DriftController against a model of the chain (packets of 128
    /// frames from a sender clock at rate·(1+ppm), renders of 128 frames at the receiver's rate, latency measured
    /// exactly as the JitterBuffer does: newest end + time since its arrival − playout point; the correction is
    /// quantized to the resampler's 1/65536 steps as in the real chain).
    static func simulateHour(ppm: Double) -> (maxErrorMs: Double, maxTrueErrorMs: Double, finalPPM: Double) {
        let rate = 44_100.0, n = 128.0, block = 128
        let sender = rate * (1 + ppm * 1e-6)
        var ctl = DriftController(sampleRate: 44_100)
        let target = 400.0
        var playout = 0.0, arrived = 0.0
        var maxErr = 0.0, maxTrue = 0.0
        let renders = Int(3600 * rate / Double(block))
        let t0 = target / rate
        for j in 0..<renders {
            let t = t0 + Double(j * block) / rate
            arrived = (t * sender / n).rounded(.down)         // packets whose last frame was captured by now
            let newestEnd = arrived * n, newestArrival = newestEnd / sender
            let latency = newestEnd + (t - newestArrival) * rate - playout
            let error = latency - target
            let ppmNow = ctl.update(errorFrames: error, elapsedFrames: block)
            if t > 60 {
                maxErr = max(maxErr, abs(error) / rate * 1000)
                // True latency of the frame at the playout point vs. the one at the start.
                let trueLatency = t - playout / sender
                maxTrue = max(maxTrue, abs(trueLatency - target / rate) * 1000)
            }
            playout += Double(block) * (ctl.engaged ? 1 + SpeexResampler.quantizedPPM(ppmNow) * 1e-6 : 1)
        }
        return (maxErr, maxTrue, ctl.correctionPPM)
    }

    @Test(arguments: [200.0, -200.0])
    func hourAtDriftStaysWithinOneMillisecond(ppm: Double) {
        let r = Self.simulateHour(ppm: ppm)
        print("drift \(ppm) ppm over 1 h: max latency error \(r.maxErrorMs) ms, true \(r.maxTrueErrorMs) ms, correction \(r.finalPPM) ppm")
        #expect(r.maxErrorMs <= 1)
        #expect(r.maxTrueErrorMs <= 1)
        #expect(abs(r.finalPPM - ppm) < 16)   // within one 15.26 ppm resampler step
    }

    @Test func sameClockKeepsRatioExactlyOne() {
        var ctl = DriftController(sampleRate: 44_100)
        for j in 0..<100_000 { ctl.update(errorFrames: Double(j % 7) - 3, elapsedFrames: 128) }
        #expect(!ctl.engaged && ctl.ratio == 1.0 && ctl.correctionPPM == 0)
    }

    @Test(arguments: [200.0, -200.0, 1000.0])
    func resamplerSineSNRAbove60dB(ppm: Double) throws {
        let r = try SpeexResampler(channels: 1, inputRate: 44_100, outputRate: 44_100)
        let applied = try r.setCorrection(ppm: ppm)
        #expect(abs(applied - ppm) <= 7.7)
        let input = relaySine(start: 0, count: 44_100, frequency: 997)
        var output = [Float](repeating: 0, count: 44_100)
        var consumed = 0, produced = 0
        while consumed < input.count - 256 {
            let res = try input.withUnsafeBufferPointer { i in
                try output.withUnsafeMutableBufferPointer { o in
                    try r.process(input: UnsafeBufferPointer(rebasing: i[consumed..<min(consumed + 128, i.count)]),
                                  output: UnsafeMutableBufferPointer(rebasing: o[produced..<min(produced + 128, o.count)]))
                }
            }
            consumed += res.consumed; produced += res.produced
            if res.produced == 0 && res.consumed == 0 { break }
        }
        let tail = Array(output[2000..<(produced - 200)])
        let w = 2 * Double.pi * 997 / 44_100 * r.ratio
        let snr = relaySNR(tail, w: w)
        print("speex q5 at \(ppm) ppm: SNR \(snr) dB")
        #expect(snr >= 60)
    }
}
