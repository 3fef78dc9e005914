import Foundation
import PeerMesh
import MeshTestSupport
import Synchronization

/// Records everything a session, advertiser or browser reports, and waits for conditions with a deadline.
final class MeshEventLog: SessionDelegate, NearbyServiceAdvertiserDelegate, NearbyServiceBrowserDelegate, Sendable {
    struct Snapshot: Sendable {
        var states: [(PeerID, SessionState)] = []
        var reliable: [(PeerID, Data)] = []
        var datagrams: [(PeerID, Data)] = []
        var failures: [(PeerID?, DeclineReason, String)] = []
        var found: [PeerID] = []
        var lost: [PeerID] = []
        var invitations: [(PeerID, Data?)] = []
        var eventThreads: Set<UInt> = []
        /// Resources a peer started sending us, in order, with their progress.
        var resourcesStarted: [(PeerID, String, ResourceProgress)] = []
        /// Resources that ended: the path the file was moved to (nil on failure) and the error.
        var resourcesFinished: [(PeerID, String, String?, PeerMeshError?)] = []
        /// Byte streams peers opened to us, in order.
        var streams: [(PeerID, String, InputByteStream)] = []
        /// Everything in the order it happened, for tests of interleaving ("msg", "resource").
        var order: [String] = []
        /// Short authentication strings the advertisers we invited opened to us, and whether the peer was already
        /// connected when they came.
        var digits: [(PeerID, String, afterConnected: Bool)] = []
    }

    /// Where received resources are moved during the delegate call (nil: left to be deleted).
    let keepResourcesIn = Mutex<String?>(nil)

    let state = Mutex(Snapshot())
    /// How to answer invitations: the session to join, or nil to decline.
    let acceptInto = Mutex<Session?>(nil)
    let autoAnswer = Mutex(true)
    let heldReplies = Mutex<[@Sendable (Bool, Session?) -> Void]>([])
    /// What the app does when a peer connects, inside the delegate call (after it is logged).
    let onConnected = Mutex<(@Sendable (Session, PeerID) -> Void)?>(nil)

    func session(_ session: Session, peer: PeerID, didChange s: SessionState) {
        state.withLock { $0.states.append((peer, s)); $0.eventThreads.insert(UInt(pthread_self())) }
        if s == .connected, let act = onConnected.withLock({ $0 }) { act(session, peer) }
    }
    func session(_ session: Session, didReceive data: Data, fromPeer peer: PeerID) {
        state.withLock { $0.reliable.append((peer, data)); $0.order.append("msg") }
    }
    func session(_ session: Session, didReceive stream: InputByteStream, withName name: String, fromPeer peer: PeerID) {
        state.withLock { $0.streams.append((peer, name, stream)) }
    }
    func session(_ session: Session, didStartReceivingResourceWithName name: String, fromPeer peer: PeerID,
                 with progress: ResourceProgress) {
        state.withLock { $0.resourcesStarted.append((peer, name, progress)) }
    }
    func session(_ session: Session, didFinishReceivingResourceWithName name: String, fromPeer peer: PeerID,
                 at localURL: URL?, withError error: PeerMeshError?) {
        var kept: String?
        if let localURL, let dir = keepResourcesIn.withLock({ $0 }) {
            let target = "\(dir)/\(name)"
            if (try? FileManager.default.moveItem(atPath: localURL.path, toPath: target)) != nil { kept = target }
        }
        state.withLock { $0.resourcesFinished.append((peer, name, kept, error)); $0.order.append("resource") }
    }
    func session(_ session: Session, didReceiveShortAuthenticationString digits: String, fromPeer peer: PeerID) {
        state.withLock { s in
            s.digits.append((peer, digits, s.states.contains { $0.0 == peer && $0.1 == .connected }))
        }
    }
    func session(_ session: Session, didReceiveDatagram data: Data, fromPeer peer: PeerID) {
        state.withLock { $0.datagrams.append((peer, data)) }
    }
    func session(_ session: Session, invitationTo peer: PeerID?, failedWith reason: DeclineReason, detail: String) {
        state.withLock { $0.failures.append((peer, reason, detail)) }
    }
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceiveInvitationFromPeer peer: PeerID,
                    withContext context: Data?, invitationHandler: @escaping @Sendable (Bool, Session?) -> Void) {
        state.withLock { $0.invitations.append((peer, context)) }
        if autoAnswer.withLock({ $0 }) {
            let s = acceptInto.withLock { $0 }
            invitationHandler(s != nil, s)
        } else {
            heldReplies.withLock { $0.append(invitationHandler) }
        }
    }
    func browser(_ browser: NearbyServiceBrowser, foundPeer peer: PeerID, withDiscoveryInfo info: [String: String]?) {
        state.withLock { $0.found.append(peer) }
    }
    func browser(_ browser: NearbyServiceBrowser, lostPeer peer: PeerID) {
        state.withLock { $0.lost.append(peer) }
    }

    var snapshot: Snapshot { state.withLock { $0 } }

    func states(of peer: PeerID) -> [SessionState] { snapshot.states.filter { $0.0 == peer }.map(\.1) }

    /// Polls `condition` until it holds or `seconds` pass; returns whether it held.
    @discardableResult
    func wait(_ seconds: Double = 5, _ condition: (Snapshot) -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if condition(snapshot) { return true }
            usleep(2_000)
        }
        return condition(snapshot)
    }
}

/// A connected host/guest pair over the in-process discovery, for tests.
struct Pair {
    let discovery = InProcessDiscovery()
    let hostPeer: PeerID
    let guestPeer: PeerID
    let host: Session
    let guest: Session
    let hostLog = MeshEventLog()
    let guestLog = MeshEventLog()
    let advertiser: NearbyServiceAdvertiser
    let browser: NearbyServiceBrowser

    init(service: String = "pm-test", hostConfig: Session.Configuration = .init(), guestConfig: Session.Configuration = .init(),
         connect: Bool = true) throws {
        hostPeer = try PeerID(displayName: "host")
        guestPeer = try PeerID(displayName: "guest")
        let hostSession = try Session(peer: hostPeer, configuration: hostConfig)
        host = hostSession
        guest = try Session(peer: guestPeer, configuration: guestConfig)
        host.delegate = hostLog
        guest.delegate = guestLog
        advertiser = try NearbyServiceAdvertiser(peer: hostPeer, discoveryInfo: ["room": "kitchen"], serviceType: service,
                                                 discovery: discovery, bindHost: "127.0.0.1")
        advertiser.delegate = hostLog
        hostLog.acceptInto.withLock { $0 = hostSession }
        browser = try NearbyServiceBrowser(peer: guestPeer, serviceType: service, discovery: discovery)
        browser.delegate = guestLog
        if connect { try self.connect() }
    }

    func connect() throws {
        try advertiser.startAdvertisingPeer()
        try browser.startBrowsingForPeers()
        guard guestLog.wait(5, { $0.found.contains(hostPeer) }) else { throw PeerMeshError.transport("host not found") }
        try browser.invitePeer(hostPeer, to: guest, withContext: Data("hi".utf8), timeout: .seconds(5))
        guard guestLog.wait(5, { s in s.states.contains { $0.0 == hostPeer && $0.1 == .connected } }),
              hostLog.wait(5, { s in s.states.contains { $0.0 == guestPeer && $0.1 == .connected } })
        else { throw PeerMeshError.transport("pair did not connect") }
    }
    /// Another peer, with its own session, log and browser, that finds the host and invites itself (the outcome,
    /// connected or declined, shows in `log`).
    struct Joiner {
        let peer: PeerID
        let session: Session
        let log: MeshEventLog
        let browser: NearbyServiceBrowser
    }

    /// A `Joiner` named `name` that has found the host and sent its invitation.
    func join(as name: String) throws -> Joiner {
        let peer = try PeerID(displayName: name)
        let session = try Session(peer: peer)
        let log = MeshEventLog()
        session.delegate = log
        let browser = try NearbyServiceBrowser(peer: peer, serviceType: "pm-test", discovery: discovery)
        browser.delegate = log
        try browser.startBrowsingForPeers()
        guard log.wait(5, { $0.found.contains(hostPeer) }) else { throw PeerMeshError.transport("host not found") }
        try browser.invitePeer(hostPeer, to: session, withContext: nil, timeout: .seconds(5))
        return Joiner(peer: peer, session: session, log: log, browser: browser)
    }
}
