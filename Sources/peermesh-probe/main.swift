// peermesh-probe: a small PeerMesh peer for tests and for trying the library by hand.
//
//   peermesh-probe host --service TYPE --name NAME [--port N] [--avahi | --inprocess] [--duration SECONDS]
//       Advertises, accepts every invitation, echoes reliable messages and datagrams back.
//   peermesh-probe join --service TYPE --name NAME [--avahi] [--connect HOST:PORT] [--reliable N] [--datagrams N] [--timeout SECONDS]
//       Finds the first host (or connects directly), invites it, sends N reliable messages and N datagrams,
//       waits for the echoes and prints one JSON summary line. Exit 0 on success, 1 on failure, 2 on bad flags.
//
// Events go to stdout as JSON lines; diagnostics to stderr.
import Foundation
import PeerMesh
import Synchronization

struct ProbeConfig {
    enum Mode { case host, join }
    var mode: Mode
    var service = "peermesh-probe"
    var name = ProcessInfo.processInfo.hostName
    var port: UInt16 = 0
    var duration: Double = 3600
    var connect: PeerEndpoint?
    var reliable = 10
    var datagrams = 100
    var timeout: Double = 10
    var peerTimeout: Double = 2
    /// Skip DNS-SD: reachable only with --connect.
    var direct = false
}

func usage() -> Never {
    FileHandle.standardError.write(Data("""
    usage: peermesh-probe host --service TYPE [--name NAME] [--port N] [--direct] [--duration S] [--peer-timeout S]
           peermesh-probe join --service TYPE [--name NAME] [--connect HOST:PORT] [--reliable N] [--datagrams N] [--timeout S]
    Discovery goes through avahi-daemon unless --connect is given.

    """.utf8))
    exit(2)
}

func parse(_ args: [String]) -> ProbeConfig {
    guard let first = args.first else { usage() }
    var c: ProbeConfig
    switch first {
    case "host": c = ProbeConfig(mode: .host)
    case "join": c = ProbeConfig(mode: .join)
    case "--help", "-h": usage()
    default: usage()
    }
    var i = 1
    func value() -> String {
        i += 1
        guard i < args.count else { usage() }
        return args[i]
    }
    while i < args.count {
        switch args[i] {
        case "--service": c.service = value()
        case "--name": c.name = value()
        case "--port": guard let p = UInt16(value()) else { usage() }; c.port = p
        case "--duration": guard let d = Double(value()) else { usage() }; c.duration = d
        case "--connect": guard let e = PeerEndpoint(parsing: value()) else { usage() }; c.connect = e
        case "--reliable": guard let n = Int(value()) else { usage() }; c.reliable = n
        case "--datagrams": guard let n = Int(value()) else { usage() }; c.datagrams = n
        case "--timeout": guard let t = Double(value()) else { usage() }; c.timeout = t
        case "--peer-timeout": guard let t = Double(value()) else { usage() }; c.peerTimeout = t
        case "--avahi": break // the default
        case "--direct": c.direct = true
        default: usage()
        }
        i += 1
    }
    return c
}

func emit(_ object: [String: Any]) {
    let data = try! JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
    FileHandle.standardOutput.write(data + Data("\n".utf8))
}

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("peermesh-probe: \(message)\n".utf8))
    exit(1)
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
        emit(["event": "state", "peer": peer.displayName, "id": peer.identityString, "state": s.description])
        state.withLock { if s == .connected { $0.connected = peer } else if $0.connected == peer { $0.connected = nil } }
    }
    func session(_ session: Session, didReceive data: Data, fromPeer peer: PeerID) {
        if echo { try? session.send(data, toPeers: [peer], with: .reliable) } else { state.withLock { $0.reliableEchoed += 1 } }
    }
    func session(_ session: Session, didReceiveDatagram data: Data, fromPeer peer: PeerID) {
        if echo { try? session.send(data, toPeers: [peer], with: .unreliable) } else { state.withLock { $0.datagramsEchoed += 1 } }
    }
    func session(_ session: Session, invitationTo peer: PeerID?, failedWith reason: DeclineReason, detail: String) {
        emit(["event": "invitationFailed", "reason": reason.description, "detail": detail])
        state.withLock { $0.failure = detail }
    }
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceiveInvitationFromPeer peer: PeerID, withContext context: Data?,
                    invitationHandler: @escaping @Sendable (Bool, Session?) -> Void) {
        emit(["event": "invitation", "peer": peer.displayName])
        invitationHandler(true, session)
    }
    func browser(_ browser: NearbyServiceBrowser, foundPeer peer: PeerID, withDiscoveryInfo info: [String: String]?) {
        emit(["event": "found", "peer": peer.displayName, "id": peer.identityString])
        state.withLock { $0.found.append(peer) }
    }
    func browser(_ browser: NearbyServiceBrowser, lostPeer peer: PeerID) {
        emit(["event": "lost", "peer": peer.displayName])
    }
    func browser(_ browser: NearbyServiceBrowser, didNotStartBrowsingForPeers error: PeerMeshError) {
        state.withLock { $0.failure = error.description }
    }
}

let config = parse(Array(CommandLine.arguments.dropFirst()))
do {
    let me = try PeerID(displayName: String(config.name.utf8.prefix(63)) ?? "probe")
    let session = try Session(peer: me, configuration: .init(peerTimeout: .milliseconds(Int(config.peerTimeout * 1000)), udpPort: config.port))
    switch config.mode {
    case .host:
        let probe = Probe(session: session, echo: true)
        session.delegate = probe
        let advertiser = try NearbyServiceAdvertiser(peer: me, discoveryInfo: ["probe": "1"], serviceType: config.service,
                                                      discovery: config.direct ? InProcessDiscovery() : nil, port: config.port)
        advertiser.delegate = probe
        try advertiser.startAdvertisingPeer()
        emit(["event": "advertising", "port": Int(advertiser.port ?? 0), "udpPort": Int(session.udpPort), "id": me.identityString])
        let stop = DispatchSemaphore(value: 0)
        signal(SIGTERM, SIG_IGN); signal(SIGINT, SIG_IGN)
        let sources = [SIGTERM, SIGINT].map { sig -> DispatchSourceSignal in
            let s = DispatchSource.makeSignalSource(signal: sig)
            s.setEventHandler { stop.signal() }
            s.resume()
            return s
        }
        _ = stop.wait(timeout: .now() + config.duration)
        _ = sources
        advertiser.stopAdvertisingPeer()
        session.disconnect()
        usleep(50_000)
    case .join:
        let probe = Probe(session: session, echo: false)
        session.delegate = probe
        let started = Date()
        var browser: NearbyServiceBrowser?
        if let endpoint = config.connect {
            try session.connect(to: endpoint, timeout: .milliseconds(Int(config.timeout * 1000)))
        } else {
            let b = try NearbyServiceBrowser(peer: me, serviceType: config.service)
            b.delegate = probe
            try b.startBrowsingForPeers()
            browser = b
        }
        let deadline = Date().addingTimeInterval(config.timeout)
        var discoverMillis = -1.0
        var invited = config.connect != nil
        while Date() < deadline {
            let s = probe.state.withLock { $0 }
            if s.failure != nil, s.connected == nil, !invited || config.connect != nil { break }
            if !invited, let host = s.found.first {
                discoverMillis = Date().timeIntervalSince(started) * 1000
                try browser!.invitePeer(host, to: session, withContext: nil, timeout: .seconds(5))
                invited = true
            }
            if s.connected != nil { break }
            usleep(2_000)
        }
        guard let host = probe.state.withLock({ $0.connected }) else {
            emit(["found": discoverMillis >= 0, "connected": false, "error": probe.state.withLock { $0.failure } ?? "timed out"])
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
        emit(["found": true, "connected": true, "host": host.displayName, "reliableEchoed": s.reliableEchoed,
              "datagramsEchoed": s.datagramsEchoed, "discoverMillis": discoverMillis, "connectMillis": connectMillis,
              "rttMicros": session.roundTripTime(to: host).map { Double($0.components.attoseconds) / 1e12 } ?? -1])
        session.disconnect()
        usleep(50_000)
        exit(ok ? 0 : 1)
    }
} catch let e as PeerMeshError {
    fail(e.description)
} catch {
    fail("\(error)")
}
