import Foundation
import PeerMesh
import Testing
@testable import MeshRelay

@Suite("Join state machine (pure, virtual time)")
struct JoinStateMachineTests {
    let host = try! PeerID(displayName: "kitchen")
    let other = try! PeerID(displayName: "garage")
    let ms: UInt64 = 1_000_000

    @Test("Discover: the first host found is invited; connected means joined")
    func discoverFirst() {
        var m = JoinStateMachine(target: .discover(hostName: nil))
        #expect(m.start(now: 0) == [.announce("searching for a host…")])
        #expect(m.found(host, now: 10 * ms) == [.announce("found host kitchen; joining"), .invite(host)])
        #expect(m.found(other, now: 11 * ms) == [], "one join at a time")
        #expect(m.sessionState(host, .connecting, now: 12 * ms) == [])
        #expect(m.sessionState(host, .connected, now: 13 * ms) == [.announce("joined kitchen")])
        #expect(m.phase == .joined("kitchen"))
    }

    @Test("Discover with --host: other hosts are ignored")
    func discoverByName() {
        var m = JoinStateMachine(target: .discover(hostName: "kitchen"))
        _ = m.start(now: 0)
        #expect(m.found(other, now: 1) == [])
        #expect(m.found(host, now: 2) == [.announce("found host kitchen; joining"), .invite(host)])
    }

    @Test("Host lost: say so, search again, join the next host found at once (a restarted host may have a new identity)")
    func rejoinAfterLoss() {
        var m = JoinStateMachine(target: .discover(hostName: nil))
        _ = m.start(now: 0)
        _ = m.found(host, now: 0)
        _ = m.sessionState(host, .connected, now: 1 * ms)
        #expect(m.sessionState(host, .notConnected, now: 100 * ms) == [.announce("host kitchen went away; searching again")])
        #expect(m.phase == .searching)
        let restarted = try! PeerID(displayName: "kitchen")
        #expect(m.lost(host) == [])
        #expect(m.found(restarted, now: 150 * ms) == [.announce("found host kitchen; joining"), .invite(restarted)],
                "a host that appears is tried at once, backoff or not")
        #expect(m.tick(now: 360 * ms) == [])
        #expect(m.sessionState(restarted, .connected, now: 400 * ms) == [.announce("joined kitchen")])
    }

    /// A machine for any host that has found `host`, then `other`, and invites `host`.
    func anyHostOfTwo() -> JoinStateMachine {
        var m = JoinStateMachine(target: .discover(hostName: nil))
        _ = m.start(now: 0)
        _ = m.found(host, now: 0)
        _ = m.found(other, now: 0)
        return m
    }

    @Test("A host whose invitation fails is retried after the others")
    func failedHostIsDemoted() {
        var m = anyHostOfTwo()
        #expect(m.invitationFailed(host, reason: "refused", now: 10 * ms) == [.announce("could not join kitchen: refused")])
        #expect(m.tick(now: 300 * ms) == [.announce("found host garage; joining"), .invite(other)])
    }

    @Test("An invitation given up on by the safety deadline that connects after all is joined, not ignored")
    func aLateConnectionIsJoined() {
        let e = PeerEndpoint(host: "127.0.0.1", port: 9)
        var m = JoinStateMachine(target: .direct(e), maximumAttempts: 5, inviteTimeoutNanos: 1_000 * ms)
        _ = m.start(now: 0)
        #expect(m.tick(now: 2_000 * ms) == [.announce("could not join 127.0.0.1:9: no answer")])
        #expect(m.phase == .searching)
        #expect(m.sessionState(host, .connected, now: 2_100 * ms) == [.announce("joined kitchen")])
        #expect(m.phase == .joined("kitchen"))
        #expect(m.tick(now: 5_000 * ms) == [], "no retry once joined")
    }

    @Test("Any host will do: one that refuses for good (not paired, declined) is dropped and another found is tried at once; with none other, or with --host, the join ends")
    func aRefusingHostIsDroppedWhenAnyWillDo() {
        var m = anyHostOfTwo()
        #expect(m.invitationFailed(host, reason: "kitchen: not paired", permanent: true, now: 10 * ms)
                == [.announce("kitchen: not paired; trying another host"), .announce("found host garage; joining"), .invite(other)])
        #expect(m.found(host, now: 20 * ms) == [], "it re-advertises: not invited again in this run")
        // The last one left refuses too: the join ends, saying why.
        #expect(m.invitationFailed(other, reason: "garage declined", permanent: true, now: 30 * ms) == [.giveUp("garage declined")])
        #expect(m.phase == .stopped)

        // A stale record (a killed host's, lingering) is no host to go on for: the refusal ends the join.
        var withStale = JoinStateMachine(target: .discover(hostName: nil))
        _ = withStale.start(now: 0)
        _ = withStale.found(other, now: 0)
        _ = withStale.invitationFailed(other, reason: "Connection refused", unreachable: true, now: 5 * ms)
        #expect(withStale.found(host, now: 10 * ms) == [.announce("found host kitchen; joining"), .invite(host)])
        #expect(withStale.invitationFailed(host, reason: "kitchen: not paired", permanent: true, now: 20 * ms)
                == [.giveUp("kitchen: not paired")])

        var named = JoinStateMachine(target: .discover(hostName: "kitchen"))
        _ = named.start(now: 0)
        _ = named.found(host, now: 0)
        #expect(named.invitationFailed(host, reason: "kitchen: not paired", permanent: true, now: 10 * ms)
                == [.giveUp("kitchen: not paired")], "the host asked for by name refused: nothing else will do")
    }

    @Test("A stale record (killed host) costs one failed attempt: the host is tried again the moment it re-advertises")
    func staleRecordWaitsForTheReadvertisement() {
        var m = JoinStateMachine(target: .discover(hostName: nil))
        _ = m.start(now: 0)
        #expect(m.found(host, now: 0) == [.announce("found host kitchen; joining"), .invite(host)])
        #expect(m.invitationFailed(host, reason: "refused", unreachable: true, now: 1 * ms)
            == [.announce("could not join kitchen: refused; waiting for it to advertise again")])
        // No retry at 250 ms, 500 ms or 1 s against the same dead address.
        for t in [250, 500, 1_000, 1_900] { #expect(m.tick(now: UInt64(t) * ms) == [], "no retry at \(t) ms") }
        // It re-advertises (a restart's new port): joined at once, under its new name.
        let renamed = try! PeerID(displayName: "kitchen-2", identity: host.identity)
        #expect(m.found(renamed, now: 1_950 * ms) == [.announce("found host kitchen-2; joining"), .invite(renamed)])
        #expect(m.sessionState(renamed, .connected, now: 1_960 * ms) == [.announce("joined kitchen-2")])
    }

    @Test("A stale host that never re-advertises is still retried, slowly (2 s, 4 s, then every 5 s), and quietly")
    func staleRecordSlowRetries() {
        var m = JoinStateMachine(target: .discover(hostName: nil))
        _ = m.start(now: 0)
        _ = m.found(host, now: 0)
        _ = m.invitationFailed(host, reason: "refused", unreachable: true, now: 0)
        #expect(m.tick(now: 1_999 * ms) == [])
        #expect(m.tick(now: 2_000 * ms) == [.announce("found host kitchen; joining"), .invite(host)])
        #expect(m.invitationFailed(host, reason: "refused", unreachable: true, now: 2_001 * ms) == [], "said once")
        #expect(m.tick(now: 6_000 * ms) == [])
        #expect(m.tick(now: 6_001 * ms) == [.announce("found host kitchen; joining"), .invite(host)])
        _ = m.invitationFailed(host, reason: "refused", unreachable: true, now: 6_001 * ms)
        #expect(m.tick(now: 11_000 * ms) == [])
        #expect(m.tick(now: 11_001 * ms) == [.announce("found host kitchen; joining"), .invite(host)])
    }

    @Test("A host that re-advertises while an attempt goes to its old address is retried at once when that attempt fails")
    func readvertisedDuringTheAttempt() {
        var m = JoinStateMachine(target: .discover(hostName: nil))
        _ = m.start(now: 0)
        _ = m.found(host, now: 0)
        #expect(m.found(host, now: 1 * ms) == [], "one attempt at a time")
        #expect(m.invitationFailed(host, reason: "refused", unreachable: true, now: 2 * ms)
            == [.announce("could not join kitchen: refused; it has advertised again")])
        #expect(m.tick(now: 3 * ms) == [.announce("found host kitchen; joining"), .invite(host)])
    }

    @Test("A stale host whose record goes away and comes back (lost, then found) is tried at once")
    func staleHostLostAndFoundAgain() {
        var m = JoinStateMachine(target: .discover(hostName: nil))
        _ = m.start(now: 0)
        _ = m.found(host, now: 0)
        _ = m.invitationFailed(host, reason: "refused", unreachable: true, now: 1 * ms)
        #expect(m.lost(host) == [])
        #expect(m.found(host, now: 900 * ms) == [.announce("found host kitchen; joining"), .invite(host)])
    }

    @Test("A new host found while waiting to retry a failing one is tried at once")
    func newHostDuringBackoff() {
        var m = JoinStateMachine(target: .discover(hostName: nil))
        _ = m.start(now: 0)
        _ = m.found(host, now: 0)
        _ = m.invitationFailed(host, reason: "full", now: 1 * ms)
        #expect(m.found(other, now: 2 * ms) == [.announce("found host garage; joining"), .invite(other)])
    }

    @Test("With a stale host and a live one, the live one is tried first")
    func liveHostBeforeStale() {
        var m = JoinStateMachine(target: .discover(hostName: nil))
        _ = m.start(now: 0)
        _ = m.found(host, now: 0)
        _ = m.found(other, now: 0)
        _ = m.invitationFailed(host, reason: "refused", unreachable: true, now: 0)
        #expect(m.tick(now: 250 * ms) == [.announce("found host garage; joining"), .invite(other)])
    }

    @Test("Direct: bounded retries with backoff, then give up")
    func directGivesUp() {
        let e = PeerEndpoint(host: "127.0.0.1", port: 9)
        var m = JoinStateMachine(target: .direct(e), maximumAttempts: 3)
        #expect(m.start(now: 0) == [.connect(e)])
        var now: UInt64 = 0
        var connects = 1
        var gaveUp: String?
        for _ in 0..<100 {
            now += 50 * ms
            let a = m.invitationFailed(nil, reason: "Connection refused", now: now)
            if case .giveUp(let why)? = a.first { gaveUp = why; break }
            var t: [JoinStateMachine.Action] = []
            while t.isEmpty { now += 50 * ms; t = m.tick(now: now) }
            #expect(t == [.connect(e)])
            connects += 1
        }
        #expect(connects == 3)
        #expect(gaveUp == "cannot join 127.0.0.1:9: Connection refused (3 attempts)")
        #expect(m.phase == .stopped)
    }

    @Test("Direct: after a join, a loss starts a fresh round of attempts, and when it is used up the attempts go on every 2 s for as long as the host is away (10 minutes here); back, it is joined")
    func directRejoins() {
        let e = PeerEndpoint(host: "127.0.0.1", port: 9)
        var m = JoinStateMachine(target: .direct(e), maximumAttempts: 2)
        _ = m.start(now: 0)
        _ = m.sessionState(host, .connected, now: 1)
        _ = m.sessionState(host, .notConnected, now: 2)
        #expect(m.tick(now: 300 * ms) == [.connect(e)])
        #expect(m.invitationFailed(nil, reason: "refused", now: 310 * ms).first == .announce("could not join 127.0.0.1:9: refused"))
        var now: UInt64 = 310 * ms
        var connects: [UInt64] = []
        var said: [JoinStateMachine.Action] = []
        while now < 600_000 * ms {
            now += 50 * ms
            let t = m.tick(now: now)
            guard !t.isEmpty else { continue }
            #expect(t == [.connect(e)])
            connects.append(now)
            said += m.invitationFailed(nil, reason: "refused", now: now + 10 * ms)
        }
        #expect(said == [.announce("cannot join 127.0.0.1:9: refused (2 attempts); trying every 2 s until it is back")])
        let gaps = zip(connects.dropFirst(), connects).map { $0 - $1 }
        #expect(gaps.dropFirst().allSatisfy { $0 >= 2_000 * ms && $0 <= 2_100 * ms }, "\(gaps.prefix(4))")
        #expect(connects.count > 290)
        #expect(m.sessionState(host, .connected, now: now + 20 * ms) == [.announce("joined \(host.displayName)")])
        #expect(m.phase == .joined(host.displayName))
    }

    @Test("Direct, past a round after a join: a new reason is said once (the host is back, but full); an answer 'already connected' (the host still holds this player's link from before the loss) is one more attempt, where before the first join, or from another host at the address, it ends the join")
    func directAfterARoundSaysNewReasonsAndRetriesAlreadyConnected() {
        let e = PeerEndpoint(host: "127.0.0.1", port: 9)
        var fresh = JoinStateMachine(target: .direct(e), maximumAttempts: 2)
        _ = fresh.start(now: 0)
        #expect(fresh.invitationFailed(nil, reason: "already connected", permanent: true, alreadyConnected: true, now: 1)
                == [.giveUp("already connected")], "another player runs under this identity")
        var m = JoinStateMachine(target: .direct(e), maximumAttempts: 2)
        _ = m.start(now: 0)
        _ = m.sessionState(host, .connected, now: 1)
        _ = m.sessionState(host, .notConnected, now: 2)
        var now: UInt64 = 2
        var said: [JoinStateMachine.Action] = []
        for reason in ["refused", "refused", "refused", "host is full", "host is full", "already connected"] {
            var t: [JoinStateMachine.Action] = []
            while t.isEmpty { now += 50 * ms; t = m.tick(now: now) }
            #expect(t == [.connect(e)])
            said += m.invitationFailed(nil, reason: reason, permanent: reason == "already connected",
                                       alreadyConnected: reason == "already connected", now: now + 10 * ms)
        }
        #expect(said == [.announce("could not join 127.0.0.1:9: refused"),
                         .announce("cannot join 127.0.0.1:9: refused (2 attempts); trying every 2 s until it is back"),
                         .announce("still cannot join 127.0.0.1:9: host is full"),
                         .announce("still cannot join 127.0.0.1:9: already connected")])
        #expect(m.phase == .searching, "not stopped")
        var t: [JoinStateMachine.Action] = []
        while t.isEmpty { now += 50 * ms; t = m.tick(now: now) }
        #expect(t == [.connect(e)])
        #expect(m.sessionState(host, .connected, now: now + 10 * ms) == [.announce("joined \(host.displayName)")])
        // Another host at the address, known by its first frame, where another player runs under this identity.
        _ = m.sessionState(host, .notConnected, now: now + 20 * ms)
        t = []
        while t.isEmpty { now += 50 * ms; t = m.tick(now: now) }
        #expect(m.invitationFailed(other, reason: "already connected", permanent: true, alreadyConnected: true, now: now + 10 * ms)
                == [.giveUp("already connected")])
    }

    @Test("Any host, after a join: 'already connected' from the host last joined (its old link) is retried; from another host (a second player under this identity is there) it is that host's answer alone")
    func alreadyConnectedIsOwnOldLinkOnlyAtTheHostLastJoined() {
        var m = anyHostOfTwo()   // kitchen invited first
        _ = m.sessionState(host, .connected, now: 1)
        _ = m.sessionState(host, .notConnected, now: 2)
        #expect(m.tick(now: 300 * ms) == [.announce("found host garage; joining"), .invite(other)], "the other host first")
        #expect(m.invitationFailed(other, reason: "garage: already connected", permanent: true, alreadyConnected: true, now: 310 * ms)
                == [.announce("garage: already connected; trying another host"), .announce("found host kitchen; joining"), .invite(host)])
        #expect(m.invitationFailed(host, reason: "kitchen: already connected", permanent: true, alreadyConnected: true, now: 320 * ms)
                == [.announce("could not join kitchen: kitchen: already connected")], "its own old link: tried again")
        #expect(m.found(other, now: 330 * ms) == [], "garage is not invited again in this run")
        var t: [JoinStateMachine.Action] = []
        var now: UInt64 = 320 * ms
        while t.isEmpty { now += 50 * ms; t = m.tick(now: now) }
        #expect(t == [.announce("found host kitchen; joining"), .invite(host)])
    }

    @Test("Direct by name: a name that does not resolve ends the join before the first; after it (the host rebooting takes its .local name with it) it is one more failed attempt")
    func directUnresolvableName() {
        let e = PeerEndpoint(host: "kitchen.local", port: 7000)
        var fresh = JoinStateMachine(target: .direct(e), maximumAttempts: 5)
        _ = fresh.start(now: 0)
        #expect(fresh.invitationFailed(nil, reason: "no such name", unresolvable: true, now: 1) == [.giveUp("no such name")])
        var m = JoinStateMachine(target: .direct(e), maximumAttempts: 2)
        _ = m.start(now: 0)
        _ = m.sessionState(host, .connected, now: 1)
        _ = m.sessionState(host, .notConnected, now: 2)
        #expect(m.tick(now: 300 * ms) == [.connect(e)])
        #expect(m.invitationFailed(nil, reason: "no such name", unresolvable: true, now: 310 * ms)
                == [.announce("could not join kitchen.local:7000: no such name")])
        #expect(m.tick(now: 2 * 1_000 * ms) == [.connect(e)], "tried again")
        // The round's attempts used up: it says so once, and goes on every 2 s (a host that was joined is away, not
        // a mistake).
        #expect(m.invitationFailed(nil, reason: "no such name", unresolvable: true, now: 2_100 * ms)
                == [.announce("cannot join kitchen.local:7000: no such name (2 attempts); trying every 2 s until it is back")])
        #expect(m.tick(now: 4_000 * ms) == [])
        #expect(m.tick(now: 4_100 * ms) == [.connect(e)])
        #expect(m.invitationFailed(nil, reason: "no such name", unresolvable: true, now: 4_200 * ms) == [], "said once")
        #expect(m.phase == .searching)
        // The host is back before that: joined again.
        var back = JoinStateMachine(target: .direct(e), maximumAttempts: 5)
        _ = back.start(now: 0)
        _ = back.sessionState(host, .connected, now: 1)
        _ = back.sessionState(host, .notConnected, now: 2)
        _ = back.tick(now: 300 * ms)
        _ = back.invitationFailed(nil, reason: "no such name", unresolvable: true, now: 310 * ms)
        #expect(back.tick(now: 2_000 * ms) == [.connect(e)])
        #expect(back.sessionState(host, .connected, now: 2_010 * ms) == [.announce("joined \(host.displayName)")])
    }

    @Test("A paired host goes by the name it was paired under: --host matches it, announcements and the phase use it")
    func pairedHostGoesByPairedName() throws {
        let renamed = try PeerID(displayName: "nursery")
        var m = JoinStateMachine(target: .discover(hostName: "Kitchen"))
        _ = m.start(now: 0)
        #expect(m.found(renamed, pairedName: "kitchen", now: 1) == [.announce("found host kitchen; joining"), .invite(renamed)])
        #expect(m.phase == .joining("kitchen"))
        #expect(m.sessionState(renamed, .connected, now: 2) == [.announce("joined kitchen")])
        #expect(m.phase == .joined("kitchen"))
        #expect(m.name(of: renamed) == "kitchen")
        #expect(m.lost(renamed) == [])
        #expect(m.name(of: renamed) == "kitchen", "the host joined keeps its name when its record goes")
        #expect(m.sessionState(renamed, .notConnected, now: 3) == [.announce("host kitchen went away; searching again")])
        #expect(m.name(of: renamed) == "nursery", "a host neither found nor joined is forgotten")
    }

    @Test("A paired host that advertises another paired host's name is not joined by that name; its key prefix still names it")
    func pairedImpostorIsNotMatchedByName() throws {
        let impostor = try PeerID(displayName: "kitchen")
        let real = try PeerID(displayName: "kitchen-2")
        #expect(!JoinStateMachine.matches(impostor, pairedName: "garage", name: "kitchen"))
        #expect(JoinStateMachine.matches(impostor, pairedName: nil, name: "kitchen"), "a host that is not paired goes by its own name")
        let prefix = String(try #require(impostor.publicKey).shortFingerprint.prefix(6))
        #expect(JoinStateMachine.matches(impostor, pairedName: "garage", name: prefix))
        // A host paired under a name that happens to be (or was ground to be) another's key prefix: the name picks
        // the host paired under it alone.
        #expect(!JoinStateMachine.matches(impostor, pairedName: "garage", name: prefix, nameIsPaired: true))
        #expect(JoinStateMachine.matches(real, pairedName: prefix, name: prefix.uppercased(), nameIsPaired: true))
        #expect(!JoinStateMachine.matches(impostor, pairedName: nil, name: "kitchen", nameIsPaired: true),
                "nor by its advertised name")
        var byPrefix = JoinStateMachine(target: .discover(hostName: prefix))
        _ = byPrefix.start(now: 0)
        #expect(byPrefix.found(impostor, pairedName: "garage", nameIsPaired: true, now: 1) == [])
        #expect(byPrefix.found(real, pairedName: prefix, nameIsPaired: true, now: 2) == [.announce("found host \(prefix); joining"), .invite(real)])

        var m = JoinStateMachine(target: .discover(hostName: "kitchen"))
        _ = m.start(now: 0)
        #expect(m.found(impostor, pairedName: "garage", now: 1) == [])
        #expect(m.phase == .searching)
        #expect(m.found(real, pairedName: "kitchen", now: 2) == [.announce("found host kitchen; joining"), .invite(real)])
    }

    @Test("Direct: the name a host was paired under, learned on connecting, names it")
    func directLearnsPairedName() throws {
        let e = PeerEndpoint(host: "127.0.0.1", port: 9)
        let renamed = try PeerID(displayName: "nursery")
        var m = JoinStateMachine(target: .direct(e))
        _ = m.start(now: 0)
        #expect(m.sessionState(renamed, .connected, pairedName: "kitchen", now: 1) == [.announce("joined kitchen")])
        #expect(m.phase == .joined("kitchen"))
        #expect(m.sessionState(renamed, .notConnected, now: 2) == [.announce("host kitchen went away; searching again")])
    }
}

@Suite("Relay packets fit PeerMesh datagrams")
struct PacketSizeTests {
    @Test func anAudioPacketFitsOneEncryptedDatagram() {
        #expect(AudioPacket.maximumSize == Session.maximumDatagramSize)
    }
}
