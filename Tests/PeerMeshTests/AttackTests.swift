import Foundation
import Synchronization
import Testing
import MeshPOSIX
import MeshTestSupport
@testable import PeerMesh

/// A UDP socket of the attacker's, on 127.0.0.1.
private final class AttackerUDP {
    let fd: FileDescriptor

    init() throws {
        fd = try FileDescriptor.udpSocket(SocketAddress(numericHost: "127.0.0.1", port: 0)!)
    }

    func send(_ bytes: [UInt8], toPort port: UInt16) {
        _ = bytes.withUnsafeBytes { fd.send($0, to: SocketAddress(numericHost: "127.0.0.1", port: port)!) }
    }

    /// Datagrams that arrive within `seconds`.
    func received(within seconds: Double) -> Int {
        var count = 0
        let deadline = Date().addingTimeInterval(seconds)
        var buf = [UInt8](repeating: 0, count: 2048)
        while Date() < deadline {
            if buf.withUnsafeMutableBytes({ fd.receive(into: $0) }) != nil { count += 1 } else { usleep(5_000) }
        }
        return count
    }
}

/// Holds certificate questions until the test answers them; answers later ones at once when `approveNew`.
private final class Judge: SessionDelegate, Sendable {
    let log = MeshEventLog()
    let held = Mutex<[@Sendable (Bool) -> Void]>([])
    let approveNew = Atomic<Bool>(false)
    func session(_ session: Session, peer: PeerID, didChange state: SessionState) { log.session(session, peer: peer, didChange: state) }
    func session(_ session: Session, invitationTo peer: PeerID?, failedWith reason: DeclineReason, detail: String) {
        log.session(session, invitationTo: peer, failedWith: reason, detail: detail)
    }
    func session(_ session: Session, didReceiveCertificate certificate: PeerCertificate, fromPeer peer: PeerID,
                 certificateHandler: @escaping @Sendable (Bool) -> Void) {
        if approveNew.load(ordering: .acquiring) { return certificateHandler(true) }
        held.withLock { $0.append(certificateHandler) }
    }
}

/// An advertiser for `host` on 127.0.0.1 (in-process discovery) whose invitations `invitations` answers by
/// accepting them into `host`.
private func advertise(_ host: Session, as type: String, answeredBy invitations: MeshEventLog,
                       on discovery: any DiscoveryBackend = InProcessDiscovery()) throws -> NearbyServiceAdvertiser {
    invitations.acceptInto.withLock { $0 = host }
    return try advertiser(for: host.myPeerID, as: type, delegate: invitations, on: discovery)
}

/// A started advertiser for `peer` on 127.0.0.1 (in-process discovery: its own, or `discovery`) whose invitations go
/// to `delegate` (held weakly: the caller keeps it).
private func advertiser(for peer: PeerID, as type: String, delegate: any NearbyServiceAdvertiserDelegate,
                        on discovery: any DiscoveryBackend = InProcessDiscovery()) throws -> NearbyServiceAdvertiser {
    let a = try NearbyServiceAdvertiser(peer: peer, discoveryInfo: nil, serviceType: type,
                                        discovery: discovery, bindHost: "127.0.0.1")
    a.delegate = delegate
    try a.startAdvertisingPeer()
    return a
}

/// A session on 127.0.0.1, its log, and its advertiser (`type`), which lets every invitation in.
private func hostToSearch(as type: String) throws -> (Session, MeshEventLog, NearbyServiceAdvertiser) {
    try acceptingHost("host", as: type)
}

/// Twenty tries of a searcher for matching digits at `advertiser`, one after another (`attempt` makes one, and says
/// whether the advertiser answered): sixteen are answered at once, then one a second (a loaded machine may take more
/// than a second over them), and every refusal is counted, exactly. Returns how many were answered.
private func searchTwenty(_ advertiser: NearbyServiceAdvertiser, _ attempt: () throws -> Bool) rethrows -> Int {
    var outcomes: [Bool] = []
    let started = Date()
    for _ in 0..<20 { outcomes.append(try attempt()) }
    let elapsed = Date().timeIntervalSince(started)
    let answered = outcomes.filter { $0 }.count
    #expect(outcomes.prefix(16).allSatisfy { $0 }, "\(outcomes)")
    #expect(answered <= 16 + Int(elapsed), "\(answered) answered in \(elapsed) s: \(outcomes)")
    #expect(eventually(2) { advertiser.statistics.rationedConnections == UInt64(20 - answered) }, "every refusal counted, exactly")
    return answered
}

/// The INVITE the hand-driven callers send.
private let handInvite = ControlFrame.invite(.init(context: [], timeoutMillis: 30_000, udpPort: 9, token: 7))

/// An inviting session on 127.0.0.1 whose ration of shares of the digits given away unanswered is `burst`, and its log.
private func rationedInviter(burst: Int) throws -> (Session, MeshEventLog) {
    var configuration = Session.Configuration(bindHost: "127.0.0.1")
    configuration.unansweredInvitationBurst = burst
    let inviter = try Session(peer: try PeerID(displayName: "inviter"), configuration: configuration)
    let log = MeshEventLog()
    inviter.delegate = log
    return (inviter, log)
}

/// A host session on 127.0.0.1 named `name`, its log, and its advertiser of `type`, which accepts every invitation.
private func acceptingHost(_ name: String, as type: String,
                           on discovery: any DiscoveryBackend = InProcessDiscovery()) throws -> (Session, MeshEventLog, NearbyServiceAdvertiser) {
    let host = try Session(peer: try PeerID(displayName: name), configuration: .init(bindHost: "127.0.0.1"))
    let log = MeshEventLog()
    host.delegate = log
    return (host, log, try advertise(host, as: type, answeredBy: log, on: discovery))
}

/// A host session on 127.0.0.1 whose certificate checks a `Judge` holds.
private func judgedHost() throws -> (Session, Judge) {
    let host = try Session(peer: try PeerID(displayName: "host"), configuration: .init(bindHost: "127.0.0.1"))
    let judge = Judge()
    host.delegate = judge
    return (host, judge)
}

/// An inviter played by hand over a real TCP connection: a real `SecureChannel` whose bytes the test moves, so
/// that it can stop where a man in the middle would (after the handshake, before its INVITE).
private struct HandDrivenCaller {
    let socket: FileDescriptor
    var channel: SecureChannel
    /// The advertiser's digits, once its SAS-NONCE came.
    var digits: String?
    var faults: [PeerFault] = []
    /// Frames the advertiser sent, in order (its HELLO first).
    var frames: [ControlFrame] = []
    /// The digits this caller had when ACCEPT came (nil: none, or no ACCEPT).
    var digitsAtAccept: String?

    init(port: UInt16, as peer: PeerID) throws {
        socket = try FileDescriptor.tcpConnect(to: SocketAddress(numericHost: "127.0.0.1", port: port)!)
        channel = SecureChannel(configuration: .init(role: .initiator, preference: .required, localPeer: peer))
        perform(channel.start())
    }

    /// A caller that has finished the handshake with `advertiser` and invited, once `arrived` says its invitation
    /// reached the app.
    init(inviting advertiser: NearbyServiceAdvertiser, as name: String, arrived: () -> Bool) throws {
        try self.init(port: advertiser.port!, as: try PeerID(displayName: name))
        #expect(pump(seconds: 5) { $0.channel.isEncrypted }, "\(faults)")
        write(channel.send(handInvite))
        let reached = eventually(3, arrived)
        #expect(reached, "\(name)'s invitation reached the app")
    }

    /// Writes all of `bytes` (small: the socket takes them).
    func write(_ bytes: [UInt8]) { writeAll(bytes, to: socket) }

    mutating func perform(_ events: [SecureChannel.Event]) {
        for e in events {
            switch e {
            case .write(let b): write(b)
            case .needsApproval: perform(channel.approve())
            case .shortAuthenticationString(let d): digits = d
            case .fault(let f): faults.append(f)
            case .frame(let f):
                if case .accept = f { digitsAtAccept = digits }
                frames.append(f)
            case .refused: break
            }
        }
    }

    /// Reads and handles what arrives for up to `seconds`, or until `done` holds.
    mutating func pump(seconds: Double, until done: (HandDrivenCaller) -> Bool = { _ in false }) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        var buffer = [UInt8](repeating: 0, count: 4_096)
        while !done(self) {
            guard Date() < deadline else { return false }
            switch buffer.withUnsafeMutableBytes({ socket.readSome(into: $0) }) {
            case .moved(let n): perform(buffer.prefix(n).withUnsafeBytes { channel.received($0) })
            case .wouldBlock: usleep(2_000)
            case .endOfStream, .failed: return done(self)
            }
        }
        return true
    }
}

/// Writes all of `bytes` to the non-blocking `socket` (small: it takes them), or stops when it fails.
private func writeAll(_ bytes: [UInt8], to socket: FileDescriptor) {
    var rest = bytes[...]
    while !rest.isEmpty {
        switch rest.withUnsafeBytes({ socket.writeSome($0) }) {
        case .moved(let n): rest = rest.dropFirst(n)
        case .wouldBlock: usleep(1_000)
        default: return
        }
    }
}

/// A man in the middle facing an inviter, played by hand over real TCP: it answers each connection as a real
/// responder does (a real `SecureChannel`), so it knows the inviter's digits once message 3 has come; then it
/// declines the invitation, or accepts it without opening its own share first, and hangs up. Either way the inviter
/// never learns the digits, and only sees an invitation that failed.
private struct DigitsWithholder {
    let listener: FileDescriptor
    let peer: PeerID
    let port: UInt16

    init() throws {
        listener = try FileDescriptor.tcpListener(SocketAddress(numericHost: "127.0.0.1", port: 0)!)
        port = try listener.localAddress().port
        peer = try PeerID(displayName: "host")
    }

    /// Answers the next connection, waiting up to `seconds` in all, with DECLINE (or `acceptingWithoutDigits`, an
    /// ACCEPT with no SAS-NONCE before it): when its message 3 came (nil: no handshake finished, or no INVITE
    /// followed).
    func answer(within seconds: Double, acceptingWithoutDigits: Bool = false) -> Date? {
        let deadline = Date().addingTimeInterval(seconds)
        var accepted: FileDescriptor?
        while accepted == nil, Date() < deadline {
            if let (c, _) = try? listener.accept() { accepted = c } else { usleep(1_000) }
        }
        guard let socket = accepted else { return nil }
        defer { socket.close() }
        var channel = SecureChannel(configuration: .init(role: .responder, preference: .required, localPeer: peer))
        var message3: Date?
        var buffer = [UInt8](repeating: 0, count: 4_096)
        while Date() < deadline {
            switch buffer.withUnsafeMutableBytes({ socket.readSome(into: $0) }) {
            case .moved(let n):
                for event in buffer.prefix(n).withUnsafeBytes({ channel.received($0) }) {
                    if message3 == nil, channel.shortAuthenticationString != nil { message3 = Date() }
                    switch event {
                    case .write(let b): writeAll(b, to: socket)
                    case .frame(.invite):
                        let answer = acceptingWithoutDigits ? ControlFrame.accept(udpPort: 9, token: 7)
                            : .decline(.unavailable, "not now")
                        writeAll(channel.send(answer), to: socket)
                        return message3
                    case .fault, .refused: return nil
                    default: break
                    }
                }
            case .wouldBlock: usleep(1_000)
            case .endOfStream, .failed: return nil
            }
        }
        return nil
    }
}

/// A session delegate whose certificate check refuses every key.
private final class RefusesEveryKey: SessionDelegate, Sendable {
    func session(_ session: Session, peer: PeerID, didChange state: SessionState) {}
    func session(_ session: Session, didReceiveCertificate certificate: PeerCertificate, fromPeer peer: PeerID,
                 certificateHandler: @escaping @Sendable (Bool) -> Void) { certificateHandler(false) }
}

/// Holds every invitation it is handed, unanswered, and notes when one is withdrawn.
private final class HeldInvitations: NearbyServiceAdvertiserDelegate, Sendable {
    let invitations = Mutex<[Invitation]>([])
    let withdrawn = Atomic<Int>(0)
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceiveInvitationFromPeer peer: PeerID, withContext context: Data?,
                    invitationHandler: @escaping @Sendable (Bool, Session?) -> Void) {}
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceive invitation: Invitation) {
        invitations.withLock { $0.append(invitation) }
        invitation.onWithdrawn { self.withdrawn.add(1, ordering: .relaxed) }
    }
}

/// An app that shows every invitation to a person the moment it comes (so reveals its digits at once) and holds it.
private final class ShowsEveryInvitationAtOnce: NearbyServiceAdvertiserDelegate, Sendable {
    let invitations = Mutex<[Invitation]>([])
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceiveInvitationFromPeer peer: PeerID, withContext context: Data?,
                    invitationHandler: @escaping @Sendable (Bool, Session?) -> Void) {}
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceive invitation: Invitation) {
        invitations.withLock { $0.append(invitation) }
        invitation.revealShortAuthenticationString()
    }
}

/// `count` guest sessions on 127.0.0.1, named `prefix`0, `prefix`1…, each inviting itself to `endpoint`.
private func guests(_ prefix: String, _ count: Int, to endpoint: PeerEndpoint, timeout: Duration) throws -> [Session] {
    try (0..<count).map { i in
        let g = try Session(peer: try PeerID(displayName: "\(prefix)\(i)"), configuration: .init(bindHost: "127.0.0.1"))
        try g.connect(to: endpoint, timeout: timeout)
        return g
    }
}

/// Attacks on a session over real sockets on 127.0.0.1, each asserting what the attacker got: nothing.
@Suite("Attacks on encrypted sessions (real sockets)", .serialized)
struct AttackTests {
    @Test("Captured datagrams replayed, forged far-future and spoofed pings: dropped, counted, stream unharmed")
    func replayedForgedAndSpoofedDatagrams() throws {
        let pair = try Pair()
        let capture = try LoopbackCapture(ports: [pair.host.udpPort])
        defer { capture.stop() }
        for i in 0..<5 { try pair.guest.send(Data("frame \(i)".utf8), toPeers: [pair.hostPeer], with: .unreliable) }
        #expect(pair.hostLog.wait(3) { $0.datagrams.count == 5 })
        #expect(eventually(3) { capture.datagrams.filter { $0.payload.count > DatagramHeader.size && $0.payload[3] == 1 }.count >= 5 })
        let real = capture.datagrams.filter { $0.payload[3] == 1 }.prefix(5).map(\.payload)
        // Nothing of the app's data is visible on the wire.
        for d in real { #expect(!String(decoding: d, as: UTF8.self).contains("frame")) }
        let before = pair.host.statistics
        let attacker = try AttackerUDP()

        // 1. Replays, verbatim (they authenticate, but were seen).
        for d in real { attacker.send(d, toPort: pair.host.udpPort) }
        // 2. A far-future sequence number on a real datagram: the tag no longer matches.
        var future = real[0]
        for i in 0..<8 { future[12 + i] = i == 0 ? 0x80 : 0 }
        attacker.send(future, toPort: pair.host.udpPort)
        // 3. A spoofed ping with the host's token, from another port: would latch the host onto the attacker.
        var ping = Array(real[1].prefix(DatagramHeader.size)) + [UInt8](repeating: 0x41, count: 8 + 16)
        ping[3] = 2
        for i in 0..<8 { ping[12 + i] = 0xff }
        attacker.send(ping, toPort: pair.host.udpPort)

        #expect(eventually(3) {
            let s = pair.host.statistics
            return s.duplicateDatagrams - before.duplicateDatagrams == 5 && s.unauthenticDatagrams - before.unauthenticDatagrams == 2
        }, "\(pair.host.statistics)")
        #expect(pair.hostLog.snapshot.datagrams.count == 5, "replays were not delivered again")
        // The stream goes on in both directions, at the real addresses: the window did not jump, nothing latched.
        try pair.guest.send(Data("after".utf8), toPeers: [pair.hostPeer], with: .unreliable)
        try pair.host.send(Data("to the real guest".utf8), toPeers: [pair.guestPeer], with: .unreliable)
        #expect(pair.hostLog.wait(3) { $0.datagrams.count == 6 })
        #expect(pair.guestLog.wait(3) { $0.datagrams.contains { $0.1 == Data("to the real guest".utf8) } })
        #expect(attacker.received(within: 0.3) == 0, "the attacker's port got nothing")
        #expect(pair.host.connectedPeers == [pair.guestPeer])
    }

    @Test("A client that connects without finishing the handshake gets no datagram and never becomes a peer")
    func unauthenticatedClientGetsNothing() throws {
        let pair = try Pair()
        let attacker = try AttackerUDP()
        // A raw TCP client: preamble and half a handshake message, then silence.
        let tcp = try FileDescriptor.tcpConnect(to: SocketAddress(numericHost: "127.0.0.1", port: pair.advertiser.port!)!)
        usleep(50_000)
        let partial = SecureChannel.preamble(1) + [0, 32] + [UInt8](repeating: 7, count: 10)
        _ = partial.withUnsafeBytes { Glibc.send(tcp.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        for i in 0..<100 { try pair.host.send(Data("audio \(i)".utf8), toPeers: [pair.guestPeer], with: .unreliable) }
        #expect(pair.guestLog.wait(3) { $0.datagrams.count >= 99 })
        #expect(attacker.received(within: 0.3) == 0)
        #expect(pair.host.connectedPeers == [pair.guestPeer])
        #expect(pair.hostLog.snapshot.invitations.count == 1, "only the real guest's invitation reached the app")
    }

    @Test("A peer whose key does not match its advertisement is not joined; a rejected certificate is not either")
    func wrongKeyAndRejectedCertificate() throws {
        // The browser found `host` with one key; another process answers at that address with another key.
        let discovery = InProcessDiscovery()
        let realHost = try PeerID(displayName: "kitchen")
        let impostor = try PeerID(displayName: "kitchen")
        let impostorSession = try Session(peer: impostor)
        let impostorLog = MeshEventLog()
        impostorSession.delegate = impostorLog
        let advertiser = try NearbyServiceAdvertiser(peer: impostor, discoveryInfo: nil, serviceType: "pm-wrongkey",
                                                     discovery: discovery, bindHost: "127.0.0.1")
        advertiser.delegate = impostorLog
        impostorLog.acceptInto.withLock { $0 = impostorSession }
        try advertiser.startAdvertisingPeer()
        let guest = try Session(peer: try PeerID(displayName: "guest"))
        let guestLog = MeshEventLog()
        guest.delegate = guestLog
        // The guest invites what it believes is the real host (its advertised key), at the impostor's address.
        try guest.core.invite(expected: realHost, endpoint: PeerEndpoint(host: "127.0.0.1", port: advertiser.port!),
                              context: nil, timeout: .seconds(3))
        #expect(guestLog.wait(3) { !$0.failures.isEmpty })
        #expect(guestLog.snapshot.failures.first?.2.contains("another key") == true, "\(guestLog.snapshot.failures)")
        #expect(guest.connectedPeers.isEmpty && impostorSession.connectedPeers.isEmpty)
        #expect(guest.statistics.peerFaults == 1)

        // A certificate the app rejects: the invitation ends, with that reason.
        final class Rejecting: SessionDelegate, @unchecked Sendable { // fields set once before use
            let log = MeshEventLog()
            func session(_ session: Session, peer: PeerID, didChange state: SessionState) { log.session(session, peer: peer, didChange: state) }
            func session(_ session: Session, invitationTo peer: PeerID?, failedWith reason: DeclineReason, detail: String) {
                log.session(session, invitationTo: peer, failedWith: reason, detail: detail)
            }
            func session(_ session: Session, didReceiveCertificate certificate: PeerCertificate, fromPeer peer: PeerID,
                         certificateHandler: @escaping @Sendable (Bool) -> Void) {
                certificateHandler(false)
            }
        }
        let picky = Rejecting()
        guest.delegate = picky
        try guest.connect(to: PeerEndpoint(host: "127.0.0.1", port: advertiser.port!), timeout: .seconds(3))
        #expect(picky.log.wait(3) { !$0.failures.isEmpty })
        #expect(picky.log.snapshot.failures.first?.2.contains("certificate rejected") == true, "\(picky.log.snapshot.failures)")
        #expect(guest.connectedPeers.isEmpty)
        #expect(impostorSession.connectedPeers.isEmpty)
    }

    @Test("A copied announcement at an impostor's address, and one at a dead port, do not hide the peer: each address is tried until one proves the key")
    func copiedAnnouncementsDoNotHideThePeer() throws {
        // The attacker republishes the host's record (its name and key are public) at addresses of its own, found
        // first: one where nothing listens, one where its own advertiser answers with its own key.
        let discovery = InProcessDiscovery()
        let (host, hostLog, hostAdvertiser) = try acceptingHost("host", as: "pm-copied", on: discovery)
        let impostor = try Session(peer: try PeerID(displayName: "host"), configuration: .init(bindHost: "127.0.0.1"))
        let impostorLog = MeshEventLog()
        impostor.delegate = impostorLog
        let impostorAdvertiser = try advertise(impostor, as: "pm-impostor", answeredBy: impostorLog)
        let dead = try FileDescriptor.tcpListener(SocketAddress(numericHost: "127.0.0.1", port: 0)!)
        let deadPort = try dead.localAddress().port
        dead.close()
        let copies = [PeerEndpoint(host: "127.0.0.1", port: deadPort), PeerEndpoint(host: "127.0.0.1", port: impostorAdvertiser.port!)]
        let (guest, guestLog, browser) = try browsingGuest("guest", for: "pm-copied", on: copiedRecords(of: discovery, at: copies))
        #expect(guestLog.wait(5) { $0.found.contains(host.myPeerID) })
        #expect(browser.foundPeers.first?.endpoints.count == 3, "the copies come first")

        try browser.invitePeer(host.myPeerID, to: guest, withContext: nil, timeout: .seconds(5))
        #expect(guestLog.wait(10) { s in s.states.contains { $0 == (host.myPeerID, .connected) } }, "\(guestLog.snapshot.failures)")
        #expect(guestLog.states(of: host.myPeerID) == [.connecting, .connected], "connecting once, over all three addresses")
        #expect(guestLog.snapshot.failures.isEmpty, "the addresses that failed are not reported: the peer was reached")
        #expect(guest.statistics.peerFaults == 1, "the impostor's key, counted")
        #expect(hostLog.wait(5) { s in s.states.contains { $0 == (guest.myPeerID, .connected) } })
        #expect(impostor.connectedPeers.isEmpty && impostorLog.snapshot.invitations.isEmpty, "the impostor heard no invitation")

        // Only copies: every address is tried, and the last one's failure is what the app hears, once.
        let (alone, aloneLog, fooled) = try browsingGuest("alone", for: "pm-copied", on: copiedRecords(of: discovery, at: copies, only: true))
        #expect(aloneLog.wait(5) { $0.found.contains(host.myPeerID) })
        try fooled.invitePeer(host.myPeerID, to: alone, withContext: nil, timeout: .seconds(5))
        #expect(aloneLog.wait(10) { !$0.failures.isEmpty })
        #expect(aloneLog.snapshot.failures.count == 1)
        #expect(aloneLog.snapshot.failures.first?.2.contains("another key") == true, "\(aloneLog.snapshot.failures)")
        #expect(aloneLog.states(of: host.myPeerID) == [.connecting, .notConnected])
        #expect(alone.connectedPeers.isEmpty && alone.statistics.peerFaults == 1)
        withExtendedLifetime((hostAdvertiser, impostorAdvertiser, browser, fooled)) {}
    }

    @Test("A copy at an address that takes the connection and says nothing costs its share of the invitation's timeout, and the whole invitation stays within it")
    func aSilentCopyCostsItsShare() throws {
        let discovery = InProcessDiscovery()
        let (host, hostLog, hostAdvertiser) = try acceptingHost("host", as: "pm-silent", on: discovery)
        // The kernel completes the connection (the listener's backlog); nobody ever reads or writes on it.
        let silent = try FileDescriptor.tcpListener(SocketAddress(numericHost: "127.0.0.1", port: 0)!)
        defer { silent.close() }
        let copies = [PeerEndpoint(host: "127.0.0.1", port: try silent.localAddress().port)]
        let (guest, guestLog, browser) = try browsingGuest("guest", for: "pm-silent", on: copiedRecords(of: discovery, at: copies))
        #expect(guestLog.wait(5) { $0.found.contains(host.myPeerID) })
        let started = Date()
        try browser.invitePeer(host.myPeerID, to: guest, withContext: nil, timeout: .seconds(4))
        #expect(guestLog.wait(6) { s in s.states.contains { $0 == (host.myPeerID, .connected) } }, "\(guestLog.snapshot.failures)")
        let took = Date().timeIntervalSince(started)
        #expect(took >= 1.8 && took < 4, "half of the 4 s went to the silent address: \(took) s")
        #expect(guestLog.states(of: host.myPeerID) == [.connecting, .connected])
        #expect(guestLog.snapshot.failures.isEmpty)
        withExtendedLifetime((hostLog, hostAdvertiser, browser)) {}  // the log answers the host's invitations
    }

    @Test("A guest that hangs up while the host judges its key, after the advertiser is gone: no peer, and the host carries on")
    func hangUpWhileTheKeyIsJudged() throws {
        let (host, judge) = try judgedHost()
        let invitations = MeshEventLog()
        var advertiser: NearbyServiceAdvertiser? = try advertise(host, as: "pm-judge", answeredBy: invitations)
        var guest: Session? = try Session(peer: try PeerID(displayName: "guest"), configuration: .init(bindHost: "127.0.0.1"))
        try guest!.connect(to: PeerEndpoint(host: "127.0.0.1", port: advertiser!.port!), timeout: .seconds(5))
        #expect(eventually(5) { judge.held.withLock { $0.count } == 1 })
        // The advertiser goes away while the host still judges; then the guest hangs up.
        advertiser = nil
        guest?.disconnect()
        guest = nil
        usleep(300_000)
        for answer in judge.held.withLock({ $0 }) { answer(true) }
        usleep(300_000)
        #expect(host.connectedPeers.isEmpty)
        #expect(!judge.log.snapshot.states.contains { $0.1 == .connected })

        // The host is unharmed: a new advertiser, a new guest, joined.
        judge.approveNew.store(true, ordering: .releasing)
        let again = try advertise(host, as: "pm-judge2", answeredBy: invitations)
        let second = try Session(peer: try PeerID(displayName: "second"), configuration: .init(bindHost: "127.0.0.1"))
        try second.connect(to: PeerEndpoint(host: "127.0.0.1", port: again.port!), timeout: .seconds(5))
        #expect(eventually(5) { host.connectedPeers.map(\.displayName) == ["second"] })
        #expect(guest == nil && advertiser == nil)
    }

    @Test("A host that shuts down while it judges a guest's key closes that connection: the guest learns at once, not at its timeout")
    func shutdownWhileTheKeyIsJudged() throws {
        var host: Session?
        let judge: Judge
        do {  // no other reference to the host outlives this block: `host = nil` below ends it
            let (h, j) = try judgedHost()
            host = h
            judge = j
        }
        let invitations = MeshEventLog()
        let advertiser = try advertise(host!, as: "pm-judge3", answeredBy: invitations)
        let guest = try Session(peer: try PeerID(displayName: "guest"), configuration: .init(bindHost: "127.0.0.1"))
        let guestLog = MeshEventLog()
        guest.delegate = guestLog
        try guest.connect(to: PeerEndpoint(host: "127.0.0.1", port: advertiser.port!), timeout: .seconds(20))
        #expect(eventually(5) { judge.held.withLock { $0.count } == 1 })
        invitations.acceptInto.withLock { $0 = nil }
        host = nil
        #expect(guestLog.wait(3) { !$0.failures.isEmpty }, "the guest's invitation ends when the host goes, long before 20 s")
        #expect(guest.connectedPeers.isEmpty)
        for answer in judge.held.withLock({ $0 }) { answer(true) }
        usleep(100_000)
        #expect(guest.connectedPeers.isEmpty)
    }

    @Test("An app that never answers the certificate check holds no guest's place past the invitation's timeout")
    func unansweredCertificateChecksExpire() throws {
        let (host, judge) = try judgedHost()
        let invitations = MeshEventLog()
        let advertiser = try advertise(host, as: "pm-judge4", answeredBy: invitations)
        let endpoint = PeerEndpoint(host: "127.0.0.1", port: advertiser.port!)
        // As many guests from one address as a host takes (maximumPeersPerHost, 4), each judged and never answered.
        let waiting = try guests("unanswered", 4, to: endpoint, timeout: .seconds(1))
        #expect(eventually(5) { judge.held.withLock { $0.count } == 4 })
        // Their places come free once the 1 s invitations are over: a fifth guest from the same address, whose key
        // the app now accepts, joins (it is declined, "too many peers", while they are still held).
        judge.approveNew.store(true, ordering: .releasing)
        let next = try Session(peer: try PeerID(displayName: "next"), configuration: .init(bindHost: "127.0.0.1"))
        let nextLog = MeshEventLog()
        next.delegate = nextLog
        let joined = eventually(10) {
            guard (try? next.connect(to: endpoint, timeout: .seconds(2))) != nil else { return false }
            return nextLog.wait(3) { s in s.states.contains { $0.1 == .connected } || s.failures.count > 0 }
                && next.connectedPeers.count == 1
        }
        #expect(joined, "\(nextLog.snapshot.failures)")
        #expect(host.connectedPeers.map(\.displayName) == ["next"])
        // A late answer changes nothing.
        for answer in judge.held.withLock({ $0 }) { answer(true) }
        usleep(200_000)
        #expect(host.connectedPeers.map(\.displayName) == ["next"])
        withExtendedLifetime(waiting) {}
    }

    @Test("A searcher for matching digits (get message 2, hang up, again) is refused after its burst; another address still joins")
    func digitSearchIsRationed() throws {
        let (host, log, advertiser) = try hostToSearch(as: "pm-search")
        let answered = searchTwenty(advertiser) { abandonedHandshake(port: advertiser.port!, preamble: SecureChannel.preamble(1)) }
        #expect(eventually(2) { advertiser.statistics.unadmittedHandshakes == UInt64(answered) }, "\(advertiser.statistics)")
        #expect(log.snapshot.invitations.isEmpty, "no try reached the app")
        // A real peer from another address is not held to the searcher's ration.
        let real = try Session(peer: try PeerID(displayName: "real"), configuration: .init(bindHost: "127.0.0.2"))
        let realLog = MeshEventLog()
        real.delegate = realLog
        try real.connect(to: PeerEndpoint(host: "127.0.0.1", port: advertiser.port!), timeout: .seconds(5))
        #expect(realLog.wait(5) { s in s.states.contains { $0.1 == .connected } }, "\(realLog.snapshot.failures)")
        #expect(host.connectedPeers.map(\.displayName) == ["real"])
        #expect(advertiser.statistics.unadmittedHandshakes == UInt64(answered), "a real peer's handshake is finished")
        withExtendedLifetime(advertiser) {}
    }

    @Test("Relayed searchers are rationed by the identity their member names: one is refused after its burst, another relayed caller and a direct one still get answers")
    func relayedDigitSearchIsRationedPerNamedIdentity() throws {
        let (host, log, advertiser) = try hostToSearch(as: "pm-relsearch")
        /// One try through a relay pipe a member splices for `caller`: the advertiser takes the pipe's end.
        func relayedTry(as caller: PeerID) throws -> Bool {
            let (ours, theirs) = try FileDescriptor.streamPair()
            #expect(advertiser.admitRelayed(ours, from: caller))
            return abandonedHandshake(over: theirs, preamble: SecureChannel.preamble(1))
        }
        let searcher = try PeerIdentity.generate(displayName: "searcher").peerID
        _ = try searchTwenty(advertiser) { try relayedTry(as: searcher) }
        // Another relayed caller (another named identity, through the same member or not) has tries of its own, and
        // so has a direct caller; the searcher's are still spent.
        let other = try PeerIdentity.generate(displayName: "other").peerID
        #expect(try relayedTry(as: other), "another relayed caller is answered")
        #expect(abandonedHandshake(port: advertiser.port!, preamble: SecureChannel.preamble(1)), "a direct caller is answered")
        #expect(try !relayedTry(as: searcher), "the searcher is still refused")
        #expect(log.snapshot.invitations.isEmpty, "no try reached the app")
        withExtendedLifetime((host, advertiser)) {}
    }

    @Test("A man in the middle learns the advertiser's digits only once its app shows them to a person: not from the handshake, not from inviting")
    func advertisersDigitsCostAnInvitationShownToAPerson() throws {
        let host = try PeerID(displayName: "host")
        let held = HeldInvitations()
        let advertiser = try advertiser(for: host, as: "pm-sasnonce", delegate: held)
        var caller = try HandDrivenCaller(port: advertiser.port!, as: try PeerID(displayName: "mallory"))
        // The whole handshake, message 3 included: what version 3 gave the digits away after (at message 2).
        #expect(caller.pump(seconds: 5) { $0.channel.isEncrypted }, "\(caller.faults)")
        _ = caller.pump(seconds: 0.5)
        #expect(caller.digits == nil && caller.channel.shortAuthenticationString == nil,
                "a finished handshake tells the caller nothing of the advertiser's digits")
        // Inviting hands the app the invitation, which it holds unshown (a prompt queued behind another): still nothing.
        caller.write(caller.channel.send(handInvite))
        #expect(eventually(3) { held.invitations.withLock { $0.count } == 1 })
        _ = caller.pump(seconds: 0.5)
        #expect(caller.digits == nil, "an invitation the app has not shown gives nothing away")
        // The app shows them: now the caller has them, and they are the app's.
        let first = try #require(held.invitations.withLock { $0.first })
        first.revealShortAuthenticationString()
        #expect(caller.pump(seconds: 5) { $0.digits != nil }, "\(caller.faults)")
        #expect(first.certificate?.shortAuthenticationString == caller.digits, "the app's screen and the caller's digits agree")
        #expect(caller.faults.isEmpty)
        // A searcher whose digits do not match hangs up: the app sees the invitation withdrawn, and the try counted.
        caller.socket.close()
        #expect(eventually(3) { held.withdrawn.load(ordering: .relaxed) == 1 })
        #expect(eventually(2) { advertiser.statistics.unadmittedHandshakes == 1 }, "\(advertiser.statistics)")

        // An invitation declined unshown gives nothing away either; a reveal after the answer does nothing.
        var declined = try HandDrivenCaller(inviting: advertiser, as: "mallory2") { held.invitations.withLock { $0.count } == 2 }
        let second = try #require(held.invitations.withLock { $0.last })
        second.decline()
        second.revealShortAuthenticationString()
        #expect(declined.pump(seconds: 3) { $0.frames.contains { if case .decline = $0 { true } else { false } } },
                "\(declined.frames)")
        #expect(declined.digits == nil, "declined unshown: no digits")
        declined.socket.close()

        // Accepted unshown into a session that turns the caller away (its certificate check says no): nothing.
        let refusing = try Session(peer: host, configuration: .init(bindHost: "127.0.0.1"))
        let refuser = RefusesEveryKey()
        refusing.delegate = refuser
        var turnedAway = try HandDrivenCaller(inviting: advertiser, as: "mallory3") { held.invitations.withLock { $0.count } == 3 }
        held.invitations.withLock { $0[2] }.accept(into: refusing)
        #expect(turnedAway.pump(seconds: 3) { $0.frames.contains { if case .decline = $0 { true } else { false } } },
                "\(turnedAway.frames)")
        #expect(turnedAway.digits == nil, "turned away by the session: no digits")
        turnedAway.socket.close()

        // Accepted unshown and let in: the digits come, before ACCEPT.
        let welcoming = try Session(peer: host, configuration: .init(maximumPeers: 2, peerTimeout: .seconds(30), bindHost: "127.0.0.1"))
        var admitted = try HandDrivenCaller(inviting: advertiser, as: "guest") { held.invitations.withLock { $0.count } == 4 }
        let fourth = held.invitations.withLock { $0[3] }
        fourth.accept(into: welcoming)
        #expect(admitted.pump(seconds: 3) { $0.frames.contains { if case .accept = $0 { true } else { false } } },
                "\(admitted.frames)")
        #expect(admitted.digitsAtAccept != nil && admitted.digitsAtAccept == fourth.certificate?.shortAuthenticationString)

        // Accepted unshown into that session, now full: turned away at its peer limit, with no digits.
        var overLimit = try HandDrivenCaller(inviting: advertiser, as: "mallory5") { held.invitations.withLock { $0.count } == 5 }
        held.invitations.withLock { $0[4] }.accept(into: welcoming)
        #expect(overLimit.pump(seconds: 3) { $0.frames.contains { $0 == .decline(.peerLimit, DeclineReason.peerLimit.description) } },
                "the session's own limit (not the per-address one): \(overLimit.frames)")
        #expect(overLimit.digits == nil, "turned away at the peer limit: no digits")
        overLimit.socket.close()
        admitted.socket.close()
        advertiser.stopAdvertisingPeer()
        withExtendedLifetime((refusing, welcoming)) {}
    }

    @Test("Against an app that shows every invitation at once, a man in the middle learns one set of the advertiser's digits a second, however fast it hangs up")
    func advertisersDigitsOpenOneASecond() throws {
        let app = ShowsEveryInvitationAtOnce()
        let advertiser = try advertiser(for: try PeerID(displayName: "host"), as: "pm-sas-pace", delegate: app)
        defer { advertiser.stopAdvertisingPeer() }
        // One searcher after another, each hanging up the moment it has the digits.
        var openedAt: [Date] = []
        for n in 1...4 {
            var c = try HandDrivenCaller(inviting: advertiser, as: "mallory\(n)") { app.invitations.withLock { $0.count } == n }
            #expect(c.pump(seconds: 5) { $0.digits != nil }, "try \(n): \(c.faults)")
            openedAt.append(Date())
            #expect(c.digits == app.invitations.withLock { $0[n - 1] }.certificate?.shortAuthenticationString)
            c.socket.close()
        }
        let gaps = zip(openedAt.dropFirst(), openedAt).map { $0.timeIntervalSince($1) }
        print("digits opened to one searcher after another, gaps \(gaps.map { String(format: "%.3f", $0) }) s")
        // Measured here after polling: one gap may look short when the one before it was noticed late; the span may not.
        #expect(openedAt.last!.timeIntervalSince(openedAt.first!) >= 2.5, "one set of digits a second: \(gaps)")
        #expect(eventually(3) { advertiser.statistics.unadmittedHandshakes == 4 }, "\(advertiser.statistics)")
    }

    @Test("Three invitations shown at once: the first caller has the digits at once, the third a turn later, since the second hung up while it waited its turn and learned nothing")
    func aCallerThatLeavesGivesItsTurnUp() throws {
        let held = HeldInvitations()
        let advertiser = try advertiser(for: try PeerID(displayName: "host"), as: "pm-sas-turns", delegate: held)
        defer { advertiser.stopAdvertisingPeer() }
        var callers: [HandDrivenCaller] = []
        for n in 1...3 {
            callers.append(try HandDrivenCaller(inviting: advertiser, as: "mallory\(n)") { held.invitations.withLock { $0.count } == n })
        }
        // The app shows all three at once.
        let shownAt = Date()
        let invitations = held.invitations.withLock { $0 }
        for i in invitations { i.revealShortAuthenticationString() }
        #expect(callers[0].pump(seconds: 5) { $0.digits != nil }, "\(callers[0].faults)")
        _ = callers[1].pump(seconds: 0.1)
        #expect(callers[1].digits == nil, "its turn has not come")
        callers[1].socket.close()
        #expect(callers[2].pump(seconds: 5) { $0.digits != nil }, "\(callers[2].faults)")
        let wait = Date().timeIntervalSince(shownAt)
        // Its turn comes a second after the first's; had the second kept its place, two.
        #expect(wait >= 0.95 && wait < 1.9, "\(wait) s")
        for (c, i) in [(callers[0], invitations[0]), (callers[2], invitations[2])] {
            #expect(c.digits == i.certificate?.shortAuthenticationString)
            #expect(c.faults.isEmpty)
            c.socket.close()
        }
    }

    @Test("Callers a full session turns away keep their try: one address that keeps getting turned away is soon refused at once")
    func turnedAwayAtThePeerLimitStaysCharged() throws {
        let host = try Session(peer: try PeerID(displayName: "host"),
                               configuration: .init(maximumPeers: 2, peerTimeout: .seconds(60), bindHost: "127.0.0.1"))
        let log = MeshEventLog()
        let advertiser = try advertise(host, as: "pm-full", answeredBy: log)
        defer { advertiser.stopAdvertisingPeer() }
        let endpoint = PeerEndpoint(host: "127.0.0.1", port: advertiser.port!)
        let member = try guests("member", 1, to: endpoint, timeout: .seconds(5))
        #expect(eventually(5) { host.connectedPeers.count == 1 })
        // 16 tries at once, then one a second: each caller here is accepted by the app and turned away by the session.
        var turnedAway = 0
        while turnedAway < 40 {
            var c = try HandDrivenCaller(port: advertiser.port!, as: try PeerID(displayName: "caller\(turnedAway)"))
            defer { c.socket.close() }
            guard c.pump(seconds: 5, until: { $0.channel.isEncrypted }) else { break }  // refused at accept
            c.write(c.channel.send(handInvite))
            #expect(c.pump(seconds: 3) { $0.frames.contains { $0 == .decline(.peerLimit, DeclineReason.peerLimit.description) } },
                    "\(c.frames)")
            #expect(c.digits == nil)
            turnedAway += 1
        }
        print("turned away at the peer limit \(turnedAway) times before the address was refused")
        #expect(turnedAway >= 16 && turnedAway < 40, "the ration refuses it after its burst")
        #expect(advertiser.statistics.rationedConnections >= 1)
        #expect(host.connectedPeers.count == 1)
        withExtendedLifetime(member) {}
    }

    @Test("An inviter that re-invites after every failure gives a man in the middle that withholds its share (declining, or accepting without it) one silent guess a second after the burst; a real host is still joined")
    func anInviterOpensItsShareUnansweredAtMostOneASecond() throws {
        let (inviter, log) = try rationedInviter(burst: 3)
        let (host, hostLog, advertiser) = try acceptingHost("host", as: "pm-withheld")
        let m = try DigitsWithholder()
        // Every other round M accepts without opening its share: the inviter refuses that as a fault, so M cannot
        // have its guess forgiven by letting the link come up.
        let rounds = 6
        var message3: [Date] = []
        for i in 0..<rounds {
            try inviter.connect(to: PeerEndpoint(host: "127.0.0.1", port: m.port), timeout: .seconds(10))
            let at = m.answer(within: 5, acceptingWithoutDigits: i % 2 == 1)
            #expect(at != nil, "round \(i): the handshake finished and an INVITE came")
            if let at { message3.append(at) }
            #expect(log.wait(5) { $0.failures.count == i + 1 }, "round \(i): the app heard its invitation failed")
        }
        try #require(message3.count == rounds)
        // Three went at network speed; then one a second, counted from the first: the app re-invited at once each
        // time, so without the ration all six would come within a fraction of a second.
        let sinceFirst = message3.map { $0.timeIntervalSince(message3[0]) }
        #expect(sinceFirst[2] < 0.8, "\(sinceFirst)")
        for (k, i) in (3..<rounds).enumerated() { #expect(sinceFirst[i] >= Double(k + 1) - 0.2, "\(sinceFirst)") }
        #expect(sinceFirst[rounds - 1] < 8, "\(sinceFirst)")
        #expect(inviter.statistics.pacedInvitations == 3)
        #expect(inviter.statistics.peerFaults == 3, "each ACCEPT without the digits")
        let snapshot = log.snapshot
        #expect(snapshot.digits.isEmpty, "the man in the middle never opened its share")
        #expect(!snapshot.states.contains { $0.1 == .connected }, "never connected without the digits")
        for (i, failure) in snapshot.failures.enumerated() {
            let expected = i % 2 == 1 ? "the peer sent ACCEPT before SAS-NONCE out of turn" : "not now"
            #expect(failure.2 == expected, "round \(i)")
        }
        // The real host is still joined: its handshake waits its turn (up to a second), then goes through, and its
        // session opens its share as it lets the inviter in.
        try inviter.connect(to: PeerEndpoint(host: "127.0.0.1", port: advertiser.port!), timeout: .seconds(10))
        #expect(log.wait(5) { s in s.states.contains { $0.1 == .connected } }, "\(log.snapshot.failures.last.map { $0.2 } ?? "")")
        // It waited a turn unless the machine stalled for a second between round 6 and this invitation.
        #expect((3...4).contains(inviter.statistics.pacedInvitations))
        #expect(log.snapshot.digits.count == 1)
        withExtendedLifetime((host, hostLog, advertiser)) {}
    }

    @Test("Connection data pins the key, so the digits decide nothing: its invitation does not wait when the ration is used up")
    func connectionDataIsNotRationed() throws {
        let (inviter, log) = try rationedInviter(burst: 1)
        let m = try DigitsWithholder()
        try inviter.connect(to: PeerEndpoint(host: "127.0.0.1", port: m.port), timeout: .seconds(10))
        #expect(m.answer(within: 5) != nil)
        #expect(log.wait(5) { $0.failures.count == 1 }, "the ration of one is used up for the next second")
        let host = try Session(peer: try PeerID(displayName: "host"), configuration: .init(bindHost: "127.0.0.1"))
        let data = try host.nearbyConnectionData(forPeer: inviter.myPeerID)
        try inviter.connectPeer(host.myPeerID, withNearbyConnectionData: data)
        #expect(log.wait(5) { s in s.states.contains { $0.0 == host.myPeerID && $0.1 == .connected } })
        #expect(inviter.statistics.pacedInvitations == 0)
    }

    @Test("Two invitations to one host wait for their turn: when the first connects, the second ends as already connected without finishing its handshake (the host's app is asked once)")
    func aWaitingInvitationToAPeerThatConnectedMeanwhileEndsUnfinished() throws {
        let (inviter, log) = try rationedInviter(burst: 1)
        let (host, hostLog, advertiser) = try acceptingHost("host", as: "pm-superseded")
        let m = try DigitsWithholder()
        try inviter.connect(to: PeerEndpoint(host: "127.0.0.1", port: m.port), timeout: .seconds(10))
        #expect(m.answer(within: 5) != nil)
        #expect(log.wait(5) { $0.failures.count == 1 }, "the ration of one is used up for the next second")
        let endpoint = PeerEndpoint(host: "127.0.0.1", port: advertiser.port!)
        try inviter.connect(to: endpoint, timeout: .seconds(10))
        try inviter.connect(to: endpoint, timeout: .seconds(10))
        #expect(log.wait(5) { s in s.states.contains { $0.0 == host.myPeerID && $0.1 == .connected } })
        #expect(log.wait(5) { $0.failures.count == 2 }, "\(log.snapshot.failures)")
        let second = log.snapshot.failures.last
        #expect(second?.0 == host.myPeerID && second?.1 == .alreadyConnected, "\(String(describing: second))")
        #expect(second?.2.hasSuffix("(this invitation's handshake was not finished)") == true, "\(String(describing: second))")
        // Both wait for the turn after the man in the middle's, unless the machine stalled for a second before the
        // first was approved (then it opens at once and the second ends when it connects, or at its own approval).
        #expect((1...2).contains(inviter.statistics.pacedInvitations))
        // The second never opened its share: the host's app was asked once, and the session was told one set of digits.
        #expect(hostLog.snapshot.invitations.count == 1, "\(hostLog.snapshot.invitations.map(\.0))")
        #expect(log.snapshot.digits.count == 1)
        #expect(inviter.connectedPeers == [host.myPeerID])
        withExtendedLifetime((host, advertiser)) {}
    }

    @Test("An invitation whose app approves the peer only after it connected through another invitation ends as already connected, unfinished")
    func anInvitationApprovedAfterItsPeerConnectedEndsUnfinished() throws {
        let inviter = try Session(peer: try PeerID(displayName: "inviter"), configuration: .init(bindHost: "127.0.0.1"))
        let judge = Judge()
        inviter.delegate = judge
        let (host, hostLog, advertiser) = try acceptingHost("host", as: "pm-late-ok")
        let endpoint = PeerEndpoint(host: "127.0.0.1", port: advertiser.port!)
        try inviter.connect(to: endpoint, timeout: .seconds(10))
        try inviter.connect(to: endpoint, timeout: .seconds(10))
        #expect(eventually(5) { judge.held.withLock { $0.count } == 2 }, "both handshakes wait for the app's approval")
        let approve = judge.held.withLock { $0 }
        guard approve.count == 2 else { return }
        approve[0](true)
        #expect(judge.log.wait(5) { s in s.states.contains { $0.0 == host.myPeerID && $0.1 == .connected } })
        approve[1](true)
        #expect(judge.log.wait(5) { $0.failures.count == 1 }, "\(judge.log.snapshot.failures)")
        let failure = judge.log.snapshot.failures.first
        #expect(failure?.1 == .alreadyConnected, "\(String(describing: failure))")
        #expect(failure?.2.hasSuffix("(this invitation's handshake was not finished)") == true, "\(String(describing: failure))")
        #expect(hostLog.snapshot.invitations.count == 1, "the host's app was asked once")
        #expect(inviter.connectedPeers == [host.myPeerID])
        withExtendedLifetime((host, advertiser)) {}
    }

    @Test("An accepted invitation is forgiven: with a ration of one, a session joins one host after another without waiting")
    func acceptedInvitationsAreForgiven() throws {
        let (inviter, log) = try rationedInviter(burst: 1)
        let hosts = try (0..<3).map { i in try acceptingHost("host\(i)", as: "pm-forgiven\(i)") }
        for (i, (host, _, advertiser)) in hosts.enumerated() {
            try inviter.connect(to: PeerEndpoint(host: "127.0.0.1", port: advertiser.port!), timeout: .seconds(5))
            #expect(log.wait(5) { s in s.states.contains { $0.0 == host.myPeerID && $0.1 == .connected } }, "host \(i)")
        }
        #expect(inviter.connectedPeers.count == 3)
        #expect(inviter.statistics.pacedInvitations == 0)
        #expect(log.snapshot.digits.count == 3)
        withExtendedLifetime(hosts) {}
    }

    @Test("Twenty real peers from one address, one after another, are all let in: a try the session admits is forgiven")
    func admittedTriesAreForgiven() throws {
        let host = try Session(peer: try PeerID(displayName: "host"),
                               configuration: .init(maximumPeers: 24, bindHost: "127.0.0.1", maximumPeersPerHost: 24))
        let log = MeshEventLog()
        host.delegate = log
        let advertiser = try advertise(host, as: "pm-admitted", answeredBy: log)
        var guests: [Session] = []
        for i in 0..<20 {
            let g = try Session(peer: try PeerID(displayName: "guest\(i)"), configuration: .init(bindHost: "127.0.0.1"))
            let gl = MeshEventLog()
            g.delegate = gl
            try g.connect(to: PeerEndpoint(host: "127.0.0.1", port: advertiser.port!), timeout: .seconds(5))
            #expect(gl.wait(5) { s in s.states.contains { $0.1 == .connected } }, "guest \(i): \(gl.snapshot.failures)")
            guests.append(g)
        }
        #expect(host.connectedPeers.count == 20)
        #expect(advertiser.statistics == AdvertiserStatistics(), "nothing refused, nothing left unadmitted")
        withExtendedLifetime((guests, advertiser)) {}
    }

    @Test("40 peers from one address cannot fill the slots; a peer from another address still joins")
    func onePlaceCannotFillTheSlots() throws {
        let host = try Session(peer: try PeerID(displayName: "host"), configuration: .init(maximumPeers: 33, bindHost: "127.0.0.1"))
        let log = MeshEventLog()
        host.delegate = log
        let advertiser = try advertise(host, as: "pm-flood", answeredBy: log)
        let endpoint = PeerEndpoint(host: "127.0.0.1", port: advertiser.port!)
        let flood = try guests("fake", 40, to: endpoint, timeout: .seconds(5))
        #expect(eventually(8) { flood.filter { !$0.connectedPeers.isEmpty }.count == 4 && log.snapshot.failures.isEmpty })
        usleep(300_000)
        #expect(flood.filter { !$0.connectedPeers.isEmpty }.count == 4, "at most maximumPeersPerHost from one address")
        let real = try Session(peer: try PeerID(displayName: "real"), configuration: .init(bindHost: "127.0.0.2"))
        let realLog = MeshEventLog()
        real.delegate = realLog
        try real.connect(to: endpoint, timeout: .seconds(5))
        #expect(realLog.wait(5) { s in s.states.contains { $0.1 == .connected } }, "\(realLog.snapshot.failures)")
        #expect(host.connectedPeers.count == 5)
        withExtendedLifetime((flood, advertiser)) {}  // the four admitted guests must outlive the last check
    }
}

/// What a browser sees when an attacker has republished every record of `inner` at `copies` (its own addresses),
/// found before the real ones (or, `only`, instead of them).
private func copiedRecords(of inner: any DiscoveryBackend, at copies: [PeerEndpoint], only: Bool = false) -> FilteredDiscovery {
    FilteredDiscovery(inner) { event, deliver in
        guard case .found(var peer) = event else { return deliver(event) }
        peer.endpoints = copies + (only ? [] : peer.endpoints)
        deliver(.found(peer))
    }
}

/// A session on 127.0.0.1 named `name`, its log, and a started browser for `type` through `discovery` that tells
/// that log what it finds.
private func browsingGuest(_ name: String, for type: String,
                           on discovery: any DiscoveryBackend) throws -> (Session, MeshEventLog, NearbyServiceBrowser) {
    let guest = try Session(peer: try PeerID(displayName: name), configuration: .init(bindHost: "127.0.0.1"))
    let log = MeshEventLog()
    guest.delegate = log
    let browser = try NearbyServiceBrowser(peer: guest.myPeerID, serviceType: type, discovery: discovery)
    browser.delegate = log
    try browser.startBrowsingForPeers()
    return (guest, log, browser)
}
