import Testing
import MeshAudio
@testable import MeshPipeline

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
    /// Result of a `simulate` run.
    struct ModelRun {
        var maxSteadyErrorMs = 0.0      // |steady latency − target| after the settle time
        var maxTrueErrorMs = 0.0        // |true capture-to-playout latency − its intended value| after settling
        var finalPPM = 0.0
        var estimatedPPM = 0.0
        var everEngaged = false
        var engagedAtSeconds: Double?
    }

    /// The real DriftController against a model of the chain, at render granularity, with realistic jitter:
    /// packets of 128 frames from a sender clock at rate·(1+ppm), network delay 1 ms + uniform 0…`arrivalJitterMs`
    /// plus a `spikeMs` spike on a `spikeProbability` of packets (arrivals reorder freely); renders of 128 frames at
    /// the receiver's rate, each call late by uniformly 0…2·`renderJitterMs` (a ±`renderJitterMs` spread; a device
    /// never calls before its schedule). Latency is measured exactly as the
    /// renderer does (newest end + time since its arrival − playout point), de-jittered with the controller's
    /// floors; the correction is quantized to the resampler's 1/65536 steps as in the real chain.
    static func simulate(ppm: Double, seconds: Double, arrivalJitterMs: Double = 2, spikeMs: Double = 5,
                         spikeProbability: Double = 0.01, renderJitterMs: Double = 1, settleSeconds: Double = 60,
                         seed: UInt64 = 1) -> ModelRun {
        let rate = 44_100.0, n = 128, block = 128
        let sender = rate * (1 + ppm * 1e-6)
        var rng = RelayRNG(seed: seed)
        var ctl = DriftController(sampleRate: 44_100)
        let target = 441.0                                  // 10 ms
        let baseDelay = 1e6                                 // ns
        let t0 = 1e9 + baseDelay + target / rate * 1e9      // first render (ideal), ns
        let renders = Int(seconds * rate / Double(block))
        // Packet arrivals (ns), in arrival order with their end frame.
        let packets = Int((seconds + 2) * sender / Double(n)) + 8
        var arrivals: [(at: Double, end: Int)] = []
        arrivals.reserveCapacity(packets)
        for k in 0..<packets {
            let captured = 1e9 + Double((k + 1) * n) / sender * 1e9
            var d = baseDelay + Double.random(in: 0...arrivalJitterMs, using: &rng) * 1e6
            if Double.random(in: 0..<1, using: &rng) < spikeProbability { d += spikeMs * 1e6 }
            arrivals.append((captured + d, (k + 1) * n))
        }
        arrivals.sort { $0.at < $1.at }
        var qi = 0
        var newestEnd = 0, newestArrival = 0.0
        var playout = 0.0
        var run = ModelRun()
        for j in 0..<renders {
            let ideal = t0 + Double(j * block) / rate * 1e9
            let now = ideal + Double.random(in: 0...(2 * renderJitterMs), using: &rng) * 1e6   // never early
            let nowNanos = UInt64(now)
            while qi < arrivals.count && arrivals[qi].at <= now {
                let a = arrivals[qi]
                ctl.noteArrival(transitNanos: a.at - Double(a.end) / rate * 1e9, atNanos: UInt64(a.at))
                if a.end > newestEnd { newestEnd = a.end; newestArrival = a.at }
                qi += 1
            }
            let lateness = now - Double(j * block) / rate * 1e9
            ctl.noteRender(latenessNanos: lateness, atNanos: nowNanos)
            let raw = Double(newestEnd) - playout + max(0, now - newestArrival) * rate / 1e9
            let steady = ctl.steadyLatency(rawFrames: raw, latenessNanos: lateness,
                                           newestTransitNanos: newestArrival - Double(newestEnd) / rate * 1e9,
                                           atNanos: nowNanos)
            let ppmNow = ctl.update(steadyLatencyFrames: steady, targetFrames: target, nowNanos: nowNanos)
            if ctl.engaged && run.engagedAtSeconds == nil { run.engagedAtSeconds = Double(j * block) / rate }
            run.everEngaged = run.everEngaged || ctl.engaged
            if Double(j * block) / rate > settleSeconds {
                run.maxSteadyErrorMs = max(run.maxSteadyErrorMs, abs(steady - target) / rate * 1000)
                // True latency of the frame at the playout point (ideal render time − its capture time) vs. the
                // intended one (network floor + target).
                let trueLatency = (ideal - 1e9) / 1e9 - playout / sender
                run.maxTrueErrorMs = max(run.maxTrueErrorMs, abs(trueLatency - (baseDelay / 1e9 + target / rate)) * 1000)
            }
            playout += Double(block) * (ctl.engaged ? 1 + SpeexResampler.quantizedPPM(ppmNow) * 1e-6 : 1)
        }
        run.finalPPM = ctl.correctionPPM
        run.estimatedPPM = ctl.estimatedDriftPPM
        return run
    }

    @Test(arguments: [200.0, -200.0])
    func hourAtDriftStaysWithinOneMillisecond(ppm: Double) {
        let r = Self.simulate(ppm: ppm, seconds: 3600)
        print("drift \(ppm) ppm over 1 h (jitter 0–2 ms + 5 ms spikes, render ±1 ms): engaged at \(r.engagedAtSeconds ?? -1) s, max steady latency error \(r.maxSteadyErrorMs) ms, true \(r.maxTrueErrorMs) ms, correction \(r.finalPPM) ppm, estimate \(r.estimatedPPM) ppm")
        #expect(r.maxSteadyErrorMs <= 1)
        #expect(r.maxTrueErrorMs <= 1)
        #expect(abs(r.estimatedPPM - ppm) < 5)
        #expect(abs(r.finalPPM - ppm) < 16)   // within one 15.26 ppm resampler step
    }

    @Test(arguments: [UInt64(1), 2, 3])
    func sameClockWithJitterNeverEngages(seed: UInt64) {
        // Ten minutes on one clock with heavy jitter (0–3 ms, 8 ms spikes on 3 % of packets, render ±1.5 ms).
        let r = Self.simulate(ppm: 0, seconds: 600, arrivalJitterMs: 3, spikeMs: 8, spikeProbability: 0.03,
                              renderJitterMs: 1.5, settleSeconds: 5, seed: seed)
        print("same clock, seed \(seed): engaged \(r.everEngaged), max steady latency error \(r.maxSteadyErrorMs) ms, estimate \(r.estimatedPPM) ppm")
        #expect(!r.everEngaged && r.finalPPM == 0)
        #expect(r.maxSteadyErrorMs < 0.2)
        #expect(abs(r.estimatedPPM) < 2)
    }

    @Test func sameClockLoadBurstsDoNotEngage() {
        // Floors pushed up for a while (every arrival 1 ms later for 3 s, every render 1 ms later for
        // 1.5 s, at different times): a temporary excursion that the deadband + confirmation time reject.
        var ctl = DriftController(sampleRate: 44_100)
        var engaged = false
        for j in 0..<(344 * 120) {
            let t = UInt64(j) * 2_902_494 + 1_000_000_000
            let s = Double(j) / 344
            let arrivalBump = (20..<23).contains(s) || (60..<63).contains(s) ? 1e6 : 0
            let renderBump = (40..<43).contains(s) ? 1e6 : 0
            ctl.noteArrival(transitNanos: 1e6 + arrivalBump, atNanos: t)
            ctl.noteRender(latenessNanos: renderBump, atNanos: t)
            ctl.update(steadyLatencyFrames: 441, targetFrames: 441, nowNanos: t)
            engaged = engaged || ctl.engaged
        }
        #expect(!engaged && ctl.ratio == 1.0 && ctl.correctionPPM == 0)
    }

    @Test func slidingMinimumForgetsOldSamples() {
        var m = SlidingMinimum(bucketNanos: 100, buckets: 3)
        #expect(m.minimum(atNanos: 0) == nil)
        m.add(5, atNanos: 10)
        m.add(7, atNanos: 150)
        #expect(m.minimum(atNanos: 250) == 5)
        #expect(m.minimum(atNanos: 300) == 7)   // bucket 0 left the window
        #expect(m.minimum(atNanos: 400) == nil)
        m.reset()
        #expect(m.minimum(atNanos: 150) == nil)
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

    /// The frames made from the input after its first second (which holds the filter's latency), and what the nominal
    /// rates make of that input: `seconds` of input, in blocks of 960 frames (an Opus frame at 48 kHz).
    private func framesOutPerNominal(inputRate: Int, outputRate: Int, seconds: Int, correctionPPM: Double = 0) throws -> (made: Int, nominal: Double) {
        let r = try SpeexResampler(channels: 1, inputRate: inputRate, outputRate: outputRate, maximumCorrectionPPM: 100)
        if correctionPPM != 0 { try r.setCorrection(ppm: correctionPPM) }
        let input = [Float](repeating: 0.25, count: 960)
        var output = [Float](repeating: 0, count: 2048)
        var fed = 0, produced = 0
        var first: (fed: Int, produced: Int)?
        while fed < inputRate * seconds {
            var offset = 0
            while offset < input.count {
                let res = try input.withUnsafeBufferPointer { i in
                    try output.withUnsafeMutableBufferPointer { o in
                        try r.process(input: UnsafeBufferPointer(rebasing: i[offset...]), output: o)
                    }
                }
                offset += res.consumed
                produced += res.produced
            }
            fed += input.count
            if first == nil, fed >= inputRate { first = (fed, produced) }
        }
        let start = first ?? (0, 0)
        return (produced - start.produced, Double(fed - start.fed) * Double(outputRate) / Double(inputRate))
    }

    @Test("48 kHz to 44.1 kHz and back for five minutes: exactly the nominal frames, not 10 ppm more (the ratio is not rounded)",
          arguments: [(48_000, 44_100), (44_100, 48_000)])
    func aRateConverterKeepsTheExactRatio(rates: (Int, Int)) throws {
        let (inRate, outRate) = rates
        let out = try framesOutPerNominal(inputRate: inRate, outputRate: outRate, seconds: 300)
        #expect(abs(Double(out.made) - out.nominal) <= 1.5, "\(out.made) frames made for \(out.nominal) nominal")
        // A correction still applies: +50 ppm consumes 50 ppm more, so makes fewer (to within the rounding of the
        // corrected ratio to 1/65536 of input frames: half a step of 65536·in/out).
        let corrected = try framesOutPerNominal(inputRate: inRate, outputRate: outRate, seconds: 300, correctionPPM: 50)
        let ppm = (Double(corrected.made) / corrected.nominal - 1) * 1e6
        let rounding = 0.5 / (65_536 * Double(inRate) / Double(outRate)) * 1e6
        #expect(abs(-ppm - SpeexResampler.quantizedPPM(50)) <= rounding + 0.5, "\(ppm) ppm")
    }
}
