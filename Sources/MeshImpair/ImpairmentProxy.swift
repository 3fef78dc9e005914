import Synchronization

/// A user-space network impairment proxy for PeerMesh sessions (there is no kernel netem on the rig).
///
/// Listens on one port number for both UDP and TCP and forwards to the target's same port number. TCP is passed
/// through unimpaired (the PeerMesh handshake); UDP gets loss, duplication, reordering, delay and jitter, from a
/// seeded generator so runs are reproducible. Each UDP client address gets its own upstream socket, so the target
/// sees one stable source per client and its replies come back through the proxy (PeerMesh latches onto it).
///
/// Only 127.0.0.0/8 and 198.18.0.0/15 are accepted for listen and target addresses (the project's network rule).
///
/// ```swift
/// let proxy = try ImpairmentProxy(configuration: .init(target: .init(host: "127.0.0.1", port: 7001), loss: 0.05))
/// let address = try proxy.start()      // 127.0.0.1:<picked port>
/// ...
/// print(proxy.statistics.toTarget.dropped)
/// proxy.stop()
/// ```
public final class ImpairmentProxy: Sendable {
    /// The validated configuration.
    public let configuration: Configuration
    private let engine = Mutex<ImpairmentEngine?>(nil)
    private let finalStatistics = Mutex<Statistics?>(nil)

    /// Validates `configuration` (ranges and the network rule). Opens nothing.
    public init(configuration: Configuration) throws(ImpairmentError) {
        try configuration.validate()
        self.configuration = configuration
    }

    /// Binds the listeners and starts forwarding; returns the address clients should use. Throws if the
    /// address cannot be bound or the proxy was already started.
    @discardableResult
    public func start() throws(ImpairmentError) -> Endpoint {
        let started = try engine.withLock { (e) throws(ImpairmentError) -> ImpairmentEngine in
            guard e == nil, finalStatistics.withLock({ $0 == nil }) else {
                throw .invalidArgument("the impairment proxy was already started; create a new one")
            }
            let new = try ImpairmentEngine(configuration: configuration)
            e = new
            return new
        }
        return started.listenAddress
    }

    /// The bound listen address (the picked port when the configuration said 0); nil before `start`.
    public var listenAddress: Endpoint? { engine.withLock { $0?.listenAddress } }

    /// A consistent snapshot of the counters; after `stop`, the final ones.
    public var statistics: Statistics {
        if let f = finalStatistics.withLock({ $0 }) { return f }
        return engine.withLock { $0 }?.statistics ?? Statistics()
    }

    /// Stops forwarding: joins both threads and closes every socket. Datagrams still waiting are discarded and
    /// counted as failed. Idempotent; also called by deinit.
    public func stop() {
        guard let e = engine.withLock({ $0 }) else { return }
        e.stop()
        let stats = e.statistics
        finalStatistics.withLock { $0 = stats }
        engine.withLock { $0 = nil }
    }

    deinit { stop() }
}
