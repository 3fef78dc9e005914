import CSpeexDSP

/// An error reported by libspeexdsp's resampler, with its `speex_resampler_strerror` text.
public struct SpeexResamplerError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The libspeexdsp `RESAMPLER_ERR_*` code.
    public var code: Int32
    /// What libspeexdsp says about it. Computed when read, so that raising the error on the render thread
    /// allocates nothing.
    public var message: String { speex_resampler_strerror(code).map { String(cString: $0) } ?? "unknown error" }
    public var description: String { "speex resampler: \(message) (code \(code))" }
}

/// An owned libspeexdsp resampler (`SpeexResamplerState`) for interleaved Float32; `deinit` destroys it.
///
/// This is the one file that talks to CSpeexDSP. The ratio is `inputRate·num/den : outputRate` expressed as a
/// fraction with denominator `ratioDenominator` = 65536: libspeexdsp rescales its fractional phase by
/// `den_new/den_old` in 32-bit arithmetic and fails with `RESAMPLER_ERR_OVERFLOW` when `den²` exceeds 2³², so a
/// correction is quantized to steps of 1/65536 ≈ 15.26 ppm (`quantizedPPM`); the drift controller's integral
/// action averages between neighbouring steps. All tables are allocated in `init` for the whole ±`maximumCorrectionPPM` range, so
/// `setRatio`, `process`, `prime` and `reset` do not allocate (as long as the correction stays in that range).
public final class SpeexResampler {
    /// Denominator used for fractional ratios (the largest libspeexdsp can rescale without overflow).
    public static let ratioDenominator: UInt32 = 65_536

    /// The correction `setCorrection(ppm:)` actually applies for a requested `ppm`.
    public static func quantizedPPM(_ ppm: Double) -> Double {
        let den = Double(ratioDenominator)
        return ((den * (1 + ppm * 1e-6)).rounded() / den - 1) * 1e6
    }
    /// Channels per frame.
    public let channels: Int
    /// Nominal input and output rates.
    public let inputRate: Int, outputRate: Int
    /// The speex quality (0...10).
    public let quality: Int
    private let state: OpaquePointer
    /// Current ratio numerator (input frames per `ratioDenominator` output frames, at equal nominal rates).
    public private(set) var ratioNumerator: UInt32

    /// Creates a resampler; throws if libspeexdsp refuses the arguments.
    public init(channels: Int, inputRate: Int, outputRate: Int, quality: Int = 5, maximumCorrectionPPM: Double = 1000)
        throws(SpeexResamplerError)
    {
        var err: Int32 = 0
        guard let st = speex_resampler_init(UInt32(channels), UInt32(inputRate), UInt32(outputRate), Int32(quality), &err)
        else { throw Self.error(err == 0 ? 1 : err) }
        self.state = st
        self.channels = channels
        self.inputRate = inputRate
        self.outputRate = outputRate
        self.quality = quality
        self.ratioNumerator = Self.ratioDenominator
        // Grow the interpolation tables now, at the largest ratio we will use, so later changes never allocate.
        let den = Self.ratioDenominator
        let maxNum = UInt32(Double(den) * (1 + maximumCorrectionPPM * 1e-6)) + 1
        try setRatio(numerator: maxNum)
        try setRatio(numerator: den - 1)
        try setRatio(numerator: den)
        try reset()
    }

    deinit { speex_resampler_destroy(state) }

    /// The one error funnel: a nonzero return becomes a typed error carrying `speex_resampler_strerror`.
    @inline(__always)
    private static func check(_ rc: Int32) throws(SpeexResamplerError) {
        if rc != 0 { throw error(rc) }
    }

    private static func error(_ rc: Int32) -> SpeexResamplerError { SpeexResamplerError(code: rc) }

    /// Input frames the resampler holds back (its filter's look-ahead), `speex_resampler_get_input_latency`.
    public var inputLatency: Int { Int(speex_resampler_get_input_latency(state)) }

    /// Consumption ratio (input frames per output frame, relative to the nominal rates).
    public var ratio: Double { Double(ratioNumerator) / Double(Self.ratioDenominator) }

    /// Sets the ratio to `numerator / ratioDenominator` (`speex_resampler_set_rate_frac`).
    ///
    /// At `ratioDenominator` (no correction) the ratio is the nominal rates' own, exactly (libspeexdsp reduces
    /// 48000/44100 to 160/147): a converter between two rates must not gain or lose frames over hours. With a
    /// correction, `numerator·inputRate/outputRate` is rounded to the nearest 1/65536 (libspeexdsp resamples at
    /// exactly the fraction it is given; a drift correction is quantized to that step anyway).
    public func setRatio(numerator: UInt32) throws(SpeexResamplerError) {
        let (inRate, outRate) = (UInt32(inputRate), UInt32(outputRate))
        if numerator == Self.ratioDenominator {
            try Self.check(speex_resampler_set_rate_frac(state, inRate, outRate, inRate, outRate))
        } else {
            let scaled = UInt64(numerator) * UInt64(inRate)
            let num64 = (scaled + UInt64(outRate) / 2) / UInt64(outRate)
            try Self.check(speex_resampler_set_rate_frac(
                state, UInt32(truncatingIfNeeded: num64), Self.ratioDenominator, inRate, outRate))
        }
        ratioNumerator = numerator
    }

    /// Sets the ratio to `1 + ppm·10⁻⁶`, rounded to the denominator's resolution. Returns the ppm applied.
    @discardableResult
    public func setCorrection(ppm: Double) throws(SpeexResamplerError) -> Double {
        let num = UInt32((Double(Self.ratioDenominator) * (1 + ppm * 1e-6)).rounded())
        if num != ratioNumerator { try setRatio(numerator: num) }
        return (Double(num) / Double(Self.ratioDenominator) - 1) * 1e6
    }

    /// Clears the filter memory (`speex_resampler_reset_mem`), for an unrelated stream.
    public func reset() throws(SpeexResamplerError) { try Self.check(speex_resampler_reset_mem(state)) }

    /// Makes the first output frame line up with the first input frame (`speex_resampler_skip_zeros`).
    public func skipZeros() throws(SpeexResamplerError) { try Self.check(speex_resampler_skip_zeros(state)) }

    /// Resamples interleaved frames: consumes up to `input.count / channels` frames and writes up to
    /// `output.count / channels` frames. Returns the frames consumed and produced. Input frames not consumed must
    /// be offered again.
    public func process(input: UnsafeBufferPointer<Float>, output: UnsafeMutableBufferPointer<Float>)
        throws(SpeexResamplerError) -> (consumed: Int, produced: Int)
    {
        var inLen = UInt32(input.count / channels)
        var outLen = UInt32(output.count / channels)
        if inLen == 0 || outLen == 0 { return (0, 0) }
        try Self.check(speex_resampler_process_interleaved_float(state, input.baseAddress, &inLen, output.baseAddress, &outLen))
        return (Int(inLen), Int(outLen))
    }

    /// Starts a seamless resampling run in the middle of a stream that was, until now, played without resampling:
    /// clears the memory, loads the last `history` frames that were played (at least `inputLatency·2 − 1` frames;
    /// older ones are ignored) so that the filter sees the real past instead of zeros, and aligns the next output
    /// frame with the next input frame. `scratch` must hold `inputLatency·2` frames. Afterwards the resampler holds
    /// back `inputLatency` input frames, and the ratio is restored to its previous value.
    public func prime(history: UnsafeBufferPointer<Float>, scratch: UnsafeMutableBufferPointer<Float>)
        throws(SpeexResamplerError)
    {
        let filterLength = 2 * inputLatency
        let need = filterLength - 1
        precondition(history.count >= need * channels && scratch.count >= filterLength * channels,
                     "SpeexResampler.prime needs filterLength-1 frames of history")
        let saved = ratioNumerator
        try reset()
        try setRatio(numerator: Self.ratioDenominator)
        let past = UnsafeBufferPointer(rebasing: history[(history.count - need * channels)...])
        _ = try process(input: past, output: scratch)
        try skipZeros()
        try setRatio(numerator: saved)
    }
}
