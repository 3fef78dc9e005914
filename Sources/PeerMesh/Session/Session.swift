import Foundation
import MeshPOSIX
import Synchronization

/// How `Session.send` delivers data, as MultipeerConnectivity's `MCSessionSendDataMode`.
public enum SendMode: Sendable, Equatable {
    /// In order, exactly once (TCP). Up to 16 MiB per message.
    case reliable
    /// A UDP datagram: may be lost, never corrupted or duplicated. Up to `Session.maximumDatagramSize` bytes.
    case unreliable
}

/// Receives a session's events. Every method is called on the session's I/O thread, in order, never on the
/// thread that caused the event. Keep the methods short: a slow delegate delays the session's I/O.
public protocol SessionDelegate: AnyObject, Sendable {
    /// `peer` changed state. Each change is reported exactly once, in order.
    func session(_ session: Session, peer: PeerID, didChange state: SessionState)
    /// A reliable message arrived.
    func session(_ session: Session, didReceive data: Data, fromPeer peer: PeerID)
    /// An unreliable datagram arrived.
    func session(_ session: Session, didReceiveDatagram data: Data, fromPeer peer: PeerID)
    /// An unreliable datagram arrived, as bytes valid only during the call: the zero-copy form for hot paths
    /// such as audio. The default implementation copies the bytes into a `Data` and calls the method above.
    func session(_ session: Session, didReceiveDatagramBytes bytes: UnsafeRawBufferPointer, fromPeer peer: PeerID)
    /// An invitation this session sent ended without a connection (declined, timed out, refused…).
    /// `peer` is `nil` for a direct connect that failed before the peer said who it is.
    func session(_ session: Session, invitationTo peer: PeerID?, failedWith reason: DeclineReason, detail: String)
}

public extension SessionDelegate {
    func session(_ session: Session, didReceive data: Data, fromPeer peer: PeerID) {}
    func session(_ session: Session, didReceiveDatagram data: Data, fromPeer peer: PeerID) {}
    func session(_ session: Session, didReceiveDatagramBytes bytes: UnsafeRawBufferPointer, fromPeer peer: PeerID) {
        self.session(session, didReceiveDatagram: Data(bytes), fromPeer: peer)
    }
    func session(_ session: Session, invitationTo peer: PeerID?, failedWith reason: DeclineReason, detail: String) {}
}

/// Counters of a session's traffic. Exact: every datagram the session reads lands in one of them.
public struct SessionStatistics: Sendable, Equatable {
    /// Datagrams sent.
    public var datagramsSent: UInt64 = 0
    /// Datagrams delivered to the delegate.
    public var datagramsReceived: UInt64 = 0
    /// Datagrams that are not PeerMesh's or not well formed.
    public var malformedDatagrams: UInt64 = 0
    /// Well-formed datagrams from an address or token that is not a connected peer's.
    public var strangerDatagrams: UInt64 = 0
    /// Datagrams seen before (network duplication or replay).
    public var duplicateDatagrams: UInt64 = 0
    /// Datagrams whose token and source matched a link but that did not authenticate under its keys.
    public var unauthenticDatagrams: UInt64 = 0
    /// TCP connections closed because they sent bytes that are not frames.
    public var garbageConnections: UInt64 = 0
    /// Protocol violations by peers (garbage, frames out of turn…); each closed that peer's connection.
    public var peerFaults: UInt64 = 0

    public init() {}
}

/// A MultipeerConnectivity-style session: a set of peers that exchange reliable messages (TCP) and unreliable
/// datagrams (UDP).
///
/// Peers join through invitations: a `NearbyServiceBrowser` invites a peer it found, the peer's
/// `NearbyServiceAdvertiser` hands the invitation to its app, and the app accepts into a session. `connect(to:)`
/// invites an advertiser at a known address without discovery.
public final class Session: Sendable {
    /// Limits and timing.
    public struct Configuration: Sendable {
        /// Peers in the session, ourselves included (MC's default is 8).
        public var maximumPeers: Int = 8
        /// A connected peer silent for this long is `notConnected` (default 2 s).
        public var peerTimeout: Duration = .seconds(2)
        /// How often each side proves it is alive (default: a quarter of `peerTimeout`).
        public var heartbeatInterval: Duration?
        /// UDP port for datagrams; 0 picks one. Give it the advertiser's port to keep one port number per host.
        public var udpPort: UInt16 = 0
        /// Local IPv4 address to bind (default all).
        public var bindHost: String = "0.0.0.0"

        public init(maximumPeers: Int = 8, peerTimeout: Duration = .seconds(2), heartbeatInterval: Duration? = nil,
                    udpPort: UInt16 = 0, bindHost: String = "0.0.0.0") {
            self.maximumPeers = maximumPeers
            self.peerTimeout = peerTimeout
            self.heartbeatInterval = heartbeatInterval
            self.udpPort = udpPort
            self.bindHost = bindHost
        }
    }

    /// Largest unreliable payload: 1200 bytes. With PeerMesh's 20-byte header, UDP's 8 and IPv6's 40, a datagram is
    /// at most 1268 bytes: under IPv6's minimum MTU (1280), so it is never fragmented on Ethernet (1500), PPPoE
    /// (1492), common VPN tunnels, or any IPv6 path.
    public static let maximumDatagramSize = 1200

    /// Largest reliable message.
    public static let maximumReliableMessageSize = ControlFrame.maximumReliableMessage

    /// This peer.
    public let myPeerID: PeerID
    let core: SessionCore

    /// Opens the session's UDP socket and starts its I/O thread.
    public init(peer: PeerID, configuration: Configuration = Configuration()) throws(PeerMeshError) {
        guard configuration.maximumPeers >= 2 else {
            throw .invalidParameter("maximumPeers must be at least 2 (it counts the local peer)")
        }
        guard configuration.peerTimeout > .milliseconds(100) else {
            throw .invalidParameter("peerTimeout must be more than 100 ms")
        }
        myPeerID = peer
        core = try SessionCore(peer: peer, configuration: configuration)
        core.owner.withLock { $0 = WeakSession(self) }
        core.start()
    }

    deinit { core.shutdown() }

    /// The delegate, held weakly (as in MC).
    public var delegate: (any SessionDelegate)? {
        get { core.delegate.withLock { $0.value } }
        set { core.delegate.withLock { $0 = WeakDelegate(newValue) } }
    }

    /// Peers currently `connected`.
    public var connectedPeers: [PeerID] { core.shared.withLock { $0.machine.connectedPeers } }

    /// `peer`'s current state.
    public func state(of peer: PeerID) -> SessionState { core.shared.withLock { $0.machine.state(of: peer) } }

    /// The UDP port datagrams arrive on.
    public var udpPort: UInt16 { core.udpPort }

    /// A snapshot of the traffic counters.
    public var statistics: SessionStatistics { core.counters.snapshot }

    /// The smoothed UDP round-trip time to `peer`, measured by pings every heartbeat interval; `nil` before the
    /// first answer.
    public func roundTripTime(to peer: PeerID) -> Duration? {
        core.roundTripTime(to: peer).map { Duration(nanos: $0) }
    }

    /// Sends `data` to every peer in `peers`.
    ///
    /// - Throws: `invalidParameter` for empty data, an empty peer list or an oversize message;
    ///   `notConnected` if any listed peer is not connected — then nothing is sent to anyone.
    public func send(_ data: Data, toPeers peers: [PeerID], with mode: SendMode) throws(PeerMeshError) {
        guard !peers.isEmpty else { throw .invalidParameter("send: the peer list is empty") }
        guard !data.isEmpty else { throw .invalidParameter("send: the data is empty") }
        switch mode {
        case .reliable:
            guard data.count <= Session.maximumReliableMessageSize else {
                throw .invalidParameter("send: \(data.count) bytes exceeds the reliable limit of \(Session.maximumReliableMessageSize)")
            }
            try core.sendReliable(Array(data), to: peers)
        case .unreliable:
            guard data.count <= Session.maximumDatagramSize else {
                throw .invalidParameter("send: \(data.count) bytes exceeds maximumDatagramSize (\(Session.maximumDatagramSize)) for unreliable mode")
            }
            let result: Result<Void, PeerMeshError> = data.withUnsafeBytes { raw in
                Result { () throws(PeerMeshError) in try core.sendDatagram(raw, to: peers) }
            }
            try result.get()
        }
    }

    /// Sends a datagram from raw bytes, without building a `Data`: the audio path's hot call.
    public func sendDatagram(_ bytes: UnsafeRawBufferPointer, toPeers peers: [PeerID]) throws(PeerMeshError) {
        guard !peers.isEmpty else { throw .invalidParameter("send: the peer list is empty") }
        guard !bytes.isEmpty else { throw .invalidParameter("send: the data is empty") }
        guard bytes.count <= Session.maximumDatagramSize else {
            throw .invalidParameter("send: \(bytes.count) bytes exceeds maximumDatagramSize (\(Session.maximumDatagramSize)) for unreliable mode")
        }
        try core.sendDatagram(bytes, to: peers)
    }

    /// Invites the advertiser at `endpoint` without discovery (`--connect host:port`). The peer is learned from
    /// its HELLO; it appears as `connecting`, then `connected` or, with a delegate call saying why, `notConnected`.
    /// A timeout of 0 or less means 30 s.
    public func connect(to endpoint: PeerEndpoint, context: Data? = nil, timeout: Duration = .seconds(30)) throws(PeerMeshError) {
        try core.invite(expected: nil, endpoint: endpoint, context: context, timeout: timeout)
    }

    /// Says goodbye to every peer and reports each `notConnected`. The session stays usable.
    public func disconnect() { core.disconnect() }
}
