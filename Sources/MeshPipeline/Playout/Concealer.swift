import MeshAudio

/// Per-frame marks a `JitterBuffer` read hands to the `Concealer`.
public enum FrameMark {
    /// The frame never arrived: synthesize it.
    public static let missing: UInt8 = 0
    /// A real frame continuing the previous one.
    public static let present: UInt8 = 1
    /// A real frame that does not continue the previous output (start of stream, resync, skip): crossfade into it.
    public static let discontinuity: UInt8 = 2
    /// No stream (idle, or priming after a restart): silence — whatever was playing fades out first. Not counted
    /// as concealment.
    public static let silent: UInt8 = 3
}

/// Packet-loss concealment: a missing frame is never plain silence with clicks.
///
/// When frames go missing, the concealer finds the dominant period of the last output (normalized
/// autocorrelation over 1–14 ms lags, mono mix) and keeps repeating the last period of the waveform, at full
/// level for `holdMilliseconds`, then fading linearly to silence over `fadeOutMilliseconds`. When real audio
/// resumes (or jumps — a `.discontinuity` mark), it crossfades (raised cosine, `fadeInMilliseconds`) from the
/// synthetic continuation into the real frames. A crossfade cut short (frames go missing again, the stream jumps
/// or stops) never snaps back to the old synthetic voice: the blend is frozen into the new synthetic period, or
/// bridged with a fading offset. Neither the loop's seam correction nor the bridge makes the synthetic voice louder
/// than what it continues (each is kept within the peak of the output it is made from), so neither adds an overshoot
/// (a pop, or on a loud signal clipping). `.silent` frames fade out whatever was playing (after a resync)
/// without counting as concealment. Preallocated: `process` never allocates.
public struct Concealer {
    /// Frame layout.
    public let channels: Int
    private let minLag: Int, maxLag: Int, window: Int
    private let holdFrames: Int, fadeOutFrames: Int, fadeInFrames: Int
    private let historyFrames: Int
    private var history: [Float]       // ring of the last `historyFrames` output frames
    private var historyWrite = 0       // next frame slot to write
    private var cycle: [Float]         // the period being repeated
    private var mono: [Float]          // scratch for the pitch search
    private var lag = 1
    private var cyclePos = 0
    private var synthFrames = 0        // frames synthesized since the loss began
    private var concealing = false     // a synthetic continuation is running
    private var fadeInLeft = 0         // frames of crossfade left (only while a real frame follows synthesis)
    private var quietFrames: Int       // consecutive exactly-zero output frames (capped at historyFrames)
    private var fadeReal: [Float]      // ring of the real frames of the current crossfade (newest maxLag)
    private var fadeRealWrite = 0
    private var fadeRealCount = 0
    private var scratchCycle: [Float]
    private var offset: [Float]        // per channel: the gap between the output and the synthetic voice, fading
    private var offsetPeak: [Float]    // per channel: the bridged voice stays within this (the louder of the two)
    private var offsetLeft = 0
    private var preceding: [Float]     // per channel: the frame before the cycle's first (`makeCycleSeamless`)
    private let offsetFrames: Int
    /// Frames synthesized so far (each missing frame counts once).
    public private(set) var concealedFrames: UInt64 = 0

    /// Sizes everything for `format`.
    public init(format: AudioFormat, holdMilliseconds: Double = 10, fadeOutMilliseconds: Double = 40,
                fadeInMilliseconds: Double = 4)
    {
        let rate = Double(format.sampleRate)
        channels = format.channels
        minLag = max(2, Int(rate / 1000))
        maxLag = max(minLag + 1, Int(rate / 70))
        window = max(8, Int(rate / 200))
        holdFrames = Int(rate * holdMilliseconds / 1000)
        fadeOutFrames = max(1, Int(rate * fadeOutMilliseconds / 1000))
        fadeInFrames = max(1, Int(rate * fadeInMilliseconds / 1000))
        historyFrames = maxLag + window
        history = [Float](repeating: 0, count: historyFrames * channels)
        cycle = [Float](repeating: 0, count: maxLag * channels)
        mono = [Float](repeating: 0, count: historyFrames)
        quietFrames = historyFrames
        fadeReal = [Float](repeating: 0, count: maxLag * channels)
        scratchCycle = [Float](repeating: 0, count: maxLag * channels)
        offset = [Float](repeating: 0, count: channels)
        offsetPeak = [Float](repeating: 0, count: channels)
        preceding = [Float](repeating: 0, count: channels)
        offsetFrames = max(1, Int(rate * 0.003))
    }

    /// Forgets the past (new stream): the next concealment starts from silence.
    public mutating func reset() {
        for i in history.indices { history[i] = 0 }
        historyWrite = 0
        concealing = false
        fadeInLeft = 0
        synthFrames = 0
        quietFrames = historyFrames
    }

    /// Conceals in place: `block` holds `frames` interleaved frames, `marks[i]` says what frame `i` is
    /// (`FrameMark`). Missing frames are synthesized; real frames after synthesis are crossfaded in. Returns the
    /// number of frames synthesized.
    @discardableResult
    public mutating func process(_ block: UnsafeMutableBufferPointer<Float>, marks: UnsafeBufferPointer<UInt8>,
                                 frames: Int) -> Int
    {
        var synthesized = 0
        let ch = channels
        for f in 0..<frames {
            let mark = marks[f]
            let base = f * ch
            // A crossfade is in progress when concealing with fade-in frames left. Never switch back to the old
            // synthetic continuation mid-fade (that jumps by up to the full fade weight): freeze the mixture.
            let crossfading = concealing && fadeInLeft > 0
            if crossfading && mark != FrameMark.present { interruptCrossfade() }
            if mark == FrameMark.missing {
                if !concealing { beginConcealment() }
                fadeInLeft = 0
                let g = gain()
                for c in 0..<ch { block[base + c] = synthetic(c, gain: g) }
                advanceSynth()
                synthesized += 1
            } else if mark == FrameMark.silent {
                if !concealing {
                    if quietFrames >= historyFrames {
                        // Already silent: stay silent.
                        for c in 0..<ch { block[base + c] = 0 }
                    } else {
                        // Fade out what was playing (no hold).
                        beginConcealment()
                        synthFrames = holdFrames
                    }
                }
                if crossfading { synthFrames = max(synthFrames, holdFrames) }
                fadeInLeft = 0
                if concealing {
                    let g = gain()
                    for c in 0..<ch { block[base + c] = synthetic(c, gain: g) }
                    advanceSynth()
                }
            } else {
                if mark == FrameMark.discontinuity {
                    if !concealing { beginConcealment() }
                    fadeInLeft = fadeInFrames
                    fadeRealCount = 0
                } else if concealing && fadeInLeft == 0 {
                    fadeInLeft = fadeInFrames
                    fadeRealCount = 0
                }
                if concealing {
                    for c in 0..<ch { fadeReal[fadeRealWrite * ch + c] = block[base + c] }
                    fadeRealWrite += 1
                    if fadeRealWrite == maxLag { fadeRealWrite = 0 }
                    fadeRealCount = min(fadeRealCount + 1, maxLag)
                    // Raised-cosine crossfade from the synthetic continuation to the real frame.
                    let x = Float(fadeInFrames - fadeInLeft + 1) / Float(fadeInFrames + 1)
                    let w = 0.5 - 0.5 * _cosApprox(Float.pi * x)
                    let g = gain()
                    for c in 0..<ch {
                        block[base + c] = w * block[base + c] + (1 - w) * synthetic(c, gain: g)
                    }
                    advanceSynth()
                    fadeInLeft -= 1
                    if fadeInLeft == 0 { concealing = false }
                }
            }
            var quiet = true
            for c in 0..<ch where block[base + c] != 0 { quiet = false }
            quietFrames = quiet ? min(quietFrames + 1, historyFrames) : 0
            // Remember what was output.
            let h = historyWrite * ch
            for c in 0..<ch { history[h + c] = block[base + c] }
            historyWrite += 1
            if historyWrite == historyFrames { historyWrite = 0 }
        }
        concealedFrames &+= UInt64(synthesized)
        return synthesized
    }

    /// A crossfade from the synthetic continuation into real frames is cut short (frames go missing again, the
    /// stream jumps or stops). The output is then `w·real + (1−w)·g·synthetic`; freeze that mixture: when the
    /// crossfade has seen a whole period of real frames, the new synthetic period is the same mixture of the last
    /// real period and the running synthetic one (continuous in value and slope); otherwise the running
    /// synthetic voice goes on with a fading offset bridging the gap.
    private mutating func interruptCrossfade() {
        let ch = channels
        guard fadeRealCount > lag else {
            // Less than a period of real frames: go on with the running synthetic voice, bridging the gap
            // between it and the last output with an offset that fades out over `offsetFrames` (continuous in
            // value; the slope changes by at most the blend's).
            var last = historyWrite - 1
            if last < 0 { last += historyFrames }
            var prev = cyclePos - 1
            if prev < 0 { prev += lag }
            let g = gain()
            for c in 0..<ch {
                // The whole gap from the synthetic voice itself: a bridge still fading (cut short again within
                // `offsetFrames`) is taken into the new one, not dropped (which stepped by what was left of it).
                offset[c] = history[last * ch + c] - g * cycle[prev * ch + c]
                // The bridge runs from the last output to the synthetic voice, no louder than either was: a rising
                // offset on a falling voice (phases apart) would otherwise overshoot both.
                var peak: Float = 0
                var h = last
                for _ in 0..<lag {
                    peak = max(peak, abs(history[h * ch + c]))
                    h = h == 0 ? historyFrames - 1 : h - 1
                }
                for j in 0..<lag { peak = max(peak, abs(g * cycle[j * ch + c])) }
                offsetPeak[c] = peak
            }
            offsetLeft = offsetFrames
            fadeInLeft = 0
            concealing = true
            return
        }
        let x = Float(fadeInFrames - fadeInLeft) / Float(fadeInFrames + 1)   // weight of the last blended frame
        let w = 0.5 - 0.5 * _cosApprox(Float.pi * x)
        let g = gain()
        var src = fadeRealWrite - lag
        if src < 0 { src += maxLag }
        var pos = cyclePos
        for j in 0..<lag {
            for c in 0..<ch {
                scratchCycle[j * ch + c] = w * fadeReal[src * ch + c] + (1 - w) * g * cycle[pos * ch + c]
            }
            src += 1
            if src == maxLag { src = 0 }
            pos += 1
            if pos == lag { pos = 0 }
        }
        // The mixture one frame before the new cycle, for a seamless loop.
        var before = fadeRealWrite - lag - 1
        if before < 0 { before += maxLag }
        var prevPos = cyclePos - 1
        if prevPos < 0 { prevPos += lag }
        for c in 0..<ch {
            preceding[c] = w * fadeReal[before * ch + c] + (1 - w) * g * cycle[prevPos * ch + c]
        }
        for i in 0..<(lag * ch) { cycle[i] = scratchCycle[i] }
        makeCycleSeamless()
        offsetLeft = 0
        cyclePos = 0
        synthFrames = 0
        fadeInLeft = 0
        concealing = true
    }

    /// Makes the repeated period loop without a step. The cycle is the last `lag` frames played, so its last frame
    /// is the frame just played, and both the first synthetic frame and every wrap of the loop step from
    /// `cycle[lag - 1]` to `cycle[0]`. That step is natural only when the waveform was periodic over the cycle; after
    /// a crossfade between two phases, or with a lag that is a poor fit, it can be most of full scale, a click on
    /// each wrap. `preceding` holds the frame that came before `cycle[0]`: `cycle[0]` is moved so that it follows
    /// `cycle[lag - 1]` as it followed `preceding`, and the correction ramps to nothing across the cycle.
    private mutating func makeCycleSeamless() {
        let ch = channels
        let last = (lag - 1) * ch
        for c in 0..<ch {
            let d = cycle[last + c] - preceding[c]
            guard d != 0 else { continue }
            // No louder than the period was: where the period was not periodic (a level that ramps, as a fade-in
            // does), the correction would otherwise push its peaks past anything played, looped for the whole
            // concealment (on a loud cycle, into clipping).
            var peak: Float = 0
            for j in 0..<lag { peak = max(peak, abs(cycle[j * ch + c])) }
            for j in 0..<lag {
                let v = cycle[j * ch + c] + d * Float(lag - j) / Float(lag)
                cycle[j * ch + c] = min(max(v, -peak), peak)
            }
        }
        // Within full scale (NaN and infinities too).
        let count = lag * ch
        _ = cycle.withUnsafeMutableBufferPointer { AudioPacket.sanitize(UnsafeMutableBufferPointer(rebasing: $0[0..<count])) }
    }

    private func gain() -> Float {
        if synthFrames < holdFrames { return 1 }
        let t = synthFrames - holdFrames
        return t >= fadeOutFrames ? 0 : 1 - Float(t) / Float(fadeOutFrames)
    }

    /// The fading bridge offset for channel `c` (0 when none).
    @inline(__always)
    private func offsetTerm(_ c: Int) -> Float {
        offsetLeft > 0 ? offset[c] * Float(offsetLeft) / Float(offsetFrames) : 0
    }

    /// The synthetic voice of channel `c` now, at gain `g`: the cycle, and while a bridge fades (`offsetLeft`), its
    /// offset, kept within the bridge's peak.
    @inline(__always)
    private func synthetic(_ c: Int, gain g: Float) -> Float {
        let v = g * cycle[cyclePos * channels + c]
        guard offsetLeft > 0 else { return v }
        return min(max(v + offsetTerm(c), -offsetPeak[c]), offsetPeak[c])
    }

    private mutating func advanceSynth() {
        if offsetLeft > 0 { offsetLeft -= 1 }
        cyclePos += 1
        if cyclePos == lag { cyclePos = 0 }
        if synthFrames < Int.max { synthFrames += 1 }
    }

    /// Picks the repetition period and snapshots the last period of output into `cycle`.
    private mutating func beginConcealment() {
        let ch = channels
        // Oldest-first mono mix of the history.
        var k = historyWrite
        for i in 0..<historyFrames {
            var s: Float = 0
            for c in 0..<ch { s += history[k * ch + c] }
            mono[i] = s
            k += 1
            if k == historyFrames { k = 0 }
        }
        let end = historyFrames
        var bestLag = maxLag, bestScore: Float = -2
        var energyA: Float = 0
        for i in (end - window)..<end { energyA += mono[i] * mono[i] }
        if energyA > 1e-12 {
            for L in minLag...maxLag {
                var cross: Float = 0, energyB: Float = 0
                let off = end - window - L
                for i in 0..<window {
                    let b = mono[off + i]
                    cross += mono[end - window + i] * b
                    energyB += b * b
                }
                let score = energyB > 1e-12 ? cross / (energyA * energyB).squareRoot() : -1
                if score > bestScore {
                    bestScore = score
                    bestLag = L
                }
            }
        }
        lag = bestLag
        // cycle[j] = output frame (end - lag + j), oldest-first; `preceding` is the frame before it.
        var src = historyWrite - lag
        if src < 0 { src += historyFrames }
        var before = src - 1
        if before < 0 { before += historyFrames }
        for c in 0..<ch { preceding[c] = history[before * ch + c] }
        for j in 0..<lag {
            for c in 0..<ch { cycle[j * ch + c] = history[src * ch + c] }
            src += 1
            if src == historyFrames { src = 0 }
        }
        makeCycleSeamless()
        cyclePos = 0
        synthFrames = 0
        offsetLeft = 0
        concealing = true
    }
}

/// cos(x) for x in [0, π] without Foundation (accurate to ~1e-6; only used for crossfade weights).
@inline(__always)
func _cosApprox(_ x: Float) -> Float {
    // cos(x) = -sin(x - π/2); Taylor series of sin around 0 on [-π/2, π/2].
    let y = x - Float.pi / 2
    let y2 = y * y
    let s = y * (1 - y2 / 6 * (1 - y2 / 20 * (1 - y2 / 42 * (1 - y2 / 72 * (1 - y2 / 110)))))
    return -s
}

extension Concealer: FrameStage {
    /// Conceals the block in place (see `process(_:marks:frames:)`).
    public mutating func process(_ block: FrameBlock, feedback: Void) {
        process(block.samples, marks: UnsafeBufferPointer(block.marks), frames: block.frames)
    }
}
