#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import CLinux

/// A small set of descriptors that one real-time loop waits on together — a device's poll descriptors and a
/// network socket, say — with `ppoll` and a deadline on `CLOCK_MONOTONIC`. The `pollfd` slots are allocated once in
/// `init`, so filling the set and waiting allocate nothing, take no lock and touch no Foundation.
///
/// One thread uses a set. Fill it for each wait: `removeAll`, then `append` descriptors (or let a C library fill a
/// run of slots through `reserve`), then `wait`, then read `returnedEvents(at:)`.
package final class PollSet: @unchecked Sendable {  // one thread's; the pointer never changes
    private let slots: UnsafeMutablePointer<pollfd>
    /// Slots the set can hold.
    package let capacity: Int
    /// Slots in use.
    package private(set) var count = 0

    /// A set of at most `capacity` descriptors.
    package init(capacity: Int) {
        precondition(capacity > 0, "PollSet needs at least one slot")
        self.capacity = capacity
        slots = .allocate(capacity: capacity)
        slots.initialize(repeating: pollfd(), count: capacity)
    }

    deinit { slots.deallocate() }

    /// Empties the set.
    @inline(__always)
    package func removeAll() { count = 0 }

    /// What a descriptor waited on for reading turned out to be.
    package enum Readiness: Sendable, Equatable {
        /// Nothing yet.
        case idle
        /// Data (or end of file) to read.
        case readable
        /// Not a usable descriptor any more (closed: `POLLNVAL`; failed: `POLLERR`).
        case gone
    }

    /// Adds `fd`, waited on for reading. Returns its index.
    @discardableResult
    package func appendReadable(_ fd: Int32) -> Int { append(fd, events: Int16(POLLIN)) }

    /// What `wait` found for the descriptor added with `appendReadable` at `index`.
    package func readiness(at index: Int) -> Readiness {
        let events = slots[index].revents
        if events & Int16(POLLNVAL | POLLERR) != 0 { return .gone }
        return events & Int16(POLLIN | POLLHUP) != 0 ? .readable : .idle
    }

    /// The `errno` of the latest failed `wait`.
    package private(set) var lastError: Int32 = 0

    /// Adds `fd`, waited on for `events` (`POLLIN`, `POLLOUT`). Returns its index.
    @discardableResult
    package func append(_ fd: Int32, events: Int16) -> Int {
        precondition(count < capacity, "PollSet: more than \(capacity) descriptors")
        slots[count] = pollfd(fd: fd, events: events, revents: 0)
        count += 1
        return count - 1
    }

    /// Hands `body` the next `slotsWanted` free slots to fill (a C library's own descriptors); `body` returns how many
    /// it filled. Returns the index of the first one.
    package func reserve(_ slotsWanted: Int, _ body: (UnsafeMutablePointer<pollfd>, Int) -> Int) -> Int {
        let first = count
        let room = min(slotsWanted, capacity - count)
        let filled = max(0, min(room, body(slots + first, room)))
        count += filled
        return first
    }

    /// The events `ppoll` returned for the descriptor at `index` (after `wait`).
    @inline(__always)
    package func returnedEvents(at index: Int) -> Int16 { slots[index].revents }

    /// The slots from `index` on, for a C library that translates its own descriptors' events.
    @inline(__always)
    package func slots(from index: Int) -> UnsafeMutablePointer<pollfd> { slots + index }

    /// Waits until a descriptor is ready, or `CLOCK_MONOTONIC` reaches `deadline` (nil: no deadline). Returns the
    /// number of ready descriptors: 0 on timeout or when a signal interrupted the wait (callers re-check their
    /// state either way), -1 on another failure (`lastError`).
    package func wait(untilNanos deadline: Nanos?) -> Int {
        for i in 0..<count { slots[i].revents = 0 }
        var timeout = timespec()
        if let deadline {
            let now = MonotonicClock.nowNanos()
            let left = deadline > now ? deadline - now : 0
            timeout = timespec(tv_sec: Int(left / 1_000_000_000), tv_nsec: Int(left % 1_000_000_000))
        }
        let result = deadline == nil ? ppoll(slots, nfds_t(count), nil, nil) : ppoll(slots, nfds_t(count), &timeout, nil)
        if result < 0 {
            if errno == EINTR { return 0 }
            lastError = errno
        }
        return Int(result)
    }
}
