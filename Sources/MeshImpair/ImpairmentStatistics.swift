import MeshPOSIX

/// The two directions a datagram can travel through the proxy.
enum Way: Int, Sendable {
    case toTarget = 0
    case fromTarget = 1
}

extension ImpairmentProxy {
    /// Exact UDP counters for one direction. Invariant: `received == forwarded + dropped + pending + failed`.
    public struct DirectionStatistics: Sendable, Equatable {
        /// Datagrams read from the socket.
        public var received: UInt64 = 0
        /// Datagrams sent on (first copy; counted once the send succeeded).
        public var forwarded: UInt64 = 0
        /// Datagrams dropped by the loss setting.
        public var dropped: UInt64 = 0
        /// Of `dropped`, those that were PeerMesh *data* datagrams (magic `PM`, kind 1) — what a receiver's loss
        /// counter can see; the rest were pings, pongs or foreign datagrams.
        public var droppedPeerMeshData: UInt64 = 0
        /// Of `droppedPeerMeshData`, those dropped after the last PeerMesh data datagram that went through: no
        /// receiver can tell them from the end of the stream, so they never show in its loss counter.
        public var trailingDroppedPeerMeshData: UInt64 = 0
        /// Extra copies sent (each also reaches the far side).
        public var duplicated: UInt64 = 0
        /// Datagrams that were held back and sent after a later datagram.
        public var reordered: UInt64 = 0
        /// Datagrams scheduled with a non-zero added delay.
        public var delayed: UInt64 = 0
        /// Datagrams decided but not yet sent (waiting in the delay queue or held for reordering).
        public var pending: UInt64 = 0
        /// Datagrams not delivered for another reason: send error, queue or session table full, or discarded at stop.
        public var failed: UInt64 = 0

        public init() {}
    }

    /// A consistent snapshot of all counters (taken under one lock).
    public struct Statistics: Sendable, Equatable {
        /// Client → target UDP.
        public var toTarget = DirectionStatistics()
        /// Target → client UDP.
        public var fromTarget = DirectionStatistics()
        /// UDP clients with a live session (one upstream socket each).
        public var udpSessions = 0
        /// TCP connections accepted so far.
        public var tcpConnectionsAccepted: UInt64 = 0
        /// TCP connections still open.
        public var tcpConnectionsOpen = 0
        /// TCP payload bytes passed through towards the target.
        public var tcpBytesToTarget: UInt64 = 0
        /// TCP payload bytes passed through from the target.
        public var tcpBytesFromTarget: UInt64 = 0

        public init() {}

        /// One JSON object on one line; `kind` labels it (for example "counters" or "final").
        public func jsonLine(kind: String = "counters") -> String {
            var o = JSONObject()
            o.add("kind", kind)
            o.addFields(of: self)
            return o.description
        }

        subscript(way: Way) -> DirectionStatistics {
            get { way == .toTarget ? toTarget : fromTarget }
            set { if way == .toTarget { toTarget = newValue } else { fromTarget = newValue } }
        }
    }
}
