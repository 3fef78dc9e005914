#if canImport(Glibc)
import Glibc
#endif
import MeshPipeline
import Synchronization

/// The playout pipeline datagrams go to, read lock-free on the network thread and replaced only by one writer (the
/// player's control queue).
///
/// Readers (`withCurrent`) bump a reader count, then load the pointer; the writer swaps the pointer, then waits
/// until no reader is inside before it gives the old pipeline back for release. Sequentially consistent ordering on
/// both words makes that safe: a reader that missed the swap is counted, one that starts after it sees the new
/// pipeline. Readers never wait; the writer waits at most for the datagram in hand.
final class CurrentPipeline: Sendable {
    /// The pipeline, retained once on its behalf (nil: none).
    private let current = Atomic<Unmanaged<PlayoutPipeline>?>(nil)
    /// Readers inside `withCurrent`.
    private let readers = Atomic<Int>(0)

    deinit {
        current.load(ordering: .sequentiallyConsistent)?.release()
    }

    /// Runs `body` with the current pipeline (nil when there is none). Lock-free, allocation-free.
    @inline(__always)
    func withCurrent<Result>(_ body: (PlayoutPipeline?) -> Result) -> Result {
        readers.wrappingAdd(1, ordering: .sequentiallyConsistent)
        defer { readers.wrappingSubtract(1, ordering: .sequentiallyConsistent) }
        guard let pipeline = current.load(ordering: .sequentiallyConsistent) else { return body(nil) }
        return pipeline._withUnsafeGuaranteedRef { body($0) }
    }

    /// Makes `pipeline` current and returns the one it replaces, once no reader uses it any more. One writer only.
    func replace(with pipeline: PlayoutPipeline?) -> PlayoutPipeline? {
        let old = current.exchange(pipeline.map { Unmanaged.passRetained($0) }, ordering: .sequentiallyConsistent)
        while readers.load(ordering: .sequentiallyConsistent) != 0 { sched_yield() }
        return old?.takeRetainedValue()
    }
}
