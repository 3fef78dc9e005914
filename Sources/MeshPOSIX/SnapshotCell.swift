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
///
/// `replace` waits for the readers inside; a writer that a reader may wait on — an event loop whose readers run the
/// app's code, which may ask the loop something and wait for the answer — uses `publish` instead, which never waits:
/// the old object is kept until no reader is inside, and released by a later `publish` or `reclaim`.
package final class SnapshotCell<Object: AnyObject & Sendable>: Sendable {
    /// The current object, retained once on its behalf (nil: none).
    private let current = Atomic<Unmanaged<Object>?>(nil)
    /// Readers inside `withCurrent`.
    private let readers = Atomic<Int>(0)
    /// Objects `publish` swapped out while readers were inside: the writer's alone (its lock is never a reader's).
    private let retired = Mutex<[Object]>([])

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

    /// Makes `object` current without waiting for readers. The object it replaces is released here if no reader is
    /// inside, otherwise kept until a later `publish` or `reclaim` finds none. Returns whether nothing is left to
    /// release (false: call `reclaim` soon). Writer only, as `replace`.
    @discardableResult
    package func publish(_ object: Object?) -> Bool {
        let old = current.exchange(object.map { Unmanaged.passRetained($0) }, ordering: .sequentiallyConsistent)
        if let old { retired.withLock { $0.append(old.takeRetainedValue()) } }
        return reclaim()
    }

    /// Releases the objects `publish` swapped out, if no reader is inside now (a reader that arrives later sees only
    /// the current object). Returns whether nothing is left to release. Writer only.
    @discardableResult
    package func reclaim() -> Bool {
        guard readers.load(ordering: .sequentiallyConsistent) == 0 else { return retired.withLock { $0.isEmpty } }
        let released = retired.withLock { r -> [Object] in
            defer { r.removeAll() }
            return r
        }
        _ = released  // the last references go here, after the lock
        return true
    }
}
