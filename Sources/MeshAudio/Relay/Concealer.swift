/// Per-frame marks a `JitterBuffer` read hands to the `Concealer`.
public enum FrameMark {
    /// The frame never arrived: synthesize it.
    public static let missing: UInt8 = 0
    /// A real frame continuing the previous one.
    public static let present: UInt8 = 1
    /// A real frame that does not continue the previous output (start of stream, resync, skip): crossfade into it.
    public static let discontinuity: UInt8 = 2
}

/// Packet-loss concealment: a missing frame is never plain silence with clicks.
///
/// When frames go missing, the concealer finds the dominant period of the last output (normalized
/// autocorrelation over 1–14 ms lags, mono mix) and keeps repeating the last period of the waveform, at full
/// level for `holdMilliseconds`, then fading linearly to silence over `fadeOutMilliseconds`. When real audio
/// resumes (or jumps — a `.discontinuity` mark), it crossfades (raised cosine, `fadeInMilliseconds`) from the
/// synthetic continuation into the real frames. Preallocated: `process` never allocates.
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
    }

    /// Forgets the past (new stream): the next concealment starts from silence.
    public mutating func reset() {
        for i in history.indices { history[i] = 0 }
        historyWrite = 0
        concealing = false
        fadeInLeft = 0
        synthFrames = 0
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
            if mark == FrameMark.missing {
                if !concealing { beginConcealment() }
                fadeInLeft = 0
                let g = gain()
                for c in 0..<ch { block[base + c] = g * cycle[cyclePos * ch + c] }
                advanceSynth()
                synthesized += 1
            } else {
                if mark == FrameMark.discontinuity {
                    if !concealing { beginConcealment() }
                    fadeInLeft = fadeInFrames
                } else if concealing && fadeInLeft == 0 {
                    fadeInLeft = fadeInFrames
                }
                if concealing {
                    // Raised-cosine crossfade from the synthetic continuation to the real frame.
                    let x = Float(fadeInFrames - fadeInLeft + 1) / Float(fadeInFrames + 1)
                    let w = 0.5 - 0.5 * _cosApprox(Float.pi * x)
                    let g = gain()
                    for c in 0..<ch {
                        block[base + c] = w * block[base + c] + (1 - w) * g * cycle[cyclePos * ch + c]
                    }
                    advanceSynth()
                    fadeInLeft -= 1
                    if fadeInLeft == 0 { concealing = false }
                }
            }
            // Remember what was output.
            let h = historyWrite * ch
            for c in 0..<ch { history[h + c] = block[base + c] }
            historyWrite += 1
            if historyWrite == historyFrames { historyWrite = 0 }
        }
        concealedFrames &+= UInt64(synthesized)
        return synthesized
    }

    private func gain() -> Float {
        if synthFrames < holdFrames { return 1 }
        let t = synthFrames - holdFrames
        return t >= fadeOutFrames ? 0 : 1 - Float(t) / Float(fadeOutFrames)
    }

    private mutating func advanceSynth() {
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
        // cycle[j] = output frame (end - lag + j), oldest-first.
        var src = historyWrite - lag
        if src < 0 { src += historyFrames }
        for j in 0..<lag {
            for c in 0..<ch { cycle[j * ch + c] = history[src * ch + c] }
            src += 1
            if src == historyFrames { src = 0 }
        }
        cyclePos = 0
        synthFrames = 0
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
