/// The output level meter: the peak |sample| of each block played, held and decaying by about 20 dB per second.
/// Pure.
public struct LevelMeter: Sendable {
    /// Frames per second of what is measured.
    public let sampleRate: Int
    /// The held peak.
    public private(set) var peak: Float = 0

    /// A silent meter for `sampleRate` frames per second.
    public init(sampleRate: Int) { self.sampleRate = sampleRate }

    /// Measures `frames` frames of `samples` (interleaved, `frames × channels` samples).
    public mutating func measure(_ samples: UnsafeBufferPointer<Float>, frames: Int) {
        var blockPeak: Float = 0
        for v in samples { blockPeak = max(blockPeak, abs(v)) }
        let decay = 1 - min(1, Float(frames) * 2.3 / Float(sampleRate))   // ≈ 20 dB per second
        peak = max(blockPeak, peak * decay)
    }
}
