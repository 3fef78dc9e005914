/// Marks each real frame the jitter buffer plays (`FrameMark.present`, or `.discontinuity` where the stream does not
/// continue the previous output) and keeps latency corrections out of the concealer's crossfades: for 5 ms after a
/// discontinuity (start, resync, skip) or a resumption after missing frames, `isGuarding` holds, and no stretch or
/// skip starts — an interrupted crossfade is the hardest transition to keep smooth. Pure.
struct CrossfadeGuard {
    /// Frames a crossfade is given (5 ms).
    let guardFrames: Int
    private var framesLeft = 0
    private var discontinuityPending = false
    private var lastWasMissing = false

    /// A guard for a stream of `rate` frames per second.
    init(rate: Double) { guardFrames = Int(rate * 0.005) }

    /// Whether a crossfade may still be running: no stretch or skip now.
    var isGuarding: Bool { framesLeft > 0 }

    /// The next real frame does not continue the output (a new stream, or a skip).
    mutating func noteDiscontinuity() { discontinuityPending = true }

    /// Frames went missing on purpose (a stretch): the next real frame resumes after concealment.
    mutating func noteStretch() { lastWasMissing = true }

    /// One frame played, `present` or missing: returns its `FrameMark`.
    @inline(__always)
    mutating func play(present: Bool) -> UInt8 {
        if framesLeft > 0 { framesLeft -= 1 }
        guard present else {
            lastWasMissing = true
            return FrameMark.missing
        }
        if discontinuityPending || lastWasMissing { framesLeft = guardFrames }
        let mark = discontinuityPending ? FrameMark.discontinuity : FrameMark.present
        discontinuityPending = false
        lastWasMissing = false
        return mark
    }
}
