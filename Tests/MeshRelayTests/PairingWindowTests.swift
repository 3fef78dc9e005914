import Foundation
import Synchronization
import Testing
import MeshPOSIX
import MeshTestSupport
import PeerMesh
@testable import MeshRelay

/// A host's pairing window on 127.0.0.1, with no DNS-SD: a `PairingResponder` behind an advertiser that hands it
/// every invitation, and the lines it says to its operator.
private final class PairingHost: NearbyServiceAdvertiserDelegate, Sendable {
    /// The operator's lines, in order.
    final class Lines: Sendable {
        let lines = Mutex<[String]>([])
        func add(_ line: String) { lines.withLock { $0.append(line) } }
    }
    let responder: PairingResponder
    let advertiser: NearbyServiceAdvertiser
    private let said = Lines()
    var notices: [String] { said.lines.withLock { $0 } }

    init(trust: TrustStore, discovery: any DiscoveryBackend = InProcessDiscovery()) throws {
        let identity = try PeerIdentity.generate(displayName: "host")
        let said = self.said
        responder = try PairingResponder(identity: identity, trust: trust, bindHost: "127.0.0.1",
                                         notices: { said.add($0) }, windowChanged: { _ in })
        advertiser = try NearbyServiceAdvertiser(peer: identity.peerID, discoveryInfo: ["pair": "1"], serviceType: "mesh-audio",
                                                 discovery: discovery, bindHost: "127.0.0.1")
        advertiser.delegate = self
        try advertiser.startAdvertisingPeer()
    }

    func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceive invitation: Invitation) {
        if !responder.take(invitation, closedMessage: "closed") { invitation.decline(.declined, message: "not pairing") }
    }
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceiveInvitationFromPeer peer: PeerID,
                    withContext context: Data?, invitationHandler: @escaping @Sendable (Bool, Session?) -> Void) {
        invitationHandler(false, nil)
    }
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didNotStartAdvertisingPeer error: PeerMeshError) {}
}

/// An attacker's attempt: message 1 for a guessed code, then it checks the host's message 2 offline (tagB tells
/// whether the guess was right) and never sends message 3, staying connected.
private final class OfflineGuesser: SessionDelegate, Sendable {
    let session: Session
    private let initiator = Mutex<Pairing.Initiator?>(nil)
    /// Whether message 2 came, so that a guess could be checked; and any result the host sent instead.
    let checked = Mutex(false)
    let result = Mutex<Pairing.Result?>(nil)

    init(port: UInt16) throws {
        session = try Session(securityIdentity: try PeerIdentity.generate(displayName: "guesser"),
                              configuration: .init(bindHost: "127.0.0.1", maximumMessageSize: 4096, maximumResourceSize: 0, topology: .star))
        session.delegate = self
        try session.connect(to: PeerEndpoint(host: "127.0.0.1", port: port), context: PairingResponder.context, timeout: .seconds(5))
    }

    func session(_ session: Session, peer: PeerID, didChange state: SessionState) {
        guard state == .connected, let binding = session.channelBinding(for: peer) else { return }
        let first = Pairing.Initiator(code: "0000-0000", binding: binding)
        initiator.withLock { $0 = first }
        try? session.send(Data(first.firstMessage), toPeers: [peer], with: .reliable)
    }

    func session(_ session: Session, didReceive data: Data, fromPeer peer: PeerID) {
        let m = Array(data)
        if let r = Pairing.result(m) { return result.withLock { $0 = r } }
        initiator.withLock { i in
            guard var attempt = i else { return }
            do throws(Pairing.Failure) { _ = try attempt.answer(m) } catch { if error == .wrongCode { checked.withLock { $0 = true } } }
            i = attempt
        }
    }

    /// Waits up to 5 s for message 2 or a result.
    func settled() -> Bool {
        for _ in 0..<100 where !checked.withLock({ $0 }) && result.withLock({ $0 }) == nil { usleep(50_000) }
        return checked.withLock { $0 }
    }
}

@Suite("The host's pairing window (real sockets on 127.0.0.1)", .serialized)
struct PairingWindowTests {
    static func scratch() throws -> String {
        let dir = NSTemporaryDirectory() + "pm-window-\(getpid())-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        return dir
    }

    @Test("The host says \"paired\" only once it has stored the player's key; otherwise neither side is paired")
    func pairedOnlyOnceStored() throws {
        let dir = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        // The host's trust store cannot be written (a full or read-only disk): where its directory should be is a file.
        #expect(FileManager.default.createFile(atPath: dir + "/not-a-directory", contents: Data("x".utf8)))
        let hostTrust = TrustStore(path: dir + "/not-a-directory/paired.json")
        let host = try PairingHost(trust: hostTrust)
        host.responder.open(code: "1234-5678", timeout: .seconds(20))
        let player = try PeerIdentity.generate(displayName: "bedroom")
        let playerTrust = TrustStore(path: dir + "/player/paired.json")
        var config = PairingClient.Configuration(identity: player, trust: playerTrust, code: "1234-5678",
                                                 target: .direct(PeerEndpoint(host: "127.0.0.1", port: host.advertiser.port!)))
        config.bindHost = "127.0.0.1"
        config.timeout = .seconds(5)
        let outcome = try PairingClient(configuration: config).run()
        guard case .failed(let why) = outcome else { Issue.record("the player was told: \(outcome)"); return }
        #expect(why == Pairing.Result.notStored.description)
        #expect(try playerTrust.list().isEmpty, "the player stored nothing either")
        #expect(eventually(3) { host.notices.contains { $0.contains("could not be stored") } }, "\(host.notices)")
        #expect(!host.notices.contains { $0.hasPrefix("paired ") }, "the operator is not told it paired")
        withExtendedLifetime(host) {}
    }

    /// Pairs with a real host whose record is found `realAfter` seconds after a decoy's (answering as a `FakePairingHost`
    /// says); returns the outcome, whether the real host was the one paired, how often the decoy was tried, and the
    /// client's lines.
    private static func pairPastDecoy(delay: Double, silent: Bool = false, realAfter: Double) throws
        -> (outcome: PairingClient.Outcome, real: Bool, decoyTries: Int, lines: [String], seconds: Double) {
        let dir = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let discovery = InProcessDiscovery()
        let decoy = try FakePairingHost(silent ? .silent : .wrongProof(after: delay), discovery: discovery)
        let host = try PairingHost(trust: TrustStore(path: dir + "/host.json"), discovery: discovery)
        host.responder.open(code: "1234-5678", timeout: .seconds(30))
        let real = host.advertiser.myPeerID
        let playerTrust = TrustStore(path: dir + "/player/paired.json")
        var config = PairingClient.Configuration(identity: try PeerIdentity.generate(displayName: "bedroom"), trust: playerTrust,
                                                 code: "1234-5678", target: .discover(hostName: "host"))
        // The real host's record found `realAfter` seconds after the decoy's.
        config.discovery = FilteredDiscovery(discovery) { event, deliver in
            guard case .found(let p) = event, p.peer == real else { return deliver(event) }
            DispatchQueue.global().asyncAfter(deadline: .now() + realAfter) { deliver(event) }
        }
        config.bindHost = "127.0.0.1"
        config.timeout = .seconds(15)
        let lines = Mutex<[String]>([])
        let started = Date()
        let outcome = try PairingClient(configuration: config, log: { line in lines.withLock { $0.append(line) } }).run()
        let seconds = Date().timeIntervalSince(started)
        var isReal = false
        if case .paired(let peer, _) = outcome {
            let kept = try playerTrust.list().map(\.publicKey)
            isReal = peer.publicKey == real.publicKey && kept == [real.publicKey!]
        }
        withExtendedLifetime((decoy, host)) {}
        return (outcome, isReal, decoy.tried.load(ordering: .relaxed), lines.withLock { $0 }, seconds)
    }

    @Test("A decoy advertising an open window under the host's name, found first, does not keep the player from the host that shows the code")
    func aDecoyFoundFirstIsPassedOver() throws {
        // The decoy answers wrong at once; the real host's record comes half a second later.
        let r = try Self.pairPastDecoy(delay: 0, realAfter: 0.5)
        #expect(r.real, "paired with the host that showed the code, and only its key kept: \(r.outcome); \(r.lines)")
        #expect(r.decoyTries == 1, "the decoy was tried first, once")
        #expect(r.lines.contains { $0.contains("did not pair (wrong pairing code)") }, "\(r.lines)")
    }

    @Test("A decoy that takes the invitation and then says nothing holds the player for five seconds, not for the whole pairing")
    func aSilentDecoyIsPassedOver() throws {
        let r = try Self.pairPastDecoy(delay: 0, silent: true, realAfter: 0.1)
        #expect(r.real, "\(r.outcome); \(r.lines)")
        #expect(r.decoyTries == 1)
        #expect(r.lines.contains { $0.contains("did not pair (no answer within 5.0 seconds); trying host") }, "\(r.lines)")
        #expect(r.seconds < 12, "\(r.seconds) s")
    }

    @Test("Two decoys and no real host: pairing fails, naming each host tried and why")
    func onlyDecoys() throws {
        let dir = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let discovery = InProcessDiscovery()
        let decoys = [try FakePairingHost(.wrongProof(after: 0.3), discovery: discovery), try FakePairingHost(.wrongProof(after: 0.3), discovery: discovery)]
        var config = PairingClient.Configuration(identity: try PeerIdentity.generate(displayName: "bedroom"),
                                                 trust: TrustStore(path: dir + "/player/paired.json"), code: "1234-5678",
                                                 target: .discover(hostName: nil))
        config.discovery = discovery
        config.bindHost = "127.0.0.1"
        config.timeout = .seconds(10)
        let outcome = try PairingClient(configuration: config).run()
        guard case .failed(let why) = outcome else { Issue.record("\(outcome)"); return }
        #expect(why.hasPrefix("no host proved the code: "), "\(why)")
        for d in decoys {
            #expect(why.contains("host (\(d.session.myPeerID.publicKey!.shortFingerprint)): wrong pairing code"), "\(why)")
            #expect(d.tried.load(ordering: .relaxed) == 1)
        }
    }

    @Test("Guesses checked offline from message 2 count at once: three checks in all, however the guessers come and go")
    func offlineGuessesCountAgainstTheLimit() throws {
        let dir = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let host = try PairingHost(trust: TrustStore(path: dir + "/paired.json"))
        host.responder.open(code: "1234-5678", timeout: .seconds(30), maximumFailures: 3)
        // Two guessers connected at a time (the window's per-address limit), each staying after its check, so that
        // its exchange is still open when the next one comes; the oldest leaves to make room.
        var live: [OfflineGuesser] = []
        var checks = 0, turnedAway = 0
        for _ in 0..<6 {
            guard host.responder.isOpen else { break }
            if live.count == 2 {
                live.removeFirst().session.disconnect()
                usleep(300_000)
            }
            guard host.responder.isOpen else { break }
            let g = try OfflineGuesser(port: host.advertiser.port!)
            live.append(g)
            if g.settled() { checks += 1 } else if g.result.withLock({ $0 }) == .busy { turnedAway += 1 }
        }
        #expect(checks == 3, "no more guesses checked than the window allows wrong codes")
        #expect(turnedAway >= 1, "a guesser that came while the checks in flight held the codes left was turned away")
        for g in live { g.session.disconnect() }
        #expect(eventually(5) { !host.responder.isOpen })
        #expect(host.notices.filter { $0.contains("failed: wrong code") }.count == 3, "\(host.notices)")
        #expect(host.notices.contains("pairing window closed (3 wrong codes)"))
        withExtendedLifetime(host) {}
    }

    @Test("After two wrong codes the right one still pairs: one exchange at a time, and it is not counted as wrong")
    func theRightCodeStillPairsAfterTwoWrongOnes() throws {
        let dir = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let hostTrust = TrustStore(path: dir + "/host/paired.json")
        let host = try PairingHost(trust: hostTrust)
        host.responder.open(code: "1234-5678", timeout: .seconds(30), maximumFailures: 3)
        for _ in 0..<2 {
            let g = try OfflineGuesser(port: host.advertiser.port!)
            #expect(g.settled())
            g.session.disconnect()
        }
        #expect(eventually(5) { host.notices.filter { $0.contains("failed: wrong code") }.count == 2 })
        let player = try PeerIdentity.generate(displayName: "bedroom")
        var config = PairingClient.Configuration(identity: player, trust: TrustStore(path: dir + "/player/paired.json"),
                                                 code: "1234-5678",
                                                 target: .direct(PeerEndpoint(host: "127.0.0.1", port: host.advertiser.port!)))
        config.bindHost = "127.0.0.1"
        config.timeout = .seconds(5)
        guard case .paired = try PairingClient(configuration: config).run() else { Issue.record("not paired: \(host.notices)"); return }
        #expect(try hostTrust.contains(player.publicKey))
        #expect(host.responder.isOpen, "a success is no wrong code")
        withExtendedLifetime(host) {}
    }
}
