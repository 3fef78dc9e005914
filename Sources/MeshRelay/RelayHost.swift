import Foundation
import MeshAudio
import MeshPipeline
import PeerMesh
import Synchronization

/// The capture side of the relay: captures from an `AudioSource`, advertises a PeerMesh session, and sends each
/// captured period to every connected player at once (fan-out) as unreliable datagrams.
///
/// The chain is capture → packetize → send, each a single call on the host's send thread:
/// `source.read` → `Packetizer.packetize` → `Session.sendDatagram`.
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
    private let players = Mutex<[PeerID]>([])
    private let counters = Mutex(Statistics())
    private let running = Atomic<Bool>(false)
    private let finished = DispatchSemaphore(value: 0)
    private let events: @Sendable (String) -> Void
    private let askQueue = DispatchQueue(label: "mesh-record.ask")

    /// Opens the session and the advertiser (nothing is published until `start`).
    /// - Parameter log: receives one human-readable line per event (joins, leaves, invitations).
    public init(configuration: Configuration, source: any AudioSource, log: @escaping @Sendable (String) -> Void = { _ in }) throws {
        let name = String(decoding: configuration.name.utf8.prefix(PeerID.maximumDisplayNameBytes), as: UTF8.self)
        peer = try PeerID(displayName: name.isEmpty ? "mesh-record" : name)
        self.configuration = configuration
        self.source = source
        events = log
        session = try Session(peer: peer, configuration: .init(maximumPeers: configuration.maximumPeers,
                                                              peerTimeout: configuration.peerTimeout,
                                                              udpPort: configuration.port))
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

    /// Starts capture, advertising and the send thread.
    public func start() throws {
        try source.start()
        try advertiser.startAdvertisingPeer()
        running.store(true, ordering: .releasing)
        let t = Thread { [self] in sendLoop() }
        t.name = "mesh-record.send"
        t.qualityOfService = .userInteractive
        t.start()
    }

    /// Stops advertising, says goodbye to every player and stops capture.
    public func stop() {
        guard running.exchange(false, ordering: .acquiringAndReleasing) else { return }
        advertiser.stopAdvertisingPeer()
        session.disconnect()
        source.stop()
        finished.wait()
    }

    /// A snapshot of the counters.
    public var statistics: Statistics {
        var s = counters.withLock { $0 }
        s.players = players.withLock { $0 }
        let a = source.stats
        s.captureXruns = a.xruns
        s.captureDelayFrames = a.delayFrames
        return s
    }

    private func sendLoop() {
        defer { finished.signal() }
        let format = source.format
        let samples = UnsafeMutableBufferPointer<Float>.allocate(capacity: source.periodFrames * format.channels)
        defer { samples.deallocate() }
        let scratch = UnsafeMutableRawBufferPointer.allocate(byteCount: AudioPacket.maximumSize, alignment: 8)
        defer { scratch.deallocate() }
        guard var packetizer = try? Packetizer(format: format) else { return }
        while running.load(ordering: .acquiring) {
            guard let chunk = source.read(into: samples, timeoutNanos: 100_000_000) else { continue }
            let targets = players.withLock { $0 }
            packetizer.hostLatencyFrames = UInt32(clamping: max(0, source.stats.delayFrames))
            var peak: Float = 0, sum: Float = 0
            let n = chunk.frames * format.channels
            for i in 0..<n { let v = abs(samples[i]); peak = max(peak, v); sum += v * v }
            var sent: UInt64 = 0
            if !targets.isEmpty {
                packetizer.packetize(UnsafeBufferPointer(rebasing: samples[0..<n]), chunk: chunk, scratch: scratch) { bytes in
                    // A player may leave between the snapshot and the send; the next period skips it.
                    if (try? session.sendDatagram(bytes, toPeers: targets)) != nil { sent += 1 }
                }
            }
            counters.withLock { c in
                c.packetsSent += sent
                c.framesCaptured += UInt64(chunk.frames)
                c.peakLevel = peak
                c.rmsLevel = n > 0 ? (sum / Float(n)).squareRoot() : 0
            }
        }
    }

    // MARK: Delegates

    public func session(_ session: Session, peer: PeerID, didChange state: SessionState) {
        players.withLock { p in
            p.removeAll { $0 == peer }
            if state == .connected { p.append(peer) }
        }
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
