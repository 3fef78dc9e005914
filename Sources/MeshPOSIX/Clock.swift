#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Monotonic time in nanoseconds (`CLOCK_MONOTONIC`). Pure code never reads a clock: time is passed in as `Nanos`,
/// so state machines run on virtual time under test.
public typealias Nanos = UInt64

/// `CLOCK_MONOTONIC` in nanoseconds, and absolute sleeps against it.
///
/// Safe on a real-time thread: no allocation, no locks, no Foundation.
public enum MonotonicClock {
    /// Nanoseconds since an arbitrary fixed point (boot).
    @inline(__always)
    public static func nowNanos() -> Nanos {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return UInt64(ts.tv_sec) &* 1_000_000_000 &+ UInt64(ts.tv_nsec)
    }

    /// Sleeps until `CLOCK_MONOTONIC` reaches `deadlineNanos` (`clock_nanosleep`, `TIMER_ABSTIME`), resuming after
    /// signal interruptions. Returns at once when the deadline has passed.
    public static func sleep(untilNanos deadlineNanos: Nanos) {
        var ts = timespec(tv_sec: Int(deadlineNanos / 1_000_000_000), tv_nsec: Int(deadlineNanos % 1_000_000_000))
        while clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nil) == EINTR {}
    }

    /// The deadline `timeout` after `now`, saturated at `UInt64.max`: a timeout of "for ever" (`.max`) gives a
    /// deadline that never comes, not one wrapped round into the past.
    @inline(__always)
    package static func deadline(after timeout: Nanos, from now: Nanos = nowNanos()) -> Nanos {
        let (deadline, overflow) = now.addingReportingOverflow(timeout)
        return overflow ? .max : deadline
    }

    /// Converts a frame count at `sampleRate` to nanoseconds.
    @inline(__always)
    public static func nanos(frames: Int, sampleRate: Int) -> Nanos {
        UInt64(frames) &* 1_000_000_000 / UInt64(sampleRate)
    }
}

extension Duration {
    /// The duration in whole nanoseconds, clamped to 0…UInt64.max (negative durations are 0).
    package var nanoseconds: Nanos {
        let (s, atto) = components
        guard s >= 0, atto >= 0 || s > 0 else { return 0 }
        let (whole, overflow) = UInt64(s).multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return .max }
        return whole.addingReportingOverflow(UInt64(max(0, atto) / 1_000_000_000)).partialValue
    }

    /// The duration in milliseconds, as a `Double`.
    package var milliseconds: Double {
        let (s, atto) = components
        return Double(s) * 1000 + Double(atto) / 1e15
    }

    /// The duration in seconds, as a `Double`.
    package var seconds: Double { milliseconds / 1000 }

    /// `nanos` nanoseconds.
    package init(nanos: Nanos) { self = .nanoseconds(Int64(clamping: nanos)) }
}

/// Wall-clock time as ISO-8601 UTC text with milliseconds (`2026-12-01T21:34:26.451Z`), from `clock_gettime` and
/// `gmtime_r`: no Foundation formatter, so no ICU calendar data is paged in for a log line.
package enum WallClock {
    /// Now.
    package static func iso8601() -> String {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return iso8601(seconds: ts.tv_sec, milliseconds: ts.tv_nsec / 1_000_000)
    }

    /// `seconds` since the epoch (UTC) plus `milliseconds`.
    package static func iso8601(seconds: Int, milliseconds: Int) -> String {
        var t = time_t(seconds)
        var tm = tm()
        guard gmtime_r(&t, &tm) != nil else { return "1970-01-01T00:00:00.000Z" }
        func pad(_ v: Int32, _ width: Int) -> String {
            let s = String(v)
            return s.count >= width ? s : String(repeating: "0", count: width - s.count) + s
        }
        return "\(pad(tm.tm_year + 1900, 4))-\(pad(tm.tm_mon + 1, 2))-\(pad(tm.tm_mday, 2))T"
            + "\(pad(tm.tm_hour, 2)):\(pad(tm.tm_min, 2)):\(pad(tm.tm_sec, 2)).\(pad(Int32(milliseconds), 3))Z"
    }
}
