import Foundation
import MeshAudio
import MeshPipeline
import PeerMesh
import Synchronization

/// The capture side of the relay: captures from an `AudioSource`, advertises a PeerMesh session, and sends each
/// captured period to every connected player at once (fan-out) as unreliable datagrams.
///
/// The chain is MeshPipeline's `CapturePipeline` (source → packetize → send, on the `pm-send` thread); the host
/// gives it the source and the network end: the connected players, and `Session.sendDatagram`.
public final class RelayHost: SessionDelegate, NearbyServiceAdvertiserDelegate, Sendable {
    /// How the host answers invitations.
    public enum AcceptPolicy: Sendable {
        /// Accept every player, up to the peer limit.
        case all
        /// Ask `decide` for each invitation (the CLI prompts on the terminal). Runs on the advertiser's thread.
        case ask(@Sendable (PeerID) -> Bool)
    }

    /// What the host needs to run.
    public struct Configuration: Sendable {
        /// The name players see.
        public var name: String
        /// The service type advertised.
        public var serviceType: String = "mesh-audio"
        /// TCP port of the advertiser and UDP port of the session (0 picks one; both use the same number).
        public var port: UInt16 = 0
        /// Peers in the session including the host.
        public var maximumPeers: Int = 33
        /// How invitations are answered.
        public var accept: AcceptPolicy = .all
        /// Discovery backend; `nil` means Avahi.
        public var discovery: (any DiscoveryBackend)?
        /// A player silent this long is dropped.
        public var peerTimeout: Duration = .seconds(2)

        public init(name: String, serviceType: String = "mesh-audio", port: UInt16 = 0, maximumPeers: Int = 33,
                    accept: AcceptPolicy = .all, discovery: (any DiscoveryBackend)? = nil) {
            self.name = name
            self.serviceType = serviceType
            self.port = port
            self.maximumPeers = maximumPeers
            self.accept = accept
            self.discovery = discovery
        }
    }

    /// Counters and levels, for the status line and `--json`.
    public struct Statistics: Sendable {
        public var players: [PeerID] = []
        public var packetsSent: UInt64 = 0
        public var framesCaptured: UInt64 = 0
        public var captureXruns: UInt64 = 0
        public var captureDelayFrames: Int = 0
        public var peakLevel: Float = 0
        public var rmsLevel: Float = 0
    }

    public let peer: PeerID
    public let configuration: Configuration
    public let session: Session
    private let advertiser: NearbyServiceAdvertiser
    private let source: any AudioSource
    private let players: Players
    private let capture: CapturePipeline<[PeerID]>
    private let running = Atomic<Bool>(false)
    private let events: @Sendable (String) -> Void
    private let askQueue = DispatchQueue(label: "peermesh.relay-host.ask")

    /// The connected players, shared with the send thread.
    private final class Players: Sendable {
        private let peers = Mutex<[PeerID]>([])
        /// The players now; nil when there are none.
        var audience: [PeerID]? { peers.withLock { $0.isEmpty ? nil : $0 } }
        var all: [PeerID] { peers.withLock { $0 } }
        func update(_ peer: PeerID, connected: Bool) {
            peers.withLock { p in
                p.removeAll { $0 == peer }
                if connected { p.append(peer) }
            }
        }
    }

    /// Opens the session and the advertiser (nothing is published until `start`).
    /// - Parameter log: receives one human-readable line per event (joins, leaves, invitations).
    public init(configuration: Configuration, source: any AudioSource, log: @escaping @Sendable (String) -> Void = { _ in }) throws {
        let name = String(decoding: configuration.name.utf8.prefix(PeerID.maximumDisplayNameBytes), as: UTF8.self)
        peer = try PeerID(displayName: name.isEmpty ? "mesh-record" : name)
        self.configuration = configuration
        self.source = source
        events = log
        let session = try Session(peer: peer, configuration: .init(maximumPeers: configuration.maximumPeers,
                                                                  peerTimeout: configuration.peerTimeout,
                                                                  udpPort: configuration.port))
        self.session = session
        let players = Players()
        self.players = players
        capture = try CapturePipeline(source: source, audience: { [players] in players.audience }, send: { bytes, peers in
            (try? session.sendDatagram(bytes, toPeers: peers)) != nil
        })
        advertiser = try NearbyServiceAdvertiser(
            peer: peer,
            discoveryInfo: ["rate": String(source.format.sampleRate), "ch": String(source.format.channels),
                            "period": String(source.periodFrames)],
            serviceType: configuration.serviceType, discovery: configuration.discovery,
            port: configuration.port == 0 ? session.udpPort : configuration.port)
        session.delegate = self
        advertiser.delegate = self
    }

    /// The advertiser's (and session's) port.
    public var port: UInt16 { advertiser.port ?? session.udpPort }

    /// Starts capture and the send thread, then advertising.
    public func start() throws {
        try capture.start()
        running.store(true, ordering: .releasing)
        try advertiser.startAdvertisingPeer()
    }

    /// Stops capture (nothing is sent after this), stops advertising and says goodbye to every player.
    public func stop() {
        guard running.exchange(false, ordering: .acquiringAndReleasing) else { return }
        capture.stop()
        advertiser.stopAdvertisingPeer()
        session.disconnect()
    }

    /// A snapshot of the counters.
    public var statistics: Statistics {
        var s = Statistics()
        s.players = players.all
        let c = capture.statistics
        s.packetsSent = c.packetsSent
        s.framesCaptured = c.framesCaptured
        s.peakLevel = c.peakLevel
        s.rmsLevel = c.rmsLevel
        let a = source.stats
        s.captureXruns = a.xruns
        s.captureDelayFrames = a.delayFrames
        return s
    }

    // MARK: Delegates

    public func session(_ session: Session, peer: PeerID, didChange state: SessionState) {
        players.update(peer, connected: state == .connected)
        switch state {
        case .connected: events("player \(peer.displayName) joined")
        case .notConnected: events("player \(peer.displayName) left")
        case .connecting: break
        }
    }

    public func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceiveInvitationFromPeer peer: PeerID,
                           withContext context: Data?, invitationHandler: @escaping @Sendable (Bool, Session?) -> Void) {
        switch configuration.accept {
        case .all:
            invitationHandler(true, session)
        case .ask(let decide):
            // Asking may take a person a while: do it off the advertiser's thread, one question at a time.
            askQueue.async { [self] in
                let yes = decide(peer)
                events(yes ? "accepted \(peer.displayName)" : "declined \(peer.displayName)")
                invitationHandler(yes, yes ? session : nil)
            }
        }
    }

    public func advertiser(_ advertiser: NearbyServiceAdvertiser, didNotStartAdvertisingPeer error: PeerMeshError) {
        events("advertising failed: \(error)")
    }
}
