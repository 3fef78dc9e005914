import Synchronization

/// The progress of one resource transfer, either way, and the handle that cancels it: PeerMesh's counterpart of
/// the `Progress` MultipeerConnectivity returns from `sendResource` and passes to `didStartReceivingResource`.
///
/// PeerMesh imports only `FoundationEssentials` (Foundation's `Progress` would link all of Foundation and ICU
/// into every binary), so this class carries the part of `Progress` apps use: unit counts, the fraction,
/// `cancel()`, and a handler called as bytes move. Thread-safe; the handler runs on the session's I/O thread,
/// at most once per 64 KiB chunk, and must not block.
public final class ResourceProgress: Sendable {
    private struct State {
        var completed: Int64 = 0
        var cancelled = false
        var finished = false
        var error: PeerMeshError?
        var handler: (@Sendable (ResourceProgress) -> Void)?
        /// Followers besides the app's handler (the Foundation `Progress` adapter), each called as the handler is.
        var observers: [@Sendable (ResourceProgress) -> Void] = []
    }

    /// The resource's size in bytes.
    public let totalUnitCount: Int64
    private let state = Mutex(State())
    /// What `cancel()` asks the session to do (set once, at creation).
    private let canceller: @Sendable () -> Void

    init(totalUnitCount: Int64, canceller: @escaping @Sendable () -> Void) {
        self.totalUnitCount = totalUnitCount
        self.canceller = canceller
    }

    /// Bytes sent (sender) or written and hashed (receiver) so far.
    public var completedUnitCount: Int64 { state.withLock { $0.completed } }

    /// `completedUnitCount / totalUnitCount`; 1 for an empty resource that finished.
    public var fractionCompleted: Double {
        state.withLock { s in
            totalUnitCount == 0 ? (s.finished ? 1 : 0) : Double(s.completed) / Double(totalUnitCount)
        }
    }

    /// Whether the transfer was cancelled, from either side.
    public var isCancelled: Bool { state.withLock { $0.cancelled } }

    /// Whether the transfer is over: delivered, cancelled or failed.
    public var isFinished: Bool { state.withLock { $0.finished } }

    /// Why the transfer failed, once it has; nil while it runs and after a delivery.
    public var error: PeerMeshError? { state.withLock { $0.error } }

    /// Calls `handler` whenever bytes move and once when the transfer ends (replacing any handler set before).
    public func setUpdateHandler(_ handler: (@Sendable (ResourceProgress) -> Void)?) {
        state.withLock { $0.handler = handler }
    }

    /// Adds a follower called as the update handler is, never replaced by `setUpdateHandler` (for adapters in
    /// this package, such as PeerMeshFoundation's `Progress`).
    package func observe(_ observer: @escaping @Sendable (ResourceProgress) -> Void) {
        state.withLock { $0.observers.append(observer) }
    }

    /// Cancels the transfer on both sides: the receiver deletes what it has, the sender stops, each side's app is
    /// told with `PeerMeshError.cancelled`. Does nothing once the transfer is over.
    public func cancel() {
        guard !isFinished else { return }
        canceller()
    }

    // MARK: Driver side (the session's I/O thread)

    /// `count` more bytes moved.
    func advance(by count: Int) {
        let (handler, observers) = state.withLock { s in
            s.completed += Int64(count)
            return (s.handler, s.observers)
        }
        for o in observers { o(self) }
        handler?(self)
    }

    /// The transfer is over; `error` says why if it failed.
    func finish(_ error: PeerMeshError?) {
        let (handler, observers) = state.withLock { s -> ((@Sendable (ResourceProgress) -> Void)?, [@Sendable (ResourceProgress) -> Void]) in
            guard !s.finished else { return (nil, []) }
            s.finished = true
            s.error = error
            if case .cancelled = error { s.cancelled = true }
            return (s.handler, s.observers)
        }
        for o in observers { o(self) }
        handler?(self)
    }
}
