import Foundation
import Testing
import MeshPOSIX
import MeshTestSupport
@testable import PeerMesh

@Suite("Full-mesh membership state machine (pure)")
struct MembershipStateMachineTests {
    /// A little world of members: each joins by an invitation to one member, and the machines' actions are
    /// carried out at once (frames delivered, data made, connections made when both sides have room).
    struct World {
        var peers: [PeerID] = []
        var machines: [UInt64: MembershipStateMachine] = [:]
        var links: Set<[UInt64]> = []
        let maximumPeers: Int
        /// Pairs that cannot reach each other directly.
        var unreachable: Set<[UInt64]> = []
        /// Links between an unreachable pair, and the member relaying each (its introducer).
        var relayedVia: [[UInt64]: UInt64] = [:]
        /// Introductions a member did not follow (no room, or its introducer's share spent).
        var notFollowed = 0
        /// MESH_INTRO_REQUESTs sent, by everyone.
        var requests = 0

        init(maximumPeers: Int = 8) { self.maximumPeers = maximumPeers }

        static func pair(_ a: UInt64, _ b: UInt64) -> [UInt64] { a < b ? [a, b] : [b, a] }

        func peer(_ id: UInt64) -> PeerID { peers.first { $0.identity == id }! }

        mutating func add(_ p: PeerID) {
            peers.append(p)
            machines[p.identity] = MembershipStateMachine(me: p, topology: .mesh, maximumPeers: maximumPeers)
        }

        /// A link comes up between `a` and `b`: an invitation, or a connection `introducer`'s introduction made (each
        /// side knows that from how the link was made, as the driver does).
        mutating func link(_ a: PeerID, _ b: PeerID, introducer: PeerID? = nil) {
            let key = Self.pair(a.identity, b.identity)
            guard a != b, !links.contains(key), machines[a.identity] != nil, machines[b.identity] != nil,
                  degree(a) + 1 < maximumPeers, degree(b) + 1 < maximumPeers else { return }
            links.insert(key)
            // Each side's own record of the introducer's membership (taken as it followed or made the data).
            let first = machines[a.identity]!.connected(b, introducedBy: introducer.flatMap { machines[a.identity]!.introduction(by: $0) })
            let second = machines[b.identity]!.connected(a, introducedBy: introducer.flatMap { machines[b.identity]!.introduction(by: $0) })
            run(first, at: a)
            run(second, at: b)
        }

        mutating func leave(_ p: PeerID) {
            machines[p.identity] = nil
            for key in links where key.contains(p.identity) {
                unlink(key)
            }
            // Links it relayed go with it.
            for (key, via) in relayedVia where via == p.identity { unlink(key) }
            peers.removeAll { $0 == p }
        }

        mutating func unlink(_ key: [UInt64]) {
            guard links.remove(key) != nil else { return }
            relayedVia[key] = nil
            for (me, other) in [(key[0], key[1]), (key[1], key[0])] {
                if let o = peers.first(where: { $0.identity == other }) { _ = machines[me]?.disconnected(o) }
            }
        }

        func degree(_ p: PeerID) -> Int { links.filter { $0.contains(p.identity) }.count }

        mutating func run(_ actions: [MembershipStateMachine.Action], at node: PeerID) {
            for a in actions {
                switch a {
                case .send(let to, let frame):
                    if case .introRequest = frame { requests += 1 }
                    guard links.contains(Self.pair(node.identity, to.identity)), machines[to.identity] != nil else { continue }
                    let answer = machines[to.identity]!.received(frame, from: node)
                    run(answer, at: to)
                case .makeData(let newcomer, let introducer):
                    // The data names who made it; the newcomer "connects" by it.
                    let data = withUnsafeBytes(of: node.identity.bigEndian) { Array($0) }
                    let reply = MeshFrame.introData(forIdentity: newcomer.identity, data: data)
                    guard machines[introducer.identity] != nil else { continue }
                    run(machines[introducer.identity]!.received(reply, from: node), at: introducer)
                case .connect(let other, let data, let introducer):
                    #expect(links.contains(Self.pair(node.identity, introducer.identity)), "introduced by a member it is linked to")
                    #expect(data == withUnsafeBytes(of: other.identity.bigEndian) { Array($0) }, "data from the member it names")
                    let key = Self.pair(node.identity, other.identity)
                    if unreachable.contains(key) {
                        // No direct path: through the introducer, which is linked to both (as the driver does).
                        guard links.contains(Self.pair(other.identity, introducer.identity)) else { continue }
                        link(node, other, introducer: introducer)
                        if links.contains(key) { relayedVia[key] = introducer.identity }
                    } else {
                        link(node, other, introducer: introducer)
                    }
                case .fault(let p, let f):
                    Issue.record("\(node) faulted \(p): \(f)")
                case .notFollowed:
                    notFollowed += 1
                }
            }
        }

        /// Every live member's view, checked against the links.
        func checkViews() {
            for p in peers {
                let view = machines[p.identity]!.members
                let linked = Set(peers.filter { links.contains(Self.pair(p.identity, $0.identity)) })
                #expect(view == linked, "\(p.displayName)'s view matches its links")
            }
        }
    }

    @Test func threeJoinOneAndEveryoneEndsUpConnectedToEveryone() throws {
        var w = World()
        let peers = try (0..<4).map { try PeerID(displayName: "p\($0)") }
        peers.forEach { w.add($0) }
        for p in peers.dropFirst() { w.link(p, peers[0]) }
        #expect(w.links.count == 6, "4 members, 6 links")
        #expect(w.notFollowed == 0, "an honest mesh drops no introduction")
        #expect(w.requests == 0 + 1 + 2, "p0 asks about each newcomer those before it; introduced links ask no one")
        w.checkViews()
    }

    @Test func aStarIntroducesNoOne() throws {
        let a = try PeerID(displayName: "a"), b = try PeerID(displayName: "b"), c = try PeerID(displayName: "c")
        var m = MembershipStateMachine(me: a, topology: .star, maximumPeers: 8)
        #expect(m.connected(b, introducedBy: nil).isEmpty && m.connected(c, introducedBy: nil).isEmpty)
        #expect(m.received(.introRequest(peer: c), from: b) == [.send(b, .introData(forIdentity: c.identity, data: []))])
        #expect(m.received(.introduce(peer: c, data: [1]), from: b).isEmpty)
    }

    @Test func aPeerWithoutAKeyIsNeitherIntroducedNorAskedToIntroduce() throws {
        // An `.optional` session: b and c joined encrypted, p in plaintext (its PeerID carries no key).
        let a = try PeerID(displayName: "a"), b = try PeerID(displayName: "b"), c = try PeerID(displayName: "c")
        let p = try PeerID(displayName: "p", identity: 0x1234)
        var m = MembershipStateMachine(me: a, topology: .mesh, maximumPeers: 8)
        #expect(m.connected(b, introducedBy: nil).isEmpty)
        #expect(m.connected(p, introducedBy: nil).isEmpty, "nothing to pin: p is not introduced (a zero key would break b's link)")
        #expect(m.connected(c, introducedBy: nil) == [.send(b, .introRequest(peer: c))], "b is asked about c; p is not")
    }

    @Test func unsolicitedDataIsAFaultAndAFullMemberMakesNone() throws {
        let a = try PeerID(displayName: "a"), b = try PeerID(displayName: "b"), c = try PeerID(displayName: "c")
        var m = MembershipStateMachine(me: a, topology: .mesh, maximumPeers: 3)
        _ = m.connected(b, introducedBy: nil)
        #expect(m.received(.introData(forIdentity: 99, data: [1]), from: b) == [.fault(b, .unexpectedFrame("MESH_INTRO_DATA that was not asked for"))])
        _ = m.connected(c, introducedBy: nil)
        // Full (a, b, c = 3): no data for a fourth, and no connection to one either.
        let d = try PeerID(displayName: "d")
        #expect(m.received(.introRequest(peer: d), from: b) == [.send(b, .introData(forIdentity: d.identity, data: []))])
        #expect(m.received(.introduce(peer: d, data: [1]), from: b) == [.notFollowed(introducer: b)], "no room: counted")
        #expect(m.received(.introRequest(peer: a), from: b) == [.send(b, .introData(forIdentity: a.identity, data: []))], "not about ourselves")
    }

    /// A member's machine (room for 8) connected to two members, `liar` and `honest`.
    static func withALiarAndAnHonestMember() throws -> (MembershipStateMachine, liar: PeerID, honest: PeerID) {
        let liar = try PeerIdentity.generate(displayName: "liar").peerID, honest = try PeerIdentity.generate(displayName: "honest").peerID
        var m = MembershipStateMachine(me: try PeerIdentity.generate(displayName: "a").peerID, topology: .mesh, maximumPeers: 8)
        _ = m.connected(liar, introducedBy: nil)
        _ = m.connected(honest, introducedBy: nil)
        return (m, liar, honest)
    }

    @Test("A member that names newcomers without end: each is answered and nothing of it is kept; a named newcomer that joins by an invitation of its own is introduced to every other member")
    func aMemberThatNamesNewcomersWithoutEnd() throws {
        let (machine, liar, honest) = try Self.withALiarAndAnHonestMember()
        var m = machine
        let expected = try PeerIdentity.generate(displayName: "expected").peerID
        #expect(m.received(.introRequest(peer: expected), from: honest) == [.makeData(for: expected, replyTo: honest)])
        var named: [PeerID] = []
        for i in 0..<200 {
            let newcomer = try PeerIdentity.generate(displayName: "n\(i)").peerID
            named.append(newcomer)
            #expect(m.received(.introRequest(peer: newcomer), from: liar) == [.makeData(for: newcomer, replyTo: liar)])
        }
        // Its data's tickets are the acceptor's to bound (16 live per member); this machine expects no one.
        #expect(m.expectedIntroductions.introduced == 0)
        // The honest member's newcomer joins with the data made for it: not introduced again.
        #expect(m.connected(expected, introducedBy: m.introduction(by: honest)).isEmpty)
        // One the liar named joins by an invitation of its own: introduced to the three others all the same.
        let joined = m.connected(named[7], introducedBy: nil)
        #expect(joined.count == 3 && [honest, liar, expected].allSatisfy { joined.contains(.send($0, .introRequest(peer: named[7]))) },
                "\(joined)")
        // One that comes with data made for the liar's request is the liar's to introduce, while the liar is a member.
        let byLiar = try #require(m.introduction(by: liar))
        #expect(m.connected(named[8], introducedBy: byLiar).isEmpty)
        _ = m.disconnected(liar)
        // Once it has left, one that comes with its data is a plain newcomer: the liar may have introduced it to no one.
        let late = m.connected(named[9], introducedBy: byLiar)
        #expect(late.contains(.send(honest, .introRequest(peer: named[9]))) && late.count == 4, "\(late)")
        // So is one that comes after the liar came back: the data was made for its earlier membership.
        _ = m.connected(liar, introducedBy: nil)
        #expect(m.introduction(by: liar) != byLiar)
        let later = m.connected(named[10], introducedBy: byLiar)
        #expect(later.contains(.send(liar, .introRequest(peer: named[10]))) && later.count == 6, "\(later)")
    }

    @Test("A member that introduces peers without end: we follow 16 of its introductions whose peers have not joined, and forget them when it leaves; another member's are followed")
    func aMemberThatIntroducesPeersWithoutEnd() throws {
        let (machine, liar, honest) = try Self.withALiarAndAnHonestMember()
        var m = machine
        #expect(m.maximumIntroducedPerMember == 16)
        var others: [PeerID] = []
        var followed = 0
        for i in 0..<100 {
            let other = try PeerIdentity.generate(displayName: "o\(i)").peerID
            others.append(other)
            let actions = m.received(.introduce(peer: other, data: [UInt8(i)]), from: liar)
            if actions == [.connect(other, data: [UInt8(i)], introducer: liar)] {
                followed += 1
            } else {
                #expect(actions == [.notFollowed(introducer: liar)])
            }
        }
        #expect(followed == 16, "the first 16, then none")
        #expect(m.received(.introduce(peer: others[0], data: [7, 7]), from: liar) == [.notFollowed(introducer: liar)],
                "nor the same peer again")
        #expect(m.expectedIntroductions.introduced == 16 && m.expectedIntroductions.introducedBy == [liar.identity: 16])
        // The first address of one of them failed: the driver says it is not connected. It is still expected through
        // the introduction (the next address may work), and the link that does connect it carries the introduction.
        #expect(m.disconnected(others[1]).isEmpty)
        #expect(m.expectedIntroductions.introduced == 16)
        // The honest member's introductions are its own: followed.
        let real = try PeerIdentity.generate(displayName: "real").peerID
        #expect(m.received(.introduce(peer: real, data: [1]), from: honest) == [.connect(real, data: [1], introducer: honest)])
        // Two of the liar's peers join: members (introduced, so they introduce no one), and two places free.
        let byLiar = try #require(m.introduction(by: liar))
        #expect(m.connected(others[1], introducedBy: byLiar).isEmpty)
        #expect(m.connected(others[3], introducedBy: byLiar).isEmpty)
        #expect(m.expectedIntroductions.introducedBy[liar.identity] == 14)
        // A peer introduced again (an honest introducer may pass on two answers about one peer) takes a place too.
        #expect(m.received(.introduce(peer: others[0], data: [7, 7]), from: liar) == [.connect(others[0], data: [7, 7], introducer: liar)])
        let next = try PeerIdentity.generate(displayName: "next").peerID
        #expect(m.received(.introduce(peer: next, data: [2]), from: liar) == [.connect(next, data: [2], introducer: liar)])
        #expect(m.received(.introduce(peer: others[60], data: [3]), from: liar) == [.notFollowed(introducer: liar)], "16 again")
        // The liar leaves: what it introduced that has not joined is forgotten; the honest member's is still expected.
        _ = m.disconnected(liar)
        #expect(m.expectedIntroductions.introduced == 1 && m.expectedIntroductions.introducedBy == [honest.identity: 1])
        // A peer the liar introduced that joins after it left is a plain newcomer: introduced to the others.
        #expect(m.connected(others[5], introducedBy: byLiar).contains(.send(honest, .introRequest(peer: others[5]))))

        // An introduction the driver did not follow (no room, its limit in flight, data that leads nowhere) takes no
        // place in the member's share and leaves its peer unexpected; one of two of the same peer leaves the other.
        let twice = try PeerIdentity.generate(displayName: "twice").peerID
        for data: [UInt8] in [[4], [5]] {
            #expect(m.received(.introduce(peer: twice, data: data), from: honest) == [.connect(twice, data: data, introducer: honest)])
        }
        #expect(m.expectedIntroductions.introducedBy == [honest.identity: 3] && m.expectedIntroductions.introduced == 2)
        m.notFollowed(twice, introducedBy: honest)
        #expect(m.expectedIntroductions.introducedBy == [honest.identity: 2] && m.expectedIntroductions.introduced == 2)
        m.notFollowed(twice, introducedBy: honest)
        #expect(m.expectedIntroductions.introducedBy == [honest.identity: 1] && m.expectedIntroductions.introduced == 1)
        m.notFollowed(twice, introducedBy: liar)  // not the liar's: nothing changes
        #expect(m.expectedIntroductions.introducedBy == [honest.identity: 1] && m.expectedIntroductions.introduced == 1)
    }

    /// Random joins (each to a random member) and leaves, or joins across partitions (each newcomer cannot reach a
    /// random part of the others directly): the views always match the links, no peer appears twice, only
    /// unreachable pairs are relayed, and with room for all every member is connected to every other one. (Leaves
    /// and partitions are not mixed: a relayed link goes with the member relaying it, and nobody re-introduces the
    /// pair — see docs/PROTOCOL.md §3.9.)
    @Test(arguments: [1, 2, 3, 4, 5, 6, 7, 8] as [UInt64], [false, true])
    func randomJoinsLeavesAndPartitionsConverge(_ seed: UInt64, partitions: Bool) throws {
        var rng = SeededRandom(seed: seed)
        var w = World()
        var serial = 0
        for _ in 0..<(partitions ? 8 : 60) {
            let live = w.peers
            // With partitions, joins only: 8 of them, the limit.
            if partitions || (live.count < 7 && (live.isEmpty || rng.next() % 3 != 0)) {
                serial += 1
                let p = try PeerID(displayName: "p\(serial)")
                w.add(p)
                let host = live.randomElement(using: &rng)
                for other in live where partitions && other != host && rng.next() % 3 == 0 {
                    w.unreachable.insert(World.pair(p.identity, other.identity))
                }
                if let host { w.link(p, host) }
            } else if let gone = live.randomElement(using: &rng) {
                w.leave(gone)
            }
            w.checkViews()
        }
        // A fresh round of joins into whoever is left.
        for _ in 0..<(partitions ? 0 : 3) {
            serial += 1
            let p = try PeerID(displayName: "p\(serial)")
            let host = w.peers.randomElement(using: &rng)
            w.add(p)
            if let host { w.link(p, host) }
        }
        w.checkViews()
        #expect(Set(w.relayedVia.keys).isSubset(of: w.unreachable), "only pairs that cannot reach each other are relayed")
        // Those who joined into a connected group are connected to all of it.
        let n = w.peers.count
        for p in w.peers where w.degree(p) > 0 {
            let group = w.peers.filter { w.degree($0) > 0 }.count
            #expect(w.degree(p) == group - 1, "\(p.displayName) has \(w.degree(p)) links in a group of \(group) (of \(n))")
        }
    }

    @Test func anUnreachablePairIsLinkedThroughItsIntroducerAndGoesWithIt() throws {
        var w = World()
        let peers = try (0..<3).map { try PeerID(displayName: "p\($0)") }
        peers.forEach { w.add($0) }
        let pair = World.pair(peers[1].identity, peers[2].identity)
        w.unreachable.insert(pair)
        w.link(peers[1], peers[0])
        w.link(peers[2], peers[0])
        #expect(w.links.count == 3 && w.relayedVia == [pair: peers[0].identity])
        w.checkViews()
        w.leave(peers[0])
        #expect(w.links.isEmpty && w.relayedVia.isEmpty)
        w.checkViews()
    }
}

@Suite("Full-mesh sessions over real sockets on 127.0.0.1", .serialized)
struct MeshSessionTests {
    /// `n` sessions on 127.0.0.1; every one after the first joins the first (through its advertiser).
    struct Group {
        let sessions: [Session]
        let logs: [MeshEventLog]
        let advertiser: NearbyServiceAdvertiser
        var peers: [PeerID] { sessions.map(\.myPeerID) }

        /// `unansweredInvitationBurst`: each member's ration of invitations that give its digits away unanswered.
        /// `configure`: what to set on each member's log before anyone joins.
        init(_ n: Int, topology: Session.Topology = .mesh, peerTimeout: Duration = .seconds(2),
             unansweredInvitationBurst: Int = 16, configure: (Int, MeshEventLog) -> Void = { _, _ in }) throws {
            var config = Session.Configuration(peerTimeout: peerTimeout, bindHost: "127.0.0.1", topology: topology)
            config.unansweredInvitationBurst = unansweredInvitationBurst
            let made = try (0..<n).map { try Session(peer: try PeerID(displayName: "m\($0)"), configuration: config) }
            let madeLogs = made.map { _ in MeshEventLog() }
            for (s, l) in zip(made, madeLogs) { s.delegate = l }
            for (i, l) in madeLogs.enumerated() { configure(i, l) }
            let first = made[0]
            madeLogs[0].acceptInto.withLock { $0 = first }
            let ad = try NearbyServiceAdvertiser(peer: first.myPeerID, discoveryInfo: nil, serviceType: "pm-mesh",
                                                 discovery: InProcessDiscovery(), bindHost: "127.0.0.1")
            ad.delegate = madeLogs[0]
            try ad.startAdvertisingPeer()
            for s in made.dropFirst() {
                try s.connect(to: PeerEndpoint(host: "127.0.0.1", port: ad.port!))
            }
            sessions = made
            logs = madeLogs
            advertiser = ad
        }

        func converged(_ expected: (Int) -> Set<PeerID>) -> Bool {
            sessions.indices.allSatisfy { Set(sessions[$0].connectedPeers) == expected($0) && sessions[$0].connectedPeers.count == expected($0).count }
        }
    }

    @Test("Five sessions: every member's connectedPeers converges on the other four; data goes member to member directly")
    func fiveConverge() throws {
        // A ration of one: the introductions' invitations (their keys pinned by connection data) are not rationed.
        let g = try Group(5, unansweredInvitationBurst: 1)
        let all = Set(g.peers)
        #expect(eventually(10) { g.converged { all.subtracting([g.peers[$0]]) } },
                "views: \(g.sessions.map { $0.connectedPeers.map(\.displayName).sorted() })")
        for s in g.sessions { for p in s.connectedPeers { #expect(s.isEncrypted(p)) } }
        // Only the first member asks about newcomers (0 + 1 + 2 + 3 requests, whatever the order the four joined
        // it in); every other link was made by its introductions and introduces no one.
        #expect(g.sessions.map(\.statistics.introductionsAsked) == [6, 0, 0, 0, 0])
        // m1 → m4 directly (never through m0): m0 sees nothing.
        try g.sessions[1].send(Data("direct".utf8), toPeers: [g.peers[4]], with: .reliable)
        try g.sessions[1].send(Data("dgram".utf8), toPeers: [g.peers[4]], with: .unreliable)
        #expect(g.logs[4].wait(5) { $0.reliable.contains { $0.0 == g.peers[1] && $0.1 == Data("direct".utf8) } })
        #expect(g.logs[0].snapshot.reliable.isEmpty)
        // Nobody was asked anything: no invitation reached any app but the first member's four.
        #expect(g.logs[0].snapshot.invitations.count == 4)
        for l in g.logs.dropFirst() { #expect(l.snapshot.invitations.isEmpty) }
        // One leaves: it leaves every view.
        g.sessions[2].disconnect()
        #expect(eventually(5) { g.converged { $0 == 2 ? [] : all.subtracting([g.peers[$0], g.peers[2]]) } })
        for s in g.sessions { #expect(s.statistics.peerFaults == 0 && s.statistics.pacedInvitations == 0) }
    }

    @Test("An app that disconnects a peer the moment it connects (inside didChange): an introduced peer is still known as introduced, and no one is asked about it")
    func anAppThatDisconnectsAtOnceStillKnowsTheLinkWasIntroduced() throws {
        // m2's app turns m1 away as soon as it connects; m1's link to m2 is made by m0's introduction, whichever of
        // the two joined m0 first.
        let g = try Group(3) { i, log in
            guard i == 2 else { return }
            log.onConnected.withLock {
                $0 = { session, peer in if peer.displayName == "m1" { session.disconnect(peer) } }
            }
        }
        #expect(eventually(10) { g.logs[2].states(of: g.peers[1]).contains(.connected) && !g.sessions[2].connectedPeers.contains(g.peers[1]) },
                "m2 saw m1 connect, then let it go: \(g.logs[2].states(of: g.peers[1]))")
        #expect(eventually(5) { !g.sessions[1].connectedPeers.contains(g.peers[2]) })
        usleep(200_000)
        // The link m1 came by was read before the app disconnected it: m2 asked no one about m1.
        #expect(g.sessions.map(\.statistics.introductionsAsked) == [1, 0, 0])
    }

    @Test("A member that dies leaves everyone's connectedPeers within peerTimeout")
    func deathLeavesEveryView() throws {
        var g: Group? = try Group(3, peerTimeout: .milliseconds(800))
        let peers = g!.peers
        #expect(eventually(10) { g!.converged { Set(peers).subtracting([peers[$0]]) } })
        let survivors = Array(g!.sessions.prefix(2))
        // m2 dies: its sockets close under it with no GOODBYE, as when its process is killed (a frozen peer's
        // links time out after peerTimeout, as VanishingPeerTests shows for any link).
        let victim = g!.sessions[2]
        victim.core.loop.submitAndWait {
            for c in victim.core.io.value.connections.values { c.close() }
            victim.core.io.value.connections.removeAll()
        }
        g = nil
        #expect(eventually(3) { survivors.allSatisfy { !$0.connectedPeers.contains(peers[2]) } })
        withExtendedLifetime(victim) {}
    }

    @Test("A star stays a star: guests see only the host")
    func starStaysAStar() throws {
        let g = try Group(4, topology: .star)
        #expect(eventually(5) { g.sessions[0].connectedPeers.count == 3 })
        usleep(300_000)
        for s in g.sessions.dropFirst() { #expect(s.connectedPeers == [g.peers[0]]) }
    }
}
