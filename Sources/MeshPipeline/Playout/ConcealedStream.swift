/// Jitter buffer → concealer: the stream-rate frames the drift resampler pulls, as one `FrameStage`. Its feedback is
/// the jitter buffer's, from the drift controller.
public struct ConcealedStream: FrameStage {
    /// Packets in, frames with loss marks out.
    public var jitterBuffer: JitterBuffer
    /// Missing frames synthesized, real ones crossfaded in.
    public var concealer: Concealer

    public init(jitterBuffer: JitterBuffer, concealer: Concealer) {
        self.jitterBuffer = jitterBuffer
        self.concealer = concealer
    }

    /// Reads the block from the jitter buffer, then conceals it in place.
    public mutating func process(_ block: FrameBlock, feedback: JitterBuffer.DriftFeedback) {
        jitterBuffer.process(block, feedback: feedback)
        concealer.process(block)
    }
}
