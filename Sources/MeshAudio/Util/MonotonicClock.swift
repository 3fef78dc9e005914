#if canImport(Glibc)
import Glibc
#endif

/// `CLOCK_MONOTONIC` in nanoseconds, and absolute sleeps against it.
///
/// Both functions are safe on a real-time thread: no allocation, no locks, no Foundation.
public enum MonotonicClock {
    /// Nanoseconds since an arbitrary fixed point (boot), from `CLOCK_MONOTONIC`.
    @inline(__always)
    public static func nowNanos() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return UInt64(ts.tv_sec) &* 1_000_000_000 &+ UInt64(ts.tv_nsec)
    }

    /// Sleeps until `CLOCK_MONOTONIC` reaches `deadlineNanos` (`clock_nanosleep` with `TIMER_ABSTIME`),
    /// resuming after signal interruptions. Returns at once when the deadline has passed.
    public static func sleep(untilNanos deadlineNanos: UInt64) {
        var ts = timespec(tv_sec: Int(deadlineNanos / 1_000_000_000), tv_nsec: Int(deadlineNanos % 1_000_000_000))
        while clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nil) == EINTR {}
    }

    /// Converts a frame count at `sampleRate` to nanoseconds.
    @inline(__always)
    public static func nanos(frames: Int, sampleRate: Int) -> UInt64 {
        UInt64(frames) &* 1_000_000_000 / UInt64(sampleRate)
    }
}
