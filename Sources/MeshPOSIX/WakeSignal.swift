#if canImport(Glibc)
import Glibc
#endif

/// A counting wake-up signal over a POSIX semaphore.
///
/// `signal()` never blocks and is safe on a real-time thread (it is `sem_post`). `wait(untilNanos:)` is for the
/// other side only. Waiters must re-check their condition after waking: the count may run ahead of the events
/// it stands for, so a wake-up can be spurious.
package final class WakeSignal: @unchecked Sendable {  // sem_t is designed for concurrent use; the pointer never changes.
    private let semaphore: UnsafeMutablePointer<sem_t>

    package init() {
        semaphore = .allocate(capacity: 1)
        sem_init(semaphore, 0, 0)
    }

    deinit {
        sem_destroy(semaphore)
        semaphore.deallocate()
    }

    /// Wakes one waiter (or the next one to wait). Real-time safe.
    @inline(__always)
    package func signal() {
        sem_post(semaphore)
    }

    /// Waits for a signal, however long it takes. Not for real-time threads.
    package func wait() {
        while sem_wait(semaphore) != 0 && errno == EINTR {}
    }

    /// Waits for a signal until `CLOCK_MONOTONIC` reaches `deadlineNanos`. Returns `false` on timeout.
    ///
    /// `sem_timedwait` takes a `CLOCK_REALTIME` deadline, so the remaining monotonic time is re-based on the
    /// wall clock at each attempt; a wall-clock step can stretch or shorten one wait, never the overall deadline.
    @discardableResult
    package func wait(untilNanos deadlineNanos: UInt64) -> Bool {
        while true {
            let now = MonotonicClock.nowNanos()
            guard now < deadlineNanos else { return sem_trywait(semaphore) == 0 }
            var wall = timespec()
            clock_gettime(CLOCK_REALTIME, &wall)
            let wallNow = UInt64(wall.tv_sec) * 1_000_000_000 + UInt64(wall.tv_nsec)
            let wallDeadline = MonotonicClock.deadline(after: deadlineNanos - now, from: wallNow)
            var ts = timespec(tv_sec: Int(wallDeadline / 1_000_000_000), tv_nsec: Int(wallDeadline % 1_000_000_000))
            if sem_timedwait(semaphore, &ts) == 0 { return true }
            let error = errno
            if error == ETIMEDOUT { return false }
            if error != EINTR { return false }
        }
    }
}
