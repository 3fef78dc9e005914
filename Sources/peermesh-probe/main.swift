// peermesh-probe: a small PeerMesh peer for tests and for trying the library by hand.
//
//   peermesh-probe host --service TYPE --name NAME [--port N] [--direct] [--duration SECONDS]
//       Advertises, accepts every invitation, echoes reliable messages and datagrams back.
//   peermesh-probe join --service TYPE --name NAME [--avahi] [--connect HOST:PORT] [--reliable N] [--datagrams N] [--timeout SECONDS]
//       Finds the first host (or connects directly), invites it, sends N reliable messages and N datagrams,
//       waits for the echoes and prints one JSON summary line. Exit 0 on success, 1 on failure, 2 on bad flags.
//   peermesh-probe host --offer-for PEERFILE DATAFILE / join --offer PEERFILE DATAFILE
//       Out of band, with no DNS-SD: the joiner writes its peer ID to PEERFILE, the host answers with connection
//       data for it (Session.nearbyConnectionData) in DATAFILE, the joiner connects with it (connectPeer).
//
// Events go to stdout as JSON lines; diagnostics to stderr.
import Foundation
import MeshCLI
import MeshPOSIX
import PeerMesh
import Synchronization

func emit(_ fields: (inout JSONObject) -> Void) {
    var o = JSONObject()
    fields(&o)
    terminal.stdout(o.description)
}

let config = ProbeOptions.configurationFromCommandLine()
let terminal = Terminal(program: ProbeOptions.program, quiet: false)

func fail(_ message: String) -> Never { terminal.fail(message) }

/// What `host --offer-for` writes for the joiner: the host's peer ID and the connection data made for the joiner.
struct Offer: Codable {
    var peer: PeerID
    var data: Data
}

/// Writes `value` as JSON to `path` whole (a temporary file renamed into place: a reader never sees half of it).
func writeJSON(_ value: some Encodable, to path: String) throws {
    try JSONEncoder().encode(value).write(to: URL(fileURLWithPath: path), options: .atomic)
}

/// Reads JSON from `path` once it exists, waiting up to `seconds`; nil on time-out.
func awaitJSON<T: Decodable>(_ type: T.Type, at path: String, seconds: Double) throws -> T? {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if let bytes = FileManager.default.contents(atPath: path) { return try JSONDecoder().decode(T.self, from: bytes) }
        usleep(20_000)
    }
    return nil
}

final class Probe: SessionDelegate, NearbyServiceAdvertiserDelegate, NearbyServiceBrowserDelegate, Sendable {
    struct State {
        var found: [PeerID] = []
        var connected: PeerID?
        var reliableEchoed = 0
        var datagramsEchoed = 0
        var failure: String?
    }
    let state = Mutex(State())
    let session: Session
    let echo: Bool

    init(session: Session, echo: Bool) {
        self.session = session
        self.echo = echo
    }

    func session(_ session: Session, peer: PeerID, didChange s: SessionState) {
        emit { $0.add("event", "state"); $0.add("peer", peer.displayName); $0.add("id", peer.identityString); $0.add("state", s.description) }
        state.withLock { if s == .connected { $0.connected = peer } else if $0.connected == peer { $0.connected = nil } }
    }
    func session(_ session: Session, didReceive data: Data, fromPeer peer: PeerID) {
        if echo { try? session.send(data, toPeers: [peer], with: .reliable) } else { state.withLock { $0.reliableEchoed += 1 } }
    }
    func session(_ session: Session, didReceiveDatagram data: Data, fromPeer peer: PeerID) {
        if echo { try? session.send(data, toPeers: [peer], with: .unreliable) } else { state.withLock { $0.datagramsEchoed += 1 } }
    }
    func session(_ session: Session, invitationTo peer: PeerID?, failedWith reason: DeclineReason, detail: String) {
        emit { $0.add("event", "invitationFailed"); $0.add("reason", reason.description); $0.add("detail", detail) }
        state.withLock { $0.failure = detail }
    }
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceiveInvitationFromPeer peer: PeerID, withContext context: Data?,
                    invitationHandler: @escaping @Sendable (Bool, Session?) -> Void) {
        emit { $0.add("event", "invitation"); $0.add("peer", peer.displayName) }
        invitationHandler(true, session)
    }
    func browser(_ browser: NearbyServiceBrowser, foundPeer peer: PeerID, withDiscoveryInfo info: [String: String]?) {
        emit { $0.add("event", "found"); $0.add("peer", peer.displayName); $0.add("id", peer.identityString) }
        state.withLock { $0.found.append(peer) }
    }
    func browser(_ browser: NearbyServiceBrowser, lostPeer peer: PeerID) {
        emit { $0.add("event", "lost"); $0.add("peer", peer.displayName) }
    }
    func browser(_ browser: NearbyServiceBrowser, didNotStartBrowsingForPeers error: PeerMeshError) {
        state.withLock { $0.failure = error.description }
    }
}

do {
    let me = try PeerID(displayName: String(decoding: config.name.utf8.prefix(63), as: UTF8.self))
    let session = try Session(peer: me, configuration: .init(peerTimeout: .milliseconds(Int(config.peerTimeout * 1000)), udpPort: config.port))
    switch config.mode {
    case .host where config.offer != nil:
        let files = config.offer!
        let probe = Probe(session: session, echo: true)
        session.delegate = probe
        guard let guest = try awaitJSON(PeerID.self, at: files.peerFile, seconds: config.duration) else {
            fail("no peer file at \(files.peerFile) within \(config.duration) s")
        }
        try writeJSON(Offer(peer: me, data: try session.nearbyConnectionData(forPeer: guest)), to: files.dataFile)
        emit { $0.add("event", "offered"); $0.add("for", guest.displayName); $0.add("file", files.dataFile); $0.add("id", me.identityString) }
        let stop = DispatchSemaphore(value: 0)
        let trap = SignalTrap(queue: .global()) { _ in stop.signal() }
        _ = stop.wait(timeout: .now() + config.duration)
        _ = trap
        session.disconnect()
        usleep(50_000)
    case .host:
        let probe = Probe(session: session, echo: true)
        session.delegate = probe
        let advertiser = try NearbyServiceAdvertiser(peer: me, discoveryInfo: ["probe": "1"], serviceType: config.service,
                                                      discovery: config.direct ? InProcessDiscovery() : nil, port: config.port)
        advertiser.delegate = probe
        try advertiser.startAdvertisingPeer()
        emit { $0.add("event", "advertising"); $0.add("port", Int(advertiser.port ?? 0)); $0.add("udpPort", Int(session.udpPort)); $0.add("id", me.identityString) }
        let stop = DispatchSemaphore(value: 0)
        let trap = SignalTrap(queue: .global()) { _ in stop.signal() }
        _ = stop.wait(timeout: .now() + config.duration)
        _ = trap
        advertiser.stopAdvertisingPeer()
        session.disconnect()
        usleep(50_000)
    case .join:
        let probe = Probe(session: session, echo: false)
        session.delegate = probe
        let started = Date()
        var browser: NearbyServiceBrowser?
        if let files = config.offer {
            try writeJSON(me, to: files.peerFile)
            guard let offer = try awaitJSON(Offer.self, at: files.dataFile, seconds: config.timeout) else {
                emit { $0.add("found", false); $0.add("connected", false); $0.add("error", "no connection data at \(files.dataFile)") }
                exit(1)
            }
            try session.connectPeer(offer.peer, withNearbyConnectionData: offer.data)
        } else if let endpoint = config.connect {
            try session.connect(to: endpoint, timeout: .milliseconds(Int(config.timeout * 1000)))
        } else {
            let b = try NearbyServiceBrowser(peer: me, serviceType: config.service)
            b.delegate = probe
            try b.startBrowsingForPeers()
            browser = b
        }
        let deadline = Date().addingTimeInterval(config.timeout)
        var discoverMillis = -1.0
        let direct = config.connect != nil || config.offer != nil
        var invited = direct
        while Date() < deadline {
            let s = probe.state.withLock { $0 }
            if s.failure != nil, s.connected == nil, !invited || direct { break }
            if !invited, let host = s.found.first {
                discoverMillis = Date().timeIntervalSince(started) * 1000
                try browser!.invitePeer(host, to: session, withContext: nil, timeout: .seconds(5))
                invited = true
            }
            if s.connected != nil { break }
            usleep(2_000)
        }
        guard let host = probe.state.withLock({ $0.connected }) else {
            emit { $0.add("found", discoverMillis >= 0); $0.add("connected", false); $0.add("error", probe.state.withLock { $0.failure } ?? "timed out") }
            exit(1)
        }
        let connectMillis = Date().timeIntervalSince(started) * 1000
        for i in 0..<config.reliable { try session.send(Data("message \(i)".utf8), toPeers: [host], with: .reliable) }
        for i in 0..<config.datagrams {
            try session.send(Data("datagram \(i)".utf8), toPeers: [host], with: .unreliable)
            if i % 64 == 63 { usleep(1_000) }
        }
        let echoDeadline = Date().addingTimeInterval(5)
        while Date() < echoDeadline {
            let s = probe.state.withLock { $0 }
            if s.reliableEchoed == config.reliable && s.datagramsEchoed == config.datagrams { break }
            usleep(5_000)
        }
        let s = probe.state.withLock { $0 }
        let ok = s.reliableEchoed == config.reliable && Double(s.datagramsEchoed) >= 0.9 * Double(config.datagrams)
        emit { o in
            o.add("found", true); o.add("connected", true); o.add("host", host.displayName)
            o.add("reliableEchoed", s.reliableEchoed); o.add("datagramsEchoed", s.datagramsEchoed)
            o.add("discoverMillis", discoverMillis); o.add("connectMillis", connectMillis)
            o.add("rttMicros", session.roundTripTime(to: host).map { $0.milliseconds * 1000 } ?? -1)
        }
        session.disconnect()
        usleep(50_000)
        exit(ok ? 0 : 1)
    }
} catch {
    fail("\(error)")
}
