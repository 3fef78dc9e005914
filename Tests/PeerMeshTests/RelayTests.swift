import Foundation
import Testing
import Synchronization
import MeshPOSIX
import MeshTestSupport
@testable import PeerMesh

/// Three relay machines on a line, N — H — M, with no sockets: N's link 1 is H's link 10, H's link 20 is M's link 2.
/// Every frame a machine sends is handed to the machine at the other end of its link at once.
private struct RelayLine {
    var n = RelayStateMachine(topology: .mesh)
    var h: RelayStateMachine
    var m = RelayStateMachine(topology: .mesh)
    let pn: PeerID, ph: PeerID, pm: PeerID
    var delivered: [String: [UInt8]] = ["n": [], "m": []]
    var credit: [String: Int] = ["n": 0, "m": 0]
    var opened: [String: (PipeKey, PeerID, Bool)] = [:]
    var closedEnds: [String: [PipeKey]] = ["n": [], "m": []]
    var faults: [String] = []
    var framesThroughH = 0

    init(splicer: Session.Topology = .mesh) throws {
        pn = try PeerID(displayName: "n")
        ph = try PeerID(displayName: "h")
        pm = try PeerID(displayName: "m")
        h = RelayStateMachine(topology: splicer)
    }

    var hMembers: [PeerID: LinkID] { [pn: 10, pm: 20] }

    mutating func run(_ actions: [RelayStateMachine.Action], at node: String) {
        for a in actions {
            switch a {
            case .send(let link, let frame): route(frame, from: node, link: link)
            case .openEnd(let key, let peer, let calling): opened[node] = (key, peer, calling)
            case .credit(_, let n): credit[node, default: 0] += n
            case .deliver(_, let bytes): delivered[node, default: []] += bytes
            case .closeEnd(let key): closedEnds[node, default: []].append(key)
            case .fault(let link, let f): faults.append("\(node)@\(link): \(f)")
            }
        }
    }

    mutating func route(_ f: RelayFrame, from node: String, link: LinkID) {
        switch (node, link) {
        case ("n", 1): framesThroughH += 1; run(h.received(f, on: 10, from: pn, members: hMembers), at: "h")
        case ("h", 10): run(n.received(f, on: 1, from: ph, members: [ph: 1]), at: "n")
        case ("h", 20): run(m.received(f, on: 2, from: ph, members: [ph: 2]), at: "m")
        case ("m", 2): framesThroughH += 1; run(h.received(f, on: 20, from: pm, members: hMembers), at: "h")
        default: Issue.record("\(node) sent on link \(link), which goes nowhere")
        }
    }

    /// N calls M through H.
    mutating func call() -> PipeKey {
        let (key, actions) = n.call(pm, via: 1)
        run(actions, at: "n")
        return key
    }

    /// `node`'s end sends `bytes`, in chunks within its credit (it must have enough).
    mutating func send(_ bytes: [UInt8], from node: String, on key: PipeKey) {
        var rest = bytes[...]
        while !rest.isEmpty {
            let take = min(rest.count, RelayFrame.maximumData, credit[node]!)
            precondition(take > 0, "no credit")
            credit[node]! -= take
            let chunk = Array(rest.prefix(take))
            rest = rest.dropFirst(take)
            run(node == "n" ? n.send(chunk, on: key) : m.send(chunk, on: key), at: node)
        }
    }

    /// `node`'s end passes everything delivered so far on to its connection.
    mutating func consumeAll(at node: String, on key: PipeKey, already: inout Int) {
        let count = delivered[node]!.count - already
        already = delivered[node]!.count
        guard count > 0 else { return }
        run(node == "n" ? n.consumed(count, on: key) : m.consumed(count, on: key), at: node)
    }
}

private func pattern(_ count: Int, seed: UInt8) -> [UInt8] { (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31) &+ seed } }

@Suite("Relay pipes as a pure state machine")
struct RelayStateMachineTests {
    @Test("A call is spliced by the introducer and carries bytes both ways, within the window, in order")
    func spliceCarriesBothWays() throws {
        var w = try RelayLine()
        let key = w.call()
        #expect(w.h.counts == (ends: 0, spliced: 2, closing: 0))
        let nEnd = try #require(w.opened["n"]), mEnd = try #require(w.opened["m"])
        #expect(nEnd.1 == w.pm && nEnd.2 == true, "N's end calls M")
        #expect(mEnd.1 == w.pn && mEnd.2 == false, "M's end takes a call from N")
        #expect(w.credit == ["n": RelayFrame.window, "m": RelayFrame.window])
        // N → M: three windows' worth, consumed as it arrives, so credit keeps coming back.
        let forward = pattern(3 * RelayFrame.window + 1234, seed: 7)
        var sent = 0, consumedM = 0
        while sent < forward.count {
            let n = min(w.credit["n"]!, forward.count - sent)
            #expect(n > 0, "N ran out of credit at \(sent)")
            if n == 0 { break }
            w.send(Array(forward[sent..<(sent + n)]), from: "n", on: key)
            sent += n
            w.consumeAll(at: "m", on: mEnd.0, already: &consumedM)
        }
        #expect(w.delivered["m"] == forward)
        // M → N.
        let back = pattern(70_000, seed: 99)
        w.send(back, from: "m", on: mEnd.0)
        #expect(w.delivered["n"] == back)
        #expect(w.faults.isEmpty)
    }

    @Test("Without credit back an end holds: one window in flight at most, and the splicer holds no more")
    func windowHoldsWithoutCredit() throws {
        var w = try RelayLine()
        let key = w.call()
        w.send(pattern(RelayFrame.window, seed: 1), from: "n", on: key)
        #expect(w.credit["n"] == 0, "the whole window is spent")
        #expect(w.delivered["m"]!.count == RelayFrame.window)
        // M takes half a window off the pipe: exactly that much credit comes back to N.
        var consumed = 0
        w.run(w.m.consumed(RelayFrame.window / 2, on: w.opened["m"]!.0), at: "m")
        consumed += RelayFrame.window / 2
        #expect(w.credit["n"] == RelayFrame.window / 2)
        _ = consumed
        #expect(w.faults.isEmpty)
    }

    @Test("Closing one end closes the other, each CLOSE is answered, and no pipe is left anywhere")
    func closeFromEitherEnd() throws {
        for closer in ["n", "m"] {
            var w = try RelayLine()
            let key = w.call()
            let mKey = w.opened["m"]!.0
            if closer == "n" { w.run(w.n.endClosed(key), at: "n") } else { w.run(w.m.endClosed(mKey), at: "m") }
            let other = closer == "n" ? "m" : "n"
            #expect(w.closedEnds[other]!.count == 1, "\(other)'s end was closed")
            #expect(w.closedEnds[closer]!.isEmpty, "the closer's own end is not closed twice")
            #expect(w.n.counts == (0, 0, 0) && w.h.counts == (0, 0, 0) && w.m.counts == (0, 0, 0))
            #expect(w.faults.isEmpty)
        }
    }

    @Test("The introducer's link to one end going down closes the other end")
    func splicerLinkLoss() throws {
        var w = try RelayLine()
        _ = w.call()
        w.run(w.h.linkClosed(10), at: "h")  // N's link at H is gone
        #expect(w.closedEnds["m"]!.count == 1)
        #expect(w.h.counts == (0, 0, 0) && w.m.counts == (0, 0, 0), "M's answering CLOSE freed H's leg")
        w.run(w.n.linkClosed(1), at: "n")
        #expect(w.closedEnds["n"]!.count == 1 && w.n.counts == (0, 0, 0))
    }

    @Test("A call to a non-member, to oneself, or through a star is refused, and the caller's end closes")
    func refusals() throws {
        let stranger = try PeerID(displayName: "stranger")
        for (target, topology) in [(stranger, Session.Topology.mesh), (nil, .mesh), (nil, .star)] as [(PeerID?, Session.Topology)] {
            var w = try RelayLine(splicer: topology)
            let (key, actions) = w.n.call(target ?? (topology == .star ? w.pm : w.pn), via: 1)
            w.run(actions, at: "n")
            #expect(w.closedEnds["n"] == [key], "refused: \(String(describing: target)) \(topology)")
            #expect(w.opened["m"] == nil, "M never heard of it")
            #expect(w.n.counts == (0, 0, 0) && w.h.counts == (0, 0, 0))
            #expect(w.faults.isEmpty)
        }
    }

    @Test("Bytes past the window are a fault at the splicer and at an end; so is credit for bytes never sent")
    func liesAreFaults() throws {
        let chunk = [UInt8](repeating: 5, count: RelayFrame.maximumData)
        let perWindow = RelayFrame.window / RelayFrame.maximumData
        // At H: N's end pushes one chunk past the window.
        var w = try RelayLine()
        let key = w.call()
        for _ in 0...perWindow {
            w.run(w.h.received(.data(pipe: key.id, opener: true, bytes: chunk), on: 10, from: w.pn, members: w.hMembers), at: "h")
        }
        #expect(w.faults == ["h@10: the peer sent RELAY_DATA beyond pipe \(key.id)'s window out of turn"])
        // At H: M credits N for bytes N never sent.
        w = try RelayLine()
        _ = w.call()
        let mKey = w.opened["m"]!.0
        w.run(w.h.received(.credit(pipe: mKey.id, opener: false, bytes: 10), on: 20, from: w.pm, members: w.hMembers), at: "h")
        #expect(w.faults == ["h@20: the peer sent RELAY_CREDIT for bytes pipe \(mKey.id) never carried out of turn"])
        // At M's end: a lying splicer pushes past the window.
        w = try RelayLine()
        _ = w.call()
        for _ in 0...perWindow {
            w.run(w.m.received(.data(pipe: mKey.id, opener: true, bytes: chunk), on: 2, from: w.ph, members: [w.ph: 2]), at: "m")
        }
        #expect(w.faults == ["m@2: the peer sent RELAY_DATA beyond pipe \(mKey.id)'s window out of turn"])
        #expect(w.delivered["m"]!.count == RelayFrame.window, "exactly one window was taken")
    }

    @Test("Frames for pipes that are not open are faults; frames for a pipe being closed are dropped")
    func unknownAndClosingPipes() throws {
        var w = try RelayLine()
        w.run(w.h.received(.data(pipe: 9, opener: true, bytes: [1]), on: 10, from: w.pn, members: w.hMembers), at: "h")
        w.run(w.h.received(.credit(pipe: 9, opener: true, bytes: 1), on: 10, from: w.pn, members: w.hMembers), at: "h")
        w.run(w.h.received(.close(pipe: 9, opener: true), on: 10, from: w.pn, members: w.hMembers), at: "h")
        #expect(w.faults.count == 3)
        // M closes its end; N's bytes still in flight are dropped at M, not a fault.
        w = try RelayLine()
        _ = w.call()
        let mKey = w.opened["m"]!.0
        let closeActions = w.m.endClosed(mKey)  // not yet delivered to H
        w.run(w.m.received(.data(pipe: mKey.id, opener: true, bytes: [1, 2]), on: 2, from: w.ph, members: [w.ph: 2]), at: "m")
        #expect(w.delivered["m"]!.isEmpty && w.faults.isEmpty)
        w.run(closeActions, at: "m")
        #expect(w.m.counts == (0, 0, 0) && w.h.counts == (0, 0, 0) && w.n.counts == (0, 0, 0))
    }

    @Test("A flood of calls: 16 pipes per link, then refusals, then a member that ignores refusals is cut off")
    func floodOfRequests() throws {
        var w = try RelayLine()
        var refused = 0
        var fault = false
        for id in UInt32(1)...200 {
            let actions = w.h.received(.request(pipe: id, peer: w.pm), on: 10, from: w.pn, members: w.hMembers)
            if actions.contains(where: { if case .fault = $0 { true } else { false } }) { fault = true; break }
            if actions == [.send(10, .close(pipe: id, opener: false))] { refused += 1 }
        }
        #expect(w.h.counts.spliced == 32, "16 pipes admitted (two legs each)")
        #expect(refused == 64)
        #expect(fault, "then cut off")
    }

    @Test("Calls opened and closed without end to a member that never answers CLOSE: that member is cut off, the table stays bounded")
    func aMemberThatNeverAnswersClose() throws {
        var w = try RelayLine()
        var faults: [LinkID] = []
        var calls = 0
        for id in UInt32(1)...400 where faults.isEmpty {
            // N asks H to splice it to M, then hangs up; H closes the leg to M, and M never answers.
            let spliced = w.h.received(.request(pipe: id, peer: w.pm), on: 10, from: w.pn, members: w.hMembers)
            #expect(spliced.count == 1, "spliced, not refused")
            let closed = w.h.received(.close(pipe: id, opener: true), on: 10, from: w.pn, members: w.hMembers)
            for case .fault(let link, _) in spliced + closed { faults.append(link) }
            calls += 1
        }
        #expect(faults == [20], "M, which owes the answers, is at fault; N, which answered everything, is not")
        #expect(calls == w.h.limits.maximumUnansweredPerLink + 1)
        #expect(w.h.counts.closing == w.h.limits.maximumUnansweredPerLink + 1, "bounded until the driver closes M's link")
        _ = w.h.linkClosed(20)
        #expect(w.h.counts == (0, 0, 0))
    }
}

/// Sessions whose introduced members call through their introducer (`relaysIntroductions`), on 127.0.0.1.
private struct RelayedGroup {
    let sessions: [Session]
    let logs: [MeshEventLog]
    let advertiser: NearbyServiceAdvertiser
    var peers: [PeerID] { sessions.map(\.myPeerID) }

    /// `n` members; member i waits `peerTimeouts[i]` for a silent peer (default 2 s each); each may have
    /// `unansweredInvitationBurst` invitations give its digits away unanswered.
    init(_ n: Int, scratch: String? = nil, peerTimeouts: [Duration]? = nil, unansweredInvitationBurst: Int = 16) throws {
        var config = Session.Configuration(peerTimeout: .seconds(2), bindHost: "127.0.0.1")
        config.unansweredInvitationBurst = unansweredInvitationBurst
        if let scratch { config.resourceDirectory = scratch }
        var relaying = config
        relaying.relaysIntroductions = true
        try self.init(configurations: (0..<n).map { i in
            var c = i == 0 ? config : relaying
            if let peerTimeouts { c.peerTimeout = peerTimeouts[i] }
            return c
        })
    }

    /// One member per configuration; member 0 advertises, and the others join it.
    init(configurations: [Session.Configuration]) throws {
        let made = try configurations.enumerated().map { i, c in
            try Session(peer: try PeerID(displayName: "r\(i)"), configuration: c)
        }
        let madeLogs = made.map { _ in MeshEventLog() }
        for (s, l) in zip(made, madeLogs) { s.delegate = l }
        madeLogs[0].acceptInto.withLock { $0 = made[0] }
        let ad = try NearbyServiceAdvertiser(peer: made[0].myPeerID, discoveryInfo: nil, serviceType: "pm-relay",
                                             discovery: InProcessDiscovery(), bindHost: "127.0.0.1")
        ad.delegate = madeLogs[0]
        try ad.startAdvertisingPeer()
        for s in made.dropFirst() { try s.connect(to: PeerEndpoint(host: "127.0.0.1", port: ad.port!)) }
        sessions = made
        logs = madeLogs
        advertiser = ad
    }

    func converged() -> Bool {
        let all = Set(peers)
        return sessions.allSatisfy { Set($0.connectedPeers) == all.subtracting([$0.myPeerID]) && $0.connectedPeers.count == all.count - 1 }
    }
}

@Suite("Relayed links over real sockets on 127.0.0.1, encrypted end to end", .serialized)
struct RelayedSessionTests {
    @Test("Calls through an introducer pin their keys with connection data: with a ration of one, four members link up and none waits")
    func relayedCallsAreNotRationed() throws {
        let g = try RelayedGroup(4, unansweredInvitationBurst: 1)
        #expect(eventually(10) { g.converged() }, "views: \(g.sessions.map { $0.connectedPeers.map(\.displayName).sorted() })")
        #expect(g.sessions[1].isRelayed(g.peers[2]) && g.sessions[3].isRelayed(g.peers[1]))
        for s in g.sessions { #expect(s.statistics.pacedInvitations == 0 && s.statistics.peerFaults == 0) }
        // Relayed links made by introductions introduce no one either: only r0 asked (0 + 1 + 2 requests).
        #expect(g.sessions.map(\.statistics.introductionsAsked) == [3, 0, 0, 0])
    }

    @Test("Two members that do not connect directly are connected through their introducer and say so")
    func membersConnectThroughTheIntroducer() throws {
        let g = try RelayedGroup(3)
        #expect(eventually(10) { g.converged() }, "views: \(g.sessions.map { $0.connectedPeers.map(\.displayName).sorted() })")
        let (r0, r1, r2) = (g.sessions[0], g.sessions[1], g.sessions[2])
        #expect(r1.isRelayed(g.peers[2]) && r2.isRelayed(g.peers[1]), "r1 and r2 are relayed")
        #expect(!r1.isRelayed(g.peers[0]) && !r2.isRelayed(g.peers[0]) && !r0.isRelayed(g.peers[1]), "links to r0 are direct")
        #expect(r1.isEncrypted(g.peers[2]) && r2.isEncrypted(g.peers[1]))
        // End to end: the two ends agree on the channel binding; the introducer has no such link.
        #expect(r1.channelBinding(for: g.peers[2]) == r2.channelBinding(for: g.peers[1]))
        #expect(r1.channelBinding(for: g.peers[2]) != nil && r0.channelBinding(for: g.peers[2]) != r1.channelBinding(for: g.peers[2]))

        // Messages both ways, in order; datagrams (carried on the relayed connection).
        for i in 0..<100 { try r1.send(Data("to r2 \(i)".utf8), toPeers: [g.peers[2]], with: .reliable) }
        for i in 0..<20 { try r2.send(Data("to r1 \(i)".utf8), toPeers: [g.peers[1]], with: .reliable) }
        try r2.send(Data("dgram".utf8), toPeers: [g.peers[1]], with: .unreliable)
        #expect(g.logs[2].wait(5) { $0.reliable.filter { $0.0 == g.peers[1] }.count == 100 })
        #expect(g.logs[2].snapshot.reliable.filter { $0.0 == g.peers[1] }.map { String(decoding: $0.1, as: UTF8.self) }
                == (0..<100).map { "to r2 \($0)" })
        #expect(g.logs[1].wait(5) { $0.reliable.filter { $0.0 == g.peers[2] }.count == 20 })
        #expect(g.logs[1].wait(5) { $0.datagrams.contains { $0.0 == g.peers[2] && $0.1 == Data("dgram".utf8) } })
        // Datagrams sent as a real-time thread sends them (raw bytes, `toConnected`) go through the preallocated outbox:
        // 40 one at a time arrive all, in order; a burst of 2 × 300 from two threads at once arrives in each thread's
        // order, every one either delivered or counted as not sent (the outbox holds 64).
        func dgrams(from tag: String) -> [String] {
            g.logs[1].snapshot.datagrams.filter { $0.0 == g.peers[2] }.map { String(decoding: $0.1, as: UTF8.self) }.filter { $0.hasPrefix(tag) }
        }
        let toR1 = g.peers[1]
        @Sendable func send(_ text: String) { Array(text.utf8).withUnsafeBytes { _ = r2.sendDatagram($0, toConnected: [toR1]) } }
        for i in 0..<40 {
            send("rt \(i)")
            Thread.sleep(forTimeInterval: 0.002)
        }
        #expect(g.logs[1].wait(5) { _ in dgrams(from: "rt ").count == 40 }, "\(dgrams(from: "rt ").count) of 40")
        #expect(dgrams(from: "rt ") == (0..<40).map { "rt \($0)" })
        let notSentBefore = r2.statistics.datagramsNotSent
        DispatchQueue.concurrentPerform(iterations: 2) { t in
            for i in 0..<300 { send("burst\(t) \(i)") }
        }
        let notSent = r2.statistics.datagramsNotSent - notSentBefore
        #expect(g.logs[1].wait(5) { _ in UInt64(dgrams(from: "burst").count) + notSent == 600 },
                "\(dgrams(from: "burst").count) delivered + \(notSent) not sent of 600")
        #expect(dgrams(from: "burst").count >= 64, "at least an outbox's worth arrives")
        for t in 0..<2 {
            let got = dgrams(from: "burst\(t) ").map { Int($0.split(separator: " ")[1])! }
            #expect(got == got.sorted(), "thread \(t)'s datagrams arrive in its order")
        }

        // The introducer's app saw none of it, and nobody else's app was asked anything.
        #expect(g.logs[0].snapshot.reliable.isEmpty && g.logs[0].snapshot.datagrams.isEmpty)
        #expect(g.logs[1].snapshot.invitations.isEmpty && g.logs[2].snapshot.invitations.isEmpty)
        #expect(g.logs[1].snapshot.failures.isEmpty && g.logs[2].snapshot.failures.isEmpty, "no failed invitation reported")
        // Each app heard the other go `connecting` once, from the call on, then `connected`.
        #expect(g.logs[1].states(of: g.peers[2]) == [.connecting, .connected])
        #expect(g.logs[2].states(of: g.peers[1]) == [.connecting, .connected])
        for s in g.sessions { #expect(s.statistics.peerFaults == 0) }

        // A member that leaves leaves the relayed view too.
        r2.disconnect()
        #expect(eventually(5) { r1.connectedPeers == [g.peers[0]] && r0.connectedPeers == [g.peers[1]] })
        #expect(eventually(5) { r0.core.loop.submitAndWait { r0.core.io.value.relay.counts == (0, 0, 0) } },
                "the introducer holds no pipe after both ends went")
    }

    @Test("An introduction whose address refuses goes on through the introducer: the app hears `connecting` once, then `connected`, and no failure")
    func aRefusedAddressGoesOnThroughTheIntroducer() throws {
        // r1 is a star (it follows no introductions), so r1 and r2 meet only through the introduction made here, whose
        // one address (127.0.0.2) refuses: r2 listens on 127.0.0.1.
        let config = Session.Configuration(peerTimeout: .seconds(2), bindHost: "127.0.0.1")
        var star = config
        star.topology = .star
        let g = try RelayedGroup(configurations: [config, star, config])
        let (sessions, logs) = (g.sessions, g.logs)
        let (r0, r1, r2) = (sessions[0], sessions[1], sessions[2])
        #expect(eventually(5) { r0.connectedPeers.count == 2 && r1.connectedPeers.count == 1 && r2.connectedPeers.count == 1 })

        let (r2Peer, r0Peer) = (r2.myPeerID, r0.myPeerID)
        // Made for r0's introduction, as r2 knows r0's membership.
        let introduction = r2.core.loop.submitAndWait { r2.core.io.value.membership.introduction(by: r0Peer) }
        var blob = try NearbyConnectionData.decode(Array(try r2.nearbyConnectionData(
            forPeer: r1.myPeerID, preferring: nil, introduction: introduction))).get()
        blob.addresses = ["127.0.0.2"]
        let bytes = blob.encoded()
        _ = r1.core.loop.submitAndWait { r1.core.connectIntroduced(r2Peer, data: bytes, introducer: r0Peer) }
        #expect(eventually(10) { r1.connectedPeers.contains(r2Peer) && r2.connectedPeers.contains(r1.myPeerID) })
        // The link r1 made by r0's introduction (marked so in its invitation, with r2's ticket for it) asks no one.
        #expect(r1.statistics.introductionsAsked == 0 && r2.statistics.introductionsAsked == 0)
        #expect(r1.isRelayed(r2Peer), "through r0")
        #expect(logs[1].states(of: r2Peer) == [.connecting, .connected])
        #expect(logs[1].snapshot.failures.isEmpty, "the refused address is not reported: the attempt went on")
        for s in sessions { s.disconnect() }
    }

    @Test("A member that waits 20 s for silent peers still beats often enough for one that waits 2 s, over a relayed link")
    func aLongTimeoutStillBeatsForAShortOne() throws {
        // A relayed link has no UDP path: its only proof of life is the connection's HEARTBEATs. r1 waits 20 s, r2 the
        // default 2 s; neither sends anything else. r1 used to beat every 5 s (a quarter of its own timeout), so r2
        // dropped it after 2 s.
        let g = try RelayedGroup(3, peerTimeouts: [.seconds(2), .seconds(20), .seconds(2)])
        #expect(eventually(10) { g.converged() }, "views: \(g.sessions.map { $0.connectedPeers.map(\.displayName).sorted() })")
        let (r1, r2) = (g.sessions[1], g.sessions[2])
        #expect(r1.isRelayed(g.peers[2]) && r2.isRelayed(g.peers[1]))
        #expect(r1.core.heartbeat == 500_000_000, "a quarter of 20 s, capped at the default's 0.5 s")
        usleep(4_000_000)  // twice r2's timeout, in silence
        #expect(r2.connectedPeers.contains(g.peers[1]), "r2 still hears r1: \(g.logs[2].snapshot.states.map { "\($0.0.displayName) \($0.1)" })")
        #expect(r1.connectedPeers.contains(g.peers[2]))
        for s in g.sessions { #expect(s.statistics.peerFaults == 0) }
    }

    @Test("A 6 MB resource and a stream cross a relayed link intact; the introducer leaving takes the link down")
    func bulkThroughTheRelayAndIntroducerLoss() throws {
        let scratch = try TemporaryDirectory.make(in: TemporaryDirectory.system, prefix: "pm-relay-")
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let g = try RelayedGroup(3, scratch: scratch)
        #expect(eventually(10) { g.converged() })
        let (r0, r1, r2) = (g.sessions[0], g.sessions[1], g.sessions[2])
        #expect(r1.isRelayed(g.peers[2]))
        var rng = SeededRandom(seed: 5)
        let bytes = (0..<(6 << 20)).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
        let path = "\(scratch)/six.bin"
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        let kept = "\(scratch)/kept"
        try FileManager.default.createDirectory(atPath: kept, withIntermediateDirectories: true)
        g.logs[2].keepResourcesIn.withLock { $0 = kept }
        let progress = try r1.sendResource(at: URL(fileURLWithPath: path), withName: "six.bin", toPeer: g.peers[2])
        #expect(g.logs[2].wait(30) { $0.resourcesFinished.count == 1 })
        let finished = try #require(g.logs[2].snapshot.resourcesFinished.first)
        #expect(finished.3 == nil)
        let received = try Data(contentsOf: URL(fileURLWithPath: try #require(finished.2)))
        #expect(Sodium.sha256([Array(received)]) == Sodium.sha256([bytes]))
        #expect(eventually(5) { progress.isFinished })

        // A stream of 2 MB in random-sized writes, in order.
        let out = try r2.startStream(withName: "s", toPeer: g.peers[1])
        let streamBytes = Array(bytes.prefix(2 << 20))
        let writer = Thread {
            var i = 0
            while i < streamBytes.count {
                let n = min(streamBytes.count - i, Int.random(in: 1...100_000))
                try? out.write(Data(streamBytes[i..<(i + n)]))
                i += n
            }
            out.close()
        }
        writer.start()
        #expect(g.logs[1].wait(5) { $0.streams.count == 1 })
        let input = try #require(g.logs[1].snapshot.streams.first?.2)
        var got: [UInt8] = []
        while let d = try input.read(timeout: .seconds(10)) { got += d }
        #expect(got == streamBytes)

        // The introducer goes: the relayed link goes with it, and each member's view empties.
        r0.disconnect()
        g.advertiser.stopAdvertisingPeer()
        #expect(eventually(5) { r1.connectedPeers.isEmpty && r2.connectedPeers.isEmpty })
        for s in g.sessions { #expect(s.statistics.peerFaults == 0) }
    }
}

/// Members that lie about relay pipes, over the real encrypted link.
@Suite("Relay attacks over the real link", .serialized)
struct RelayAttackTests {
    private func inject(_ frames: [ControlFrame], from session: Session, to peer: PeerID) {
        injectFrames(frames, from: session, to: peer)
    }

    @Test("A call nobody made connection data for is refused: no pipe end, nothing reaches the app")
    func callWithoutTicket() throws {
        let pair = try Pair()
        let caller = try PeerID(displayName: "caller")
        // The guest pretends to be an introducer passing a call from `caller` to the host.
        inject([.relay(.incoming(pipe: 1, peer: caller))], from: pair.guest, to: pair.hostPeer)
        usleep(300_000)
        // (The forger's own session, which never opened the pipe, takes the host's CLOSE as a fault and hangs up.)
        #expect(pair.hostLog.snapshot.invitations.count == 1, "only the guest's own invitation")
        #expect(pair.host.statistics.peerFaults == 0)
        #expect(pair.host.core.loop.submitAndWait { pair.host.core.io.value.relayEnds.isEmpty }, "no pipe end was made")
    }

    @Test("Raw bytes pushed into a call the host did accept never reach its app: the listener wants a handshake")
    func garbageThroughAPipe() throws {
        let pair = try Pair()
        let caller = try PeerID(displayName: "caller")
        // The host made connection data for `caller`, so it takes the call; the "caller" sends garbage.
        _ = try pair.host.nearbyConnectionData(forPeer: caller)
        inject([.relay(.incoming(pipe: 1, peer: caller)),
                .relay(.data(pipe: 1, opener: true, bytes: Array(repeating: 0x41, count: 4096)))],
               from: pair.guest, to: pair.hostPeer)
        usleep(500_000)
        #expect(pair.hostLog.snapshot.invitations.count == 1, "only the guest's own invitation")
        #expect(pair.host.statistics.peerFaults == 0, "the pipe's connection failed, not the link that carried it")
        #expect(eventually(5) { pair.host.core.loop.submitAndWait { pair.host.core.io.value.relayEnds.isEmpty } },
                "the end closed with its connection")
    }

    @Test("A pipe pushed past its window (2 MB into a 256 KiB window): the host takes no more than the window")
    func pipePastTheWindow() throws {
        let pair = try Pair()
        let caller = try PeerID(displayName: "caller")
        _ = try pair.host.nearbyConnectionData(forPeer: caller)
        let chunk = [UInt8](repeating: 0x42, count: RelayFrame.maximumData)
        let frames: [ControlFrame] = [.relay(.incoming(pipe: 1, peer: caller))]
            + (0..<64).map { _ in .relay(.data(pipe: 1, opener: true, bytes: chunk)) }
        inject(frames, from: pair.guest, to: pair.hostPeer)
        // Two outcomes, by timing, both bounded: the host cuts the link when the window is passed (a fault), or
        // its listener rejects the garbage first, the pipe closes and whatever follows is dropped unread. (The
        // window check itself is exact in RelayStateMachineTests.liesAreFaults.)
        #expect(eventually(5) { pair.host.core.loop.submitAndWait { pair.host.core.io.value.relayEnds.isEmpty } })
        #expect(pair.host.statistics.peerFaults <= 1)
        #expect(pair.hostLog.snapshot.invitations.count == 1, "nothing of it reached the app")
    }

    @Test("A flood of calls through the host to one of its members: some spliced, the rest refused, then cut off")
    func floodOfCalls() throws {
        let pair = try Pair()
        // A second member the flood asks for.
        let other = try Session(peer: try PeerID(displayName: "other"), configuration: .init(bindHost: "127.0.0.1"))
        try other.connect(to: PeerEndpoint(host: "127.0.0.1", port: pair.advertiser.port!))
        #expect(eventually(5) { pair.host.connectedPeers.count == 2 })
        let frames: [ControlFrame] = (UInt32(1)...200).map { .relay(.request(pipe: $0, peer: other.myPeerID)) }
        inject(frames, from: pair.guest, to: pair.hostPeer)
        #expect(eventually(5) { pair.host.statistics.peerFaults == 1 })
        #expect(eventually(5) { !pair.host.connectedPeers.contains(pair.guestPeer) })
        #expect(eventually(5) { pair.host.core.loop.submitAndWait { pair.host.core.io.value.relay.counts.spliced == 0 } },
                "every spliced leg went with the flooder's link")
        #expect(pair.host.connectedPeers.contains(other.myPeerID), "the member that was asked for is unharmed")
    }
}
