import Synchronization

/// The atomic counters behind `AudioStats`, shared by a source or sink and its thread.
///
/// Writers are the stage's own threads (each counter has one writer); `snapshot()` may be called from any thread.
/// Updates are relaxed atomics: real-time safe, and each counter is individually exact.
public final class AudioCounters: Sendable {
    /// `AudioStats.framesIn`.
    public let framesIn = Atomic<UInt64>(0)
    /// `AudioStats.framesOut`.
    public let framesOut = Atomic<UInt64>(0)
    /// `AudioStats.xruns`.
    public let xruns = Atomic<UInt64>(0)
    /// `AudioStats.overflowFrames`.
    public let overflowFrames = Atomic<UInt64>(0)
    /// `AudioStats.overrunFrames`.
    public let overrunFrames = Atomic<UInt64>(0)
    /// `AudioStats.delayFrames`.
    public let delayFrames = Atomic<Int>(0)

    public init() {}

    /// Adds `frames` to a frame counter. Real-time safe.
    @inline(__always)
    public static func bump(_ counter: borrowing Atomic<UInt64>, by frames: Int) {
        counter.wrappingAdd(UInt64(frames), ordering: .relaxed)
    }

    /// A consistent-enough copy of every counter.
    public func snapshot() -> AudioStats {
        var stats = AudioStats()
        stats.framesIn = framesIn.load(ordering: .relaxed)
        stats.framesOut = framesOut.load(ordering: .relaxed)
        stats.xruns = xruns.load(ordering: .relaxed)
        stats.overflowFrames = overflowFrames.load(ordering: .relaxed)
        stats.overrunFrames = overrunFrames.load(ordering: .relaxed)
        stats.delayFrames = delayFrames.load(ordering: .relaxed)
        return stats
    }
}
