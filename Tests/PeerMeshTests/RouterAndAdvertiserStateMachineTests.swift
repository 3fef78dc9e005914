import Testing
import MeshPOSIX
@testable import PeerMesh

private let bob = try! PeerID(displayName: "bob", identity: 0xb0b)
private let carol = try! PeerID(displayName: "carol", identity: 0xca201)
private let me = try! PeerID(displayName: "me", identity: 0x3e)
private let bobAddress = SocketAddress(numericHost: "10.0.0.2", port: 5000)!
private func open(_ link: LinkID) -> Result<DatagramBody, DatagramDrop> { .success(.data) }

private func header(_ token: UInt64, _ seq: UInt64, _ kind: DatagramHeader.Kind = .data) -> DatagramHeader {
    DatagramHeader(kind: kind, token: token, sequence: seq)
}

@Suite("DatagramRouter: which datagrams are believed (pure)")
struct DatagramRouterTests {
    private func router(latches: Bool = true) -> DatagramRouter {
        var r = DatagramRouter()
        r.routeUp(link: 1, peer: bob, localToken: 77, remoteToken: 88, remote: bobAddress, latches: latches, now: 0)
        return r
    }

    @Test func dataFromThePeerIsDelivered() {
        var r = router()
        let (v, e) = r.received(header(77, 1), from: bobAddress, now: 10_000_000, open: open)
        #expect(v == .deliver(bob))
        #expect(e == DatagramRouter.Effects(latched: false, proofOfLife: 1))
    }

    @Test func unknownTokenOrOtherHostIsAStranger() {
        var r = router()
        #expect(r.received(header(78, 1), from: bobAddress, now: 1, open: open).0 == .drop(.stranger))
        let elsewhere = SocketAddress(numericHost: "10.0.0.3", port: 5000)!
        var opened = 0
        let (v, _) = r.received(header(77, 1), from: elsewhere, now: 1) { _ in opened += 1; return .success(.data) }
        #expect(v == .drop(.stranger))
        #expect(opened == 0, "a stranger's datagram is never even opened")
    }

    @Test func anUnauthenticDatagramChangesNothing() {
        var r = router()
        let moved = bobAddress.with(port: 6000)
        let (v, e) = r.received(header(77, 1 << 63), from: moved, now: 5_000_000) { _ in .failure(.unauthentic) }
        #expect(v == .drop(.unauthentic))
        #expect(e == DatagramRouter.Effects())
        // The replay window did not move (sequence 1 is still new) and the address did not latch.
        #expect(r.received(header(77, 1), from: bobAddress, now: 6_000_000, open: open).0 == .deliver(bob))
        #expect(r.route(for: 1)?.remote == bobAddress)
    }

    @Test func duplicatesAreDropped() {
        var r = router()
        #expect(r.received(header(77, 5), from: bobAddress, now: 1, open: open).0 == .deliver(bob))
        #expect(r.received(header(77, 5), from: bobAddress, now: 2, open: open).0 == .drop(.duplicate))
        #expect(r.received(header(77, 4), from: bobAddress, now: 3, open: open).0 == .deliver(bob))
    }

    @Test func theInviteeLatchesTheInviterDoesNot() {
        var invitee = router(latches: true)
        let natted = bobAddress.with(port: 40_000)
        let (_, e) = invitee.received(header(77, 1), from: natted, now: 1, open: open)
        #expect(e.latched)
        #expect(invitee.route(for: 1)?.remote == natted)

        var inviter = router(latches: false)
        let (_, e2) = inviter.received(header(77, 1), from: natted, now: 1, open: open)
        #expect(!e2.latched)
        #expect(inviter.route(for: 1)?.remote == bobAddress)
    }

    @Test func onlyTheNewestDatagramLatches() {
        // Someone on the path holds back datagram 2 and lets it go, from another port, after 3 arrived: it is the
        // peer's, so it is delivered, but it must not move where the answers go.
        var r = router(latches: true)
        let held = bobAddress.with(port: 41_000)
        #expect(r.received(header(77, 1), from: bobAddress, now: 1, open: open).1.latched == false)
        #expect(r.received(header(77, 3), from: bobAddress, now: 2, open: open).1.latched == false)
        let (v, e) = r.received(header(77, 2), from: held, now: 3, open: open)
        #expect(v == .deliver(bob))
        #expect(!e.latched)
        #expect(r.route(for: 1)?.remote == bobAddress)
        // The peer's own next datagram from a new port (a NAT rebinding) latches as before.
        let rebound = bobAddress.with(port: 42_000)
        #expect(r.received(header(77, 4), from: rebound, now: 4, open: open).1.latched)
        #expect(r.route(for: 1)?.remote == rebound)
    }

    @Test func proofOfLifeAtMostOncePerMillisecond() {
        var r = router()
        #expect(r.received(header(77, 1), from: bobAddress, now: 2_000_000, open: open).1.proofOfLife == 1)
        #expect(r.received(header(77, 2), from: bobAddress, now: 2_500_000, open: open).1.proofOfLife == nil)
        #expect(r.received(header(77, 3), from: bobAddress, now: 3_100_000, open: open).1.proofOfLife == 1)
    }

    @Test func pingsAreAnsweredAndPongsMeasured() {
        var r = router()
        #expect(r.received(header(77, 1, .ping), from: bobAddress, now: 1) { _ in .success(.ping) }.0
                == .answerPing(to: bobAddress, token: 88, link: 1))
        let (v, _) = r.received(header(77, 2, .pong), from: bobAddress, now: 1_000_000) { _ in .success(.pong(sentAt: 200_000)) }
        #expect(v == .measured(link: 1, sample: 800_000, smoothed: 800_000))
        let (v2, _) = r.received(header(77, 3, .pong), from: bobAddress, now: 2_000_000) { _ in .success(.pong(sentAt: 1_600_000)) }
        #expect(v2 == .measured(link: 1, sample: 400_000, smoothed: 750_000))
        let (v3, _) = r.received(header(77, 4, .pong), from: bobAddress, now: 2_000_000) { _ in .success(.pong(sentAt: 9_000_000)) }
        #expect(v3 == .ignoredPong)
    }

    @Test func aRouteThatWentDownIsAStrangerAgain() {
        var r = router()
        #expect(r.routeDown(link: 1)?.peer == bob)
        #expect(r.routeDown(link: 1) == nil)
        #expect(r.received(header(77, 1), from: bobAddress, now: 1, open: open).0 == .drop(.stranger))
    }

    @Test func malformedBodiesAreCountedAsMalformed() {
        var r = router()
        let empty = UnsafeRawBufferPointer(start: nil, count: 0)
        #expect(r.received(header(77, 1), from: bobAddress, now: 1) { _ in DatagramBody.parse(kind: .data, payload: empty) }.0
                == .drop(.malformed))
        #expect(r.received(header(77, 1), from: bobAddress, now: 1, open: open).0 == .deliver(bob),
                "a malformed datagram does not consume its sequence number")
    }
}

@Suite("AdvertiserStateMachine: invitations, deadlines and limits (pure)")
struct AdvertiserStateMachineTests {
    private let sec: Nanos = 1_000_000_000
    private let hostA: [UInt8] = [10, 0, 0, 2]
    private let hostB: [UInt8] = [10, 0, 0, 3]

    private func machine(pending: Int = 64, perHost: Int = 8) -> AdvertiserStateMachine {
        AdvertiserStateMachine(configuration: .init(localPeer: me, greetingTimeout: 10 * sec, maximumInvitationWait: 60 * sec,
                                                     maximumPending: pending, maximumPendingPerHost: perHost))
    }

    private func invite(timeoutMillis: UInt32 = 5_000) -> ControlFrame.InviteBody {
        .init(context: [1, 2], timeoutMillis: timeoutMillis, udpPort: 9, token: 42)
    }

    @Test func helloThenInviteAsksTheApp() {
        var m = machine()
        #expect(m.accepted(1, host: hostA, now: 0) == .greet(1, .hello(peer: me), evicting: nil))
        #expect(m.received(.hello(peer: bob), on: 1, now: 1) == .wait)
        #expect(m.received(.invite(invite()), on: 1, now: 2) == .ask(1, bob, invite()))
        #expect(m.answered(1, .accept) == .handOver(1, bob, invite()))
        #expect(m.answered(1, .accept) == .ignore, "one answer only")
        #expect(m.pendingCount == 0)
    }

    @Test func aDeclineIsCarriedOut() {
        var m = machine()
        _ = m.accepted(1, host: hostA, now: 0)
        _ = m.received(.hello(peer: bob), on: 1, now: 0)
        _ = m.received(.invite(invite()), on: 1, now: 0)
        #expect(m.answered(1, .decline(.declined, "no")) == .decline(1, .declined, "no"))
    }

    @Test(arguments: [ControlFrame.invite(.init(context: [], timeoutMillis: 0, udpPort: 1, token: 1)), .data([1]), .accept(udpPort: 1, token: 1), .goodbye])
    func anythingButHelloFirstIsAFault(_ first: ControlFrame) {
        var m = machine()
        _ = m.accepted(1, host: hostA, now: 0)
        #expect(m.received(first, on: 1, now: 1) == .close(1, .unexpectedFrame(first.name)))
        #expect(m.pendingCount == 0)
    }

    @Test func ourOwnHelloIsRefused() {
        var m = machine()
        _ = m.accepted(1, host: hostA, now: 0)
        #expect(m.received(.hello(peer: me), on: 1, now: 1) == .close(1, .unexpectedFrame("our own HELLO")))
    }

    @Test func silentCallersAreClosedAndUnansweredInvitationsDeclined() {
        var m = machine()
        _ = m.accepted(1, host: hostA, now: 0)          // never speaks: 2 s to its first byte
        _ = m.accepted(3, host: hostA, now: 0)          // speaks, never finishes: 10 s (this machine's greeting time)
        m.heard(3, now: 0)
        _ = m.accepted(2, host: hostA, now: 0)
        m.heard(2, now: 0)
        _ = m.received(.hello(peer: bob), on: 2, now: 0)
        _ = m.received(.invite(invite(timeoutMillis: 3_000)), on: 2, now: sec) // asks until 4 s
        #expect(m.nextDeadline() == 2 * sec)
        #expect(m.expire(now: 2 * sec - 1) == [])
        #expect(m.expire(now: 2 * sec) == [.close(1)])
        #expect(m.expire(now: 4 * sec) == [.decline(2, .timedOut)])
        #expect(m.nextDeadline() == 10 * sec)
        #expect(m.expire(now: 10 * sec) == [.close(3)])
        #expect(m.answered(2, .accept) == .ignore, "a late answer changes nothing")
    }

    @Test func theInvitationWaitIsCappedAndZeroMeansThirtySeconds() {
        var m = machine()
        _ = m.accepted(1, host: hostA, now: 0)
        _ = m.received(.hello(peer: bob), on: 1, now: 0)
        _ = m.received(.invite(invite(timeoutMillis: 0)), on: 1, now: 0)
        #expect(m.nextDeadline() == 30 * sec)
        _ = m.accepted(2, host: hostA, now: 0)
        _ = m.received(.hello(peer: carol), on: 2, now: 0)
        _ = m.received(.invite(invite(timeoutMillis: 3_600_000)), on: 2, now: 0)
        #expect(m.expire(now: 60 * sec).contains(.decline(2, .timedOut)))
    }

    @Test func aWithdrawnInvitationIsForgotten() {
        var m = machine()
        _ = m.accepted(1, host: hostA, now: 0)
        _ = m.received(.hello(peer: bob), on: 1, now: 0)
        _ = m.received(.invite(invite()), on: 1, now: 0)
        m.closed(1)
        #expect(m.answered(1, .accept) == .ignore)
        #expect(m.nextDeadline() == nil)
    }

    @Test func atACapTheOldestHandshakeIsEvictedSilentOnesFirst() {
        var m = machine(pending: 3, perHost: 2)
        #expect(m.accepted(1, host: hostA, now: 0) == .greet(1, .hello(peer: me), evicting: nil))
        #expect(m.accepted(2, host: hostA, now: 1) == .greet(2, .hello(peer: me), evicting: nil))
        m.heard(1, now: 0)
        // A third from one host: the oldest *silent* one from that host goes (2), not the older live one (1).
        #expect(m.accepted(3, host: hostA, now: 2) == .greet(3, .hello(peer: me), evicting: 2))
        #expect(m.accepted(4, host: hostB, now: 3) == .greet(4, .hello(peer: me), evicting: nil))
        #expect(m.pendingCount == 3)
        // Full in all: a new one from a third host evicts the oldest silent one anywhere (3).
        #expect(m.accepted(5, host: [10, 0, 0, 4], now: 4) == .greet(5, .hello(peer: me), evicting: 3))
        #expect(!m.isFull, "handshaking connections never make the advertiser stop accepting")
    }

    @Test func invitationsTheAppHoldsAreNeverEvicted() {
        var m = machine(pending: 2, perHost: 2)
        for id in 1...2 {
            _ = m.accepted(id, host: hostA, now: 0)
            _ = m.received(.hello(peer: bob), on: id, now: 0)
            _ = m.received(.invite(invite()), on: id, now: 0)
        }
        #expect(m.isFull)
        #expect(m.accepted(3, host: hostB, now: 1) == .refuse(3))
        #expect(m.answered(1, .decline(.declined, "no")) == .decline(1, .declined, "no"))
        #expect(!m.isFull)
        #expect(m.accepted(4, host: hostB, now: 2) == .greet(4, .hello(peer: me), evicting: nil))
    }

    /// Accepts `id` from `host` at `now`, lets the caller speak (this side answers its message 1) and hang up.
    private func abandon(_ m: inout AdvertiserStateMachine, _ id: PendingID, from host: [UInt8], at now: Nanos) -> AdvertiserStateMachine.OnAccepted {
        let r = m.accepted(id, host: host, now: now)
        guard case .greet = r else { return r }
        m.heard(id, now: now)
        m.closed(id)
        return r
    }

    @Test func anAddressThatKeepsBreakingOffIsRationedOthersAreNot() {
        // What a man in the middle searching for matching digits does: speak, get message 2, hang up, again.
        var m = machine()
        for id in 1...16 {
            #expect(abandon(&m, id, from: hostA, at: 0) == .greet(id, .hello(peer: me), evicting: nil), "burst \(id)")
        }
        #expect(m.counters.unadmittedHandshakes == 16)
        // Sixteen at once: the 17th is refused until a second has paid one off.
        #expect(m.accepted(17, host: hostA, now: 0) == .refuse(17))
        #expect(m.accepted(18, host: hostA, now: sec - 1) == .refuse(18))
        #expect(m.accepted(19, host: hostB, now: sec - 1) == .greet(19, .hello(peer: me), evicting: nil), "another address is not")
        #expect(abandon(&m, 20, from: hostA, at: sec) == .greet(20, .hello(peer: me), evicting: nil))
        // Then one a second: trying every millisecond for the next 10 s (1 s … 11 s) gets 9 more tries (at 2 s … 10 s;
        // the one at 1 s was taken above), not thousands.
        var admitted = 0
        for k in 0..<10_000 {
            let now = sec + Nanos(k) * sec / 1_000
            if case .greet = abandon(&m, 100 + k, from: hostA, at: now) { admitted += 1 }
        }
        #expect(admitted == 9)
        #expect(m.counters.rationedConnections == 2 + 9_991)
        #expect(m.counters.unadmittedHandshakes == 16 + 1 + 9)
    }

    /// Accepts `id` from `host`, has it say HELLO and invite, and returns the machine asking the app.
    private func asking(_ m: inout AdvertiserStateMachine, _ id: PendingID, from host: [UInt8], timeoutMillis: UInt32 = 5_000) {
        _ = m.accepted(id, host: host, now: 0)
        m.heard(id, now: 0)
        _ = m.received(.hello(peer: bob), on: id, now: 0)
        _ = m.received(.invite(invite(timeoutMillis: timeoutMillis)), on: id, now: 0)
    }

    @Test func aTryIsForgivenOnlyWhenTheCallerNeverSpokeOrWasAdmitted() {
        var m = machine()
        // Silent callers (they never got message 2) and callers the session let in cost nothing: 80 from one address.
        for id in 1...40 {
            _ = m.accepted(id, host: hostA, now: 0)
            m.closed(id)
        }
        for id in 41...80 {
            asking(&m, id, from: hostA)
            #expect(m.answered(id, .accept) == .handOver(id, bob, invite()))
            #expect(m.rationKey(of: id) == nil, "handed over")
            m.admitted(rationKey: hostA)
        }
        #expect(m.counters.unadmittedHandshakes == 0)
        // Every other way a try can end keeps its charge, so a searcher cannot get its tries for free by reaching
        // the app: declined, withdrawn, its invitation timed out (1 ms), hung up after HELLO, broke the protocol, or
        // accepted by the app and then turned away by the session (no `admitted`).
        asking(&m, 100, from: hostB)
        _ = m.answered(100, .decline(.declined, "no"))
        asking(&m, 101, from: hostB)
        m.closed(101)
        asking(&m, 102, from: hostB, timeoutMillis: 1)
        _ = m.accepted(103, host: hostB, now: 0)
        m.heard(103, now: 0)
        _ = m.received(.hello(peer: bob), on: 103, now: 0)
        m.closed(103)
        _ = m.accepted(104, host: hostB, now: 0)
        m.heard(104, now: 0)
        #expect(m.received(.data([1]), on: 104, now: 0) == .close(104, .unexpectedFrame("DATA")))
        _ = m.accepted(105, host: hostB, now: 0)
        m.heard(105, now: 0)
        asking(&m, 106, from: hostB)
        #expect(m.rationKey(of: 106) == hostB)
        _ = m.answered(106, .accept)
        #expect(m.expire(now: 1_000_000) == [.decline(102, .timedOut)])
        #expect(m.counters.unadmittedHandshakes == 5)
        // Six spent, and one (105) still open and charged: nine more tries at once, not ten. Beyond 8 open from one
        // address each newcomer pushes out the oldest try (105, then 110), whose charge moves to it.
        var greeted = 0
        for id in 110...120 {
            guard case .greet = m.accepted(id, host: hostB, now: 1_000_000) else { continue }
            greeted += 1
            m.heard(id, now: 1_000_000)
        }
        #expect(greeted == 9)
        #expect(m.counters.unadmittedHandshakes == 5 + 2)
        // Silent callers cost nothing at all: an address's idle connections never use up its tries.
        var idle = machine()
        var refused = 0
        for id in 1...100 { if idle.accepted(id, host: hostA, now: 0) == .refuse(id) { refused += 1 } }
        #expect(refused == 0 && idle.counters.unadmittedHandshakes == 0)
    }

    @Test func aCallerThatNeverFinishesInTimeStaysCharged() {
        var c = AdvertiserStateMachine.Configuration(localPeer: me)
        c.tryBurst = 1
        var m = AdvertiserStateMachine(configuration: c)
        _ = m.accepted(1, host: hostA, now: 0)
        m.heard(1, now: 0)
        #expect(m.expire(now: c.greetingTimeout) == [.close(1)])
        #expect(m.counters.unadmittedHandshakes == 1)
        #expect(m.accepted(2, host: hostA, now: sec / 2) == .refuse(2), "its try is not paid off yet")
        #expect(m.accepted(3, host: hostA, now: sec) != .refuse(3))
        // A stop counts the tries still under way.
        m.heard(3, now: sec)
        _ = m.stop()
        #expect(m.counters.unadmittedHandshakes == 2)
    }

    /// A machine with one slot (in all, or per address) and a burst of `burst` tries, whose first caller, from A,
    /// has spoken.
    private func oneSlot(perAddress: Bool, burst: Int) -> AdvertiserStateMachine {
        var c = AdvertiserStateMachine.Configuration(localPeer: me)
        if perAddress { c.maximumPendingPerHost = 1 } else { c.maximumPending = 1 }
        c.tryBurst = burst
        var m = AdvertiserStateMachine(configuration: c)
        _ = m.accepted(1, host: hostA, now: 0)
        m.heard(1, now: 0)
        return m
    }

    @Test func anEvictionMovesTheChargeOnlyWithinOneAddress() {
        // Across addresses: the victim did get its answer and keeps its charge; whoever made room pays nothing.
        var m = oneSlot(perAddress: false, burst: 1)
        #expect(m.accepted(2, host: hostB, now: 0) == .greet(2, .hello(peer: me), evicting: 1))
        #expect(m.counters.unadmittedHandshakes == 1)
        #expect(m.accepted(3, host: hostA, now: 0) == .refuse(3), "A still owes its try")
        #expect(m.accepted(4, host: hostB, now: 0) == .greet(4, .hello(peer: me), evicting: 2), "B owes nothing for it")
        #expect(m.accepted(5, host: hostA, now: sec) == .greet(5, .hello(peer: me), evicting: 4))
        // Within one address it is a wash: two tries, one pushed out by the other, cost two.
        var w = oneSlot(perAddress: true, burst: 2)
        #expect(w.accepted(2, host: hostA, now: 0) == .greet(2, .hello(peer: me), evicting: 1))
        w.heard(2, now: 0)
        #expect(w.accepted(3, host: hostA, now: 0) == .refuse(3))
        #expect(w.accepted(4, host: hostA, now: sec) == .greet(4, .hello(peer: me), evicting: 2))
    }

    @Test func theRationTableStaysBoundedAndForgetsPaidDebtsFirst() {
        var c = AdvertiserStateMachine.Configuration(localPeer: me)
        c.maximumRationedHosts = 8
        c.tryBurst = 2
        var m = AdvertiserStateMachine(configuration: c)
        // Two tries from A (paid off at 2 s), then one each from 100 others (paid off at 1 s): at most 8 addresses are
        // kept (an overflow trims to 7), A, which owes most, among them.
        for id in 1...2 { _ = abandon(&m, id, from: hostA, at: 0) }
        for k in 0..<100 {
            _ = abandon(&m, 100 + k, from: [10, 1, 0, UInt8(k)], at: 0)
            #expect(m.rationedHostCount <= 8)
        }
        #expect(m.accepted(500, host: hostA, now: 0) == .refuse(500), "the address that owes most is remembered")
        // At 1.5 s the others have paid; A has not. New addresses until the table overflows: the paid go first, so
        // A and the newcomers are all that is left.
        var newcomers = 0
        let before = m.rationedHostCount
        while m.rationedHostCount >= before + newcomers, newcomers < 8 {
            newcomers += 1
            _ = abandon(&m, 600 + newcomers, from: [10, 2, 0, UInt8(newcomers)], at: 3 * sec / 2)
        }
        #expect(m.rationedHostCount == 1 + newcomers, "A and the \(newcomers) newcomers")
    }

    @Test func sharesOfTheDigitsOpenOneASecondInTheOrderShown() {
        var m = machine()
        for (id, host) in [(1, hostA), (2, hostB), (3, [10, 0, 0, 4] as [UInt8]), (4, [10, 0, 0, 5] as [UInt8])] {
            asking(&m, id, from: host, timeoutMillis: 60_000)
        }
        #expect(m.share(of: 1) == .held && m.nextDeadline() == 60 * sec, "nothing is opened unshown")
        #expect(m.revealRequested(1, now: 10 * sec) == .open(1))
        #expect(m.share(of: 1) == .opened)
        #expect(m.revealRequested(1, now: 10 * sec) == .wait, "shown twice: opened once, and no turn taken")
        // Two more shown within the second, from other addresses: each waits its turn, in the order shown.
        #expect(m.revealRequested(3, now: 10 * sec + 1) == .wait)
        #expect(m.revealRequested(2, now: 10 * sec + 2) == .wait)
        #expect(m.share(of: 3) == .queued && m.share(of: 2) == .queued)
        #expect(m.nextDeadline() == 11 * sec)
        #expect(m.expire(now: 11 * sec - 1) == [])
        #expect(m.expire(now: 11 * sec) == [.open(3)])
        #expect(m.nextDeadline() == 12 * sec)
        // The next in line hangs up before its turn: it frees the turn, and the one shown after it takes it.
        m.closed(2)
        #expect(m.nextDeadline() == 60 * sec, "no share waits")
        #expect(m.revealRequested(4, now: 11 * sec + sec / 2) == .wait, "within a second of the last opening")
        #expect(m.expire(now: 12 * sec) == [.open(4)])
        // A timer that fires late opens the next no earlier, and the one after waits a whole interval from then.
        asking(&m, 5, from: hostA, timeoutMillis: 60_000)
        asking(&m, 6, from: hostB, timeoutMillis: 60_000)
        #expect(m.revealRequested(5, now: 12 * sec + 1) == .wait)
        #expect(m.revealRequested(6, now: 12 * sec + 2) == .wait)
        #expect(m.expire(now: 20 * sec) == [.open(5)])
        #expect(m.expire(now: 20 * sec + 1) == [])
        #expect(m.expire(now: 21 * sec) == [.open(6)])
        // After a quiet second, a share shown opens at once.
        asking(&m, 7, from: hostA, timeoutMillis: 60_000)
        #expect(m.revealRequested(7, now: 22 * sec) == .open(7))
        #expect(m.revealRequested(99, now: 30 * sec) == .wait, "no such invitation")
    }

    @Test func sharesWaitingAreServedRoundRobinAcrossAddresses() {
        var m = machine()
        // Address A shows four invitations (the first opens at once), then B one: B waits one turn, not three.
        for id in 1...4 { asking(&m, id, from: hostA, timeoutMillis: 60_000) }
        asking(&m, 5, from: hostB, timeoutMillis: 60_000)
        #expect(m.revealRequested(1, now: 0) == .open(1))
        for id in 2...4 { #expect(m.revealRequested(id, now: 1) == .wait) }
        #expect(m.revealRequested(5, now: 2) == .wait)
        var order: [PendingID] = []
        for t in 1...4 {
            for e in m.expire(now: Nanos(t) * sec) { if case .open(let id) = e { order.append(id) } }
        }
        #expect(order == [2, 5, 3, 4])
        // A late timer: a share shown after its turn came but before the timer fired queues behind the waiting one.
        asking(&m, 6, from: hostA, timeoutMillis: 60_000)
        asking(&m, 7, from: hostB, timeoutMillis: 60_000)
        #expect(m.revealRequested(6, now: 4 * sec + 1) == .wait)
        #expect(m.revealRequested(7, now: 6 * sec) == .wait, "the turn is 6's, which waited")
        #expect(m.expire(now: 6 * sec + 1) == [.open(6)])
        #expect(m.expire(now: 7 * sec + 1) == [.open(7)])
    }

    @Test func anAddressThatShowsLaterWaitsOneTurnPerAddressAheadOfIt() {
        var m = machine()
        let hostC: [UInt8] = [10, 0, 0, 4]
        for (id, host) in [(1, hostA), (2, hostA), (3, hostB), (4, hostB), (5, hostC)] {
            asking(&m, id, from: host, timeoutMillis: 60_000)
        }
        #expect(m.revealRequested(1, now: 0) == .open(1))
        for id in 2...4 { #expect(m.revealRequested(id, now: 1) == .wait) }
        #expect(m.expire(now: sec) == [.open(2)])
        // C shows one while B has two waiting: one of B's goes first, then C's, then B's other.
        #expect(m.revealRequested(5, now: sec + 1) == .wait)
        #expect(m.expire(now: 2 * sec) == [.open(3)])
        #expect(m.expire(now: 3 * sec) == [.open(5)])
        #expect(m.expire(now: 4 * sec) == [.open(4)])
    }

    @Test func aShareWhoseInvitationTimesOutIsDeclinedNotOpened() {
        var m = machine()
        asking(&m, 1, from: hostA, timeoutMillis: 60_000)
        asking(&m, 2, from: hostB, timeoutMillis: 1_000)     // its invitation ends at 1 s, just as its turn comes
        asking(&m, 3, from: [10, 0, 0, 4], timeoutMillis: 60_000)
        #expect(m.revealRequested(1, now: 0) == .open(1))
        #expect(m.revealRequested(2, now: 1) == .wait)
        #expect(m.revealRequested(3, now: 2) == .wait)
        #expect(m.expire(now: sec) == [.decline(2, .timedOut), .open(3)])
    }

    @Test func aShareWaitingItsTurnIsNeverOpenedAfterItsInvitationEnds() {
        var m = machine()
        for id in 1...4 { asking(&m, id, from: [10, 0, 0, UInt8(id)], timeoutMillis: 60_000) }
        #expect(m.revealRequested(1, now: 0) == .open(1))
        for id in 2...4 { #expect(m.revealRequested(id, now: 1) == .wait) }
        #expect(m.answered(2, .accept) == .handOver(2, bob, invite(timeoutMillis: 60_000)), "the session opens it when it lets the caller in")
        #expect(m.answered(3, .decline(.declined, "no")) == .decline(3, .declined, "no"))
        #expect(m.share(of: 2) == nil && m.share(of: 3) == nil)
        #expect(m.expire(now: sec) == [.open(4)], "the answered ones are out of the queue")
        asking(&m, 5, from: hostA, timeoutMillis: 60_000)
        #expect(m.revealRequested(5, now: sec + 1) == .wait)
        #expect(m.stop() == [.decline(1, .unavailable), .decline(4, .unavailable), .decline(5, .unavailable)],
                "a stop opens nothing")
        #expect(m.nextDeadline() == nil)
    }

    @Test func stopDeclinesWhatTheAppHoldsAndClosesTheRest() {
        var m = machine()
        _ = m.accepted(1, host: hostA, now: 0)
        _ = m.accepted(2, host: hostB, now: 0)
        _ = m.received(.hello(peer: bob), on: 2, now: 0)
        _ = m.received(.invite(invite()), on: 2, now: 0)
        #expect(m.stop() == [.close(1), .decline(2, .unavailable)])
        #expect(m.accepted(3, host: hostA, now: 0) == .refuse(3))
    }
}
