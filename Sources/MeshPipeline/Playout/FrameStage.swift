/// One block of frames on its way down the playout chain, on the render thread: interleaved samples, one
/// `FrameMark` per frame, the time it is rendered at, and the latency already queued downstream of it.
public struct FrameBlock {
    /// `frames × channels` interleaved samples.
    public let samples: UnsafeMutableBufferPointer<Float>
    /// One `FrameMark` per frame.
    public let marks: UnsafeMutableBufferPointer<UInt8>
    /// Frames in the block.
    public let frames: Int
    /// Monotonic time the block is rendered at, nanoseconds.
    public let nowNanos: UInt64
    /// Frames already queued downstream when the block is pulled (staging FIFO, resampler look-ahead).
    public let downstreamFrames: Double

    public init(samples: UnsafeMutableBufferPointer<Float>, marks: UnsafeMutableBufferPointer<UInt8>, frames: Int,
                nowNanos: UInt64, downstreamFrames: Double) {
        precondition(samples.count >= frames && marks.count >= frames, "FrameBlock: buffers shorter than the block")
        self.samples = samples
        self.marks = marks
        self.frames = frames
        self.nowNanos = nowNanos
        self.downstreamFrames = downstreamFrames
    }
}

/// The calling shape the frame stages of the playout chain share (`JitterBuffer`, `Concealer`): one call per block,
/// which fills the block or transforms it in place. What a stage takes from another one besides the block — the
/// drift controller's word to the jitter buffer, say — arrives as its `Feedback`, a named input (`Void` for none).
///
/// Called on the render thread: no allocation, lock, log or Foundation.
public protocol FrameStage {
    /// What the stage needs from other stages each block.
    associatedtype Feedback
    /// Fills `block`, or transforms it in place.
    mutating func process(_ block: FrameBlock, feedback: Feedback)
}

extension FrameStage where Feedback == Void {
    /// Fills `block`, or transforms it in place.
    @inline(__always)
    public mutating func process(_ block: FrameBlock) { process(block, feedback: ()) }
}
