#if canImport(Glibc)
import Glibc
#endif
import Synchronization

/// An object that readers on any thread — a real-time one included — use without a lock, and that one writer at a
/// time replaces: the read-copy-update pattern, for tables the hot paths read (a session's datagram routes and send
/// routes, the playout pipeline datagrams go to).
///
/// Readers (`withCurrent`) bump a reader count, then load the pointer; the writer swaps the pointer, then waits until
/// no reader is inside before it gives the old object back. Sequentially consistent ordering on both words makes
/// that safe: a reader that missed the swap is counted, one that starts after it sees the new object. Readers never
/// wait, allocate or retain; the writer waits at most for the reads in progress (keep them short), and the old
/// object is released on the writer's thread, never on a reader's.
///
/// Writers must not overlap: the owner replaces from one thread, or under a lock of its own.
package final class SnapshotCell<Object: AnyObject & Sendable>: Sendable {
    /// The current object, retained once on its behalf (nil: none).
    private let current = Atomic<Unmanaged<Object>?>(nil)
    /// Readers inside `withCurrent`.
    private let readers = Atomic<Int>(0)

    /// A cell holding `initial` (nil: empty).
    package init(_ initial: Object? = nil) {
        if let initial { current.store(Unmanaged.passRetained(initial), ordering: .sequentiallyConsistent) }
    }

    deinit {
        current.load(ordering: .sequentiallyConsistent)?.release()
    }

    /// Runs `body` with the current object (nil when there is none). Lock-free, allocation-free; the object stays
    /// alive for the call, and must not escape it.
    @inline(__always)
    package func withCurrent<Result>(_ body: (Object?) throws -> Result) rethrows -> Result {
        readers.wrappingAdd(1, ordering: .sequentiallyConsistent)
        defer { readers.wrappingSubtract(1, ordering: .sequentiallyConsistent) }
        guard let object = current.load(ordering: .sequentiallyConsistent) else { return try body(nil) }
        return try object._withUnsafeGuaranteedRef { try body($0) }
    }

    /// Makes `object` current and returns the one it replaces, once no reader uses it any more. One writer at a time.
    @discardableResult
    package func replace(with object: Object?) -> Object? {
        let old = current.exchange(object.map { Unmanaged.passRetained($0) }, ordering: .sequentiallyConsistent)
        while readers.load(ordering: .sequentiallyConsistent) != 0 { sched_yield() }
        return old?.takeRetainedValue()
    }
}
