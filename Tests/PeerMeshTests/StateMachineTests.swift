import Testing
import MeshTestSupport
@testable import PeerMesh

// Pure tests of SessionStateMachine: no sockets, virtual time (the Nanos values passed in).

private typealias SM = SessionStateMachine
private typealias Action = SessionStateMachine.Action

private let ms: Nanos = 1_000_000
private let sec: Nanos = 1_000_000_000

private func peer(_ name: String, _ id: UInt64) -> PeerID { try! PeerID(displayName: name, identity: id) }

private let me = peer("me", 0x50)
private let bob = peer("bob", 0x60)
private let carol = peer("carol", 0x70)
private let dave = peer("dave", 0x80)
private let erin = peer("erin", 0x90)

private func machine(_ local: PeerID = me, maximumPeers: Int = 8, timeout: Nanos = 10 * sec,
                     heartbeat: Nanos = 1 * sec) -> SM {
    SM(configuration: .init(localPeer: local, maximumPeers: maximumPeers, peerTimeout: timeout, heartbeatInterval: heartbeat))
}

private func invite(_ ctx: [UInt8] = [], timeout: Nanos = 5 * sec, port: UInt16 = 4000, token: UInt64 = 77) -> ControlFrame {
    .invite(.init(context: ctx, timeoutMillis: UInt32(timeout / ms), udpPort: port, token: token))
}

/// Starts an outgoing invitation from `m` to `p` on `link` and brings it to `connected`.
private func connectOutgoing(_ m: inout SM, link: LinkID, to p: PeerID, now: Nanos = 0) {
    _ = m.inviteStarted(link: link, expected: p, context: [], timeout: 5 * sec, localUDPPort: 4000, localToken: 1, now: now)
    _ = m.received(.hello(peer: p), on: link, now: now)
    _ = m.received(.accept(udpPort: 5000, token: 2), on: link, now: now)
    precondition(m.state(of: p) == .connected)
}

/// Accepts an incoming invitation from `p` on `link`.
private func connectIncoming(_ m: inout SM, link: LinkID, from p: PeerID, now: Nanos = 0) -> [Action] {
    m.invitationAccepted(link: link, from: p, remoteUDPPort: 6000, remoteToken: 3, acceptUDPPort: 4000, localToken: 4, now: now)
}

private func decline(_ link: LinkID, _ r: DeclineReason) -> [Action] { [.send(link, .decline(r, r.description)), .close(link)] }

/// Deterministic generator, so random tests replay exactly.
typealias SeededRNG = SeededRandom

@Suite struct StateMachineTests {

    // MARK: Inviter

    @Test("A message larger than this side takes closes the peer's link, however large a frame may be")
    func aMessageOverTheLimitIsAFault() {
        var m = SM(configuration: .init(localPeer: me, maximumPeers: 8, peerTimeout: 10 * sec, heartbeatInterval: 1 * sec,
                                        maximumMessageSize: 4))
        connectOutgoing(&m, link: 1, to: bob)
        #expect(m.received(.data([1, 2, 3, 4]), on: 1, now: 0) == [.deliver(bob, [1, 2, 3, 4])], "at the limit: taken")
        let over = m.received(.data([1, 2, 3, 4, 5]), on: 1, now: 0)
        #expect(over.first == .fault(1, .malformedFrame("a message of 5 bytes, over the 4 this side takes")))
        #expect(over.contains(.report(bob, .notConnected)) && over.contains(.close(1)), "\(over)")
        #expect(m.state(of: bob) == .notConnected)
    }

    @Test func inviterHappyPath() {
        var m = machine()
        let start = m.inviteStarted(link: 1, expected: bob, context: [1, 2, 3], timeout: 5 * sec,
                                    localUDPPort: 4000, localToken: 77, now: 0)
        #expect(start == [.send(1, .hello(peer: me)), .send(1, invite([1, 2, 3])), .report(bob, .connecting)])
        #expect(m.state(of: bob) == .connecting)
        #expect(m.nextDeadline() == 5 * sec)
        #expect(m.received(.hello(peer: bob), on: 1, now: 10 * ms) == [])
        #expect(m.state(of: bob) == .connecting)
        #expect(m.received(.accept(udpPort: 5000, token: 99), on: 1, now: 20 * ms)
                == [.linkUp(1, bob, remoteUDPPort: 5000, remoteToken: 99), .report(bob, .connected)])
        #expect(m.state(of: bob) == .connected)
        #expect(m.connectedPeers == [bob])
        #expect(m.primaryLink(for: bob) == 1)
        #expect(m.nextDeadline() == 20 * ms + 1 * sec) // next heartbeat
        // Data flows.
        #expect(m.received(.data([9, 8]), on: 1, now: 30 * ms) == [.deliver(bob, [9, 8])])
    }

    @Test func inviteTimeoutMillisClampsAndRounds() {
        var m = machine()
        let a = m.inviteStarted(link: 1, expected: nil, context: [], timeout: 1_999_999, localUDPPort: 1, localToken: 2, now: 0)
        #expect(a[1] == .send(1, .invite(.init(context: [], timeoutMillis: 1, udpPort: 1, token: 2))))
        let b = m.inviteStarted(link: 2, expected: nil, context: [], timeout: .max, localUDPPort: 1, localToken: 2, now: 0)
        #expect(b[1] == .send(2, .invite(.init(context: [], timeoutMillis: .max, udpPort: 1, token: 2))))
    }

    @Test func helloFromDifferentPeerMeansStaleAdvertisement() {
        var m = machine()
        _ = m.inviteStarted(link: 1, expected: bob, context: [], timeout: 5 * sec, localUDPPort: 4000, localToken: 77, now: 0)
        #expect(m.received(.hello(peer: carol), on: 1, now: 1)
                == [.fault(1, .wrongPeer), .close(1), .invitationFailed(1, bob, .unavailable), .report(bob, .notConnected)])
        #expect(m.state(of: bob) == .notConnected)
        #expect(m.state(of: carol) == .notConnected)
        #expect(m.nextDeadline() == nil)
        #expect(m.received(.accept(udpPort: 1, token: 1), on: 1, now: 2) == []) // link is gone
    }

    @Test func helloFromOurselvesFails() {
        var m = machine()
        _ = m.inviteStarted(link: 1, expected: nil, context: [], timeout: 5 * sec, localUDPPort: 4000, localToken: 77, now: 0)
        #expect(m.received(.hello(peer: me), on: 1, now: 1) == [.close(1), .invitationFailed(1, me, .unavailable)])
        #expect(m.inviteStarted(link: 2, expected: me, context: [], timeout: 5 * sec, localUDPPort: 1, localToken: 1, now: 0)
                == [.close(2), .invitationFailed(2, me, .unavailable)])
    }

    @Test(arguments: [DeclineReason.declined, .peerLimit, .timedOut, .alreadyConnected, .unavailable])
    func declineReportsThatReason(_ reason: DeclineReason) {
        var m = machine()
        _ = m.inviteStarted(link: 3, expected: bob, context: [], timeout: 5 * sec, localUDPPort: 4000, localToken: 77, now: 0)
        _ = m.received(.hello(peer: bob), on: 3, now: 1)
        #expect(m.received(.decline(reason, "no thanks"), on: 3, now: 2)
                == [.close(3), .invitationFailed(3, bob, reason), .report(bob, .notConnected)])
        #expect(m.state(of: bob) == .notConnected)
        #expect(m.nextDeadline() == nil)
    }

    @Test func timeoutBeforeHello() {
        var m = machine()
        _ = m.inviteStarted(link: 1, expected: bob, context: [], timeout: 5 * sec, localUDPPort: 4000, localToken: 77, now: 100)
        #expect(m.tick(now: 100 + 5 * sec - 1) == [])
        #expect(m.tick(now: 100 + 5 * sec) == [.close(1), .invitationFailed(1, bob, .timedOut), .report(bob, .notConnected)])
        #expect(m.tick(now: 100 + 6 * sec) == [])
    }

    @Test func timeoutBeforeReply() {
        var m = machine()
        _ = m.inviteStarted(link: 1, expected: bob, context: [], timeout: 5 * sec, localUDPPort: 4000, localToken: 77, now: 0)
        #expect(m.received(.hello(peer: bob), on: 1, now: 4 * sec) == [])
        #expect(m.tick(now: 5 * sec - 1) == [])
        #expect(m.tick(now: 5 * sec) == [.close(1), .invitationFailed(1, bob, .timedOut), .report(bob, .notConnected)])
    }

    @Test("A reach timeout: the peer must say HELLO within it; then its app has the rest of the invitation's timeout to answer")
    func reachTimeoutThenTheAnswersTime() {
        var m = SM(configuration: .init(localPeer: me, maximumPeers: 8, peerTimeout: 10 * sec, heartbeatInterval: 1 * sec,
                                        reachTimeout: 5 * sec))
        // Nothing answers at the address: failed at 5 s, not at the invitation's 60.
        let started = m.inviteStarted(link: 1, expected: bob, context: [], timeout: 60 * sec, localUDPPort: 4000, localToken: 77, now: 100)
        #expect(started.contains(.send(1, invite(timeout: 60 * sec))), "the INVITE carries the whole timeout: \(started)")
        #expect(m.nextDeadline() == 100 + 5 * sec)
        #expect(m.tick(now: 100 + 5 * sec - 1) == [])
        #expect(m.tick(now: 100 + 5 * sec) == [.close(1), .invitationFailed(1, bob, .timedOut), .report(bob, .notConnected)])
        // The peer says HELLO in time: its app may take until the invitation's own timeout to answer.
        _ = m.inviteStarted(link: 2, expected: bob, context: [], timeout: 60 * sec, localUDPPort: 4000, localToken: 77, now: 10 * sec)
        #expect(m.received(.hello(peer: bob), on: 2, now: 11 * sec) == [])
        #expect(m.nextDeadline() == 70 * sec)
        #expect(m.tick(now: 50 * sec) == [], "past the reach timeout, an answer is still awaited")
        #expect(m.received(.accept(udpPort: 5000, token: 2), on: 2, now: 59 * sec)
                == [.linkUp(2, bob, remoteUDPPort: 5000, remoteToken: 2), .report(bob, .connected)])
        // A reach timeout longer than the invitation's changes nothing; a timeout of .max never comes.
        var n = SM(configuration: .init(localPeer: me, maximumPeers: 8, peerTimeout: 10 * sec, heartbeatInterval: 1 * sec,
                                        reachTimeout: 30 * sec))
        _ = n.inviteStarted(link: 1, expected: carol, context: [], timeout: 5 * sec, localUDPPort: 4000, localToken: 77, now: 0)
        #expect(n.tick(now: 5 * sec) == [.close(1), .invitationFailed(1, carol, .timedOut), .report(carol, .notConnected)])
        _ = n.inviteStarted(link: 2, expected: carol, context: [], timeout: .max, localUDPPort: 4000, localToken: 77, now: 10)
        #expect(n.nextDeadline() == 10 + 30 * sec)
        _ = n.received(.hello(peer: carol), on: 2, now: 20)
        #expect(n.nextDeadline() == .max)
    }

    @Test func directConnectReportsConnectingOnlyAtHello() {
        var m = machine()
        #expect(m.inviteStarted(link: 1, expected: nil, context: [7], timeout: 5 * sec, localUDPPort: 4000, localToken: 77, now: 0)
                == [.send(1, .hello(peer: me)), .send(1, invite([7]))])
        #expect(m.state(of: bob) == .notConnected)
        #expect(m.received(.hello(peer: bob), on: 1, now: 1) == [.report(bob, .connecting)])
        #expect(m.received(.accept(udpPort: 5001, token: 5), on: 1, now: 2)
                == [.linkUp(1, bob, remoteUDPPort: 5001, remoteToken: 5), .report(bob, .connected)])
    }

    @Test func directConnectTimeoutHasNoPeer() {
        var m = machine()
        _ = m.inviteStarted(link: 1, expected: nil, context: [], timeout: 5 * sec, localUDPPort: 4000, localToken: 77, now: 0)
        #expect(m.tick(now: 5 * sec) == [.close(1), .invitationFailed(1, nil, .timedOut)])
    }

    @Test func directConnectToAlreadyConnectedPeer() {
        var m = machine()
        connectOutgoing(&m, link: 1, to: bob)
        _ = m.inviteStarted(link: 2, expected: nil, context: [], timeout: 5 * sec, localUDPPort: 4000, localToken: 77, now: 0)
        #expect(m.received(.hello(peer: bob), on: 2, now: 1) == [.close(2), .invitationFailed(2, bob, .alreadyConnected)])
        #expect(m.state(of: bob) == .connected)
        #expect(m.primaryLink(for: bob) == 1)
    }

    @Test func goodbyeWhileAwaitingReplyFailsTheInvitation() {
        var m = machine()
        _ = m.inviteStarted(link: 1, expected: bob, context: [], timeout: 5 * sec, localUDPPort: 4000, localToken: 77, now: 0)
        _ = m.received(.hello(peer: bob), on: 1, now: 1)
        #expect(m.received(.goodbye, on: 1, now: 2) == [.close(1), .invitationFailed(1, bob, .unavailable), .report(bob, .notConnected)])
    }

    @Test func linkClosedWhileInvitingFailsTheInvitation() {
        var m = machine()
        _ = m.inviteStarted(link: 1, expected: bob, context: [], timeout: 5 * sec, localUDPPort: 4000, localToken: 77, now: 0)
        #expect(m.linkClosed(1) == [.close(1), .invitationFailed(1, bob, .unavailable), .report(bob, .notConnected)])
        #expect(m.linkClosed(1) == [])
    }

    // MARK: Invitee

    @Test func inviteeAcceptsAndConnects() {
        var m = machine()
        let a = m.invitationAccepted(link: 7, from: bob, remoteUDPPort: 6000, remoteToken: 55,
                                     acceptUDPPort: 4001, localToken: 66, now: 3 * sec)
        #expect(a == [.report(bob, .connecting), .send(7, .accept(udpPort: 4001, token: 66)),
                      .linkUp(7, bob, remoteUDPPort: 6000, remoteToken: 55), .report(bob, .connected)])
        #expect(m.connectedPeers == [bob])
        #expect(m.primaryLink(for: bob) == 7)
        #expect(m.nextDeadline() == 4 * sec)
    }

    @Test func inviteeRejectsItself() {
        var m = machine()
        #expect(connectIncoming(&m, link: 1, from: me) == decline(1, .unavailable))
    }

    // MARK: Simultaneous invitations

    /// The higher identity accepts the lower one's invitation; its own invitation is declined.
    @Test func simultaneousInviteLowerIdentityWins() {
        // `me` (0x50) is lower than bob (0x60): me declines bob's invitation, keeps its own.
        var low = machine(me)
        _ = low.inviteStarted(link: 1, expected: bob, context: [], timeout: 5 * sec, localUDPPort: 1, localToken: 1, now: 0)
        #expect(connectIncoming(&low, link: 2, from: bob) == decline(2, .simultaneousInvite))
        #expect(low.state(of: bob) == .connecting)
        // Also after HELLO (awaiting reply).
        _ = low.received(.hello(peer: bob), on: 1, now: 1)
        #expect(connectIncoming(&low, link: 3, from: bob) == decline(3, .simultaneousInvite))

        // bob (higher) accepts me's invitation although it has its own pending.
        var high = machine(bob)
        _ = high.inviteStarted(link: 1, expected: me, context: [], timeout: 5 * sec, localUDPPort: 1, localToken: 1, now: 0)
        #expect(connectIncoming(&high, link: 2, from: me)
                == [.send(2, .accept(udpPort: 4000, token: 4)), .linkUp(2, me, remoteUDPPort: 6000, remoteToken: 3),
                    .report(me, .connected)])
        // Its own invitation is then declined; nothing changes for the peer.
        _ = high.received(.hello(peer: me), on: 1, now: 1)
        #expect(high.received(.decline(.simultaneousInvite, "x"), on: 1, now: 2)
                == [.close(1), .invitationFailed(1, me, .simultaneousInvite)])
        #expect(high.state(of: me) == .connected)
        #expect(high.primaryLink(for: me) == 2)
    }

    /// A decline that comes after the peer connected by the winning invitation leaves no yield behind: a later loss of
    /// that link is `notConnected` at once (a loss the mesh may mend), not `connecting` until the yield runs out.
    @Test func aLateDeclineLeavesNoYield() {
        var high = machine(bob)
        _ = high.inviteStarted(link: 1, expected: me, context: [], timeout: 5 * sec, localUDPPort: 1, localToken: 1, now: 0)
        _ = connectIncoming(&high, link: 2, from: me)
        _ = high.received(.hello(peer: me), on: 1, now: 1)
        #expect(high.received(.decline(.simultaneousInvite, "x"), on: 1, now: 2)
                == [.close(1), .invitationFailed(1, me, .simultaneousInvite)])
        #expect(high.linkClosed(2) == [.linkDown(2, me, .lost), .close(2), .report(me, .notConnected)])
    }

    /// A fault the driver found (a mesh, relay, resource or stream frame against the rules, a garbage stream) closes
    /// the link by choice: GOODBYE to a connected peer, and not lost.
    @Test func aFaultTheDriverFoundClosesByChoice() {
        var m = machine()
        connectOutgoing(&m, link: 1, to: bob)
        #expect(m.closeForFault(1) == [.linkDown(1, bob, .fault), .send(1, .goodbye), .close(1), .report(bob, .notConnected)])
        #expect(m.closeForFault(1) == [])
        _ = m.inviteStarted(link: 2, expected: carol, context: [], timeout: sec, localUDPPort: 1, localToken: 1, now: 0)
        #expect(m.closeForFault(2) == [.close(2), .invitationFailed(2, carol, .unavailable), .report(carol, .notConnected)])
    }

    /// The decline can overtake the winning invitation (different TCP connections): the peer stays connecting.
    @Test func simultaneousDeclineBeforeWinningInvitation() {
        var high = machine(bob)
        _ = high.inviteStarted(link: 1, expected: me, context: [], timeout: 5 * sec, localUDPPort: 1, localToken: 1, now: 0)
        _ = high.received(.hello(peer: me), on: 1, now: 1)
        #expect(high.received(.decline(.simultaneousInvite, "x"), on: 1, now: 2)
                == [.close(1), .invitationFailed(1, me, .simultaneousInvite)])
        #expect(high.state(of: me) == .connecting)
        #expect(high.nextDeadline() == 5 * sec)
        #expect(high.tick(now: 5 * sec - 1) == [])
        #expect(connectIncoming(&high, link: 2, from: me, now: 3 * sec)
                == [.send(2, .accept(udpPort: 4000, token: 4)), .linkUp(2, me, remoteUDPPort: 6000, remoteToken: 3),
                    .report(me, .connected)])
        #expect(high.tick(now: 5 * sec) == [.send(2, .heartbeat)]) // no report: the deadline no longer matters
        #expect(high.state(of: me) == .connected)
    }

    @Test func simultaneousWinningInvitationNeverArrives() {
        var high = machine(bob)
        _ = high.inviteStarted(link: 1, expected: me, context: [], timeout: 5 * sec, localUDPPort: 1, localToken: 1, now: 0)
        _ = high.received(.hello(peer: me), on: 1, now: 1)
        _ = high.received(.decline(.simultaneousInvite, "x"), on: 1, now: 2)
        #expect(high.tick(now: 5 * sec) == [.report(me, .notConnected)])
        #expect(high.nextDeadline() == nil)
        #expect(high.tick(now: 6 * sec) == [])

        var other = machine(bob)
        _ = other.inviteStarted(link: 1, expected: me, context: [], timeout: 5 * sec, localUDPPort: 1, localToken: 1, now: 0)
        _ = other.received(.hello(peer: me), on: 1, now: 1)
        _ = other.received(.decline(.simultaneousInvite, "x"), on: 1, now: 2)
        #expect(other.disconnect() == [.report(me, .notConnected)])
        #expect(other.tick(now: 6 * sec) == [])
    }

    // MARK: Held between attempts

    /// The driver tries a peer's addresses one after another: the app hears `connecting` once, then `connected` or
    /// `notConnected` once, however many attempts fail on the way.
    @Test func aPeerHeldBetweenAttemptsIsReportedOnceEachWay() {
        var m = machine()
        let first = m.inviteStarted(link: 1, expected: bob, context: [], timeout: 5 * sec, localUDPPort: 1, localToken: 1, now: 0)
        #expect(first.last == .report(bob, .connecting))
        #expect(m.hold(bob, until: 6 * sec) == [], "already connecting: nothing to report")
        // The first address refuses: the link goes, the peer stays connecting.
        #expect(m.linkClosed(1) == [.close(1), .invitationFailed(1, bob, .unavailable)])
        #expect(m.state(of: bob) == .connecting)
        // The second address: no second `connecting`; it connects.
        let second = m.inviteStarted(link: 2, expected: bob, context: [], timeout: 5 * sec, localUDPPort: 1, localToken: 1, now: sec)
        #expect(!second.contains { if case .report = $0 { true } else { false } })
        _ = m.received(.hello(peer: bob), on: 2, now: sec)
        #expect(m.received(.accept(udpPort: 5000, token: 2), on: 2, now: sec)
                == [.linkUp(2, bob, remoteUDPPort: 5000, remoteToken: 2), .report(bob, .connected)])
        #expect(m.release(bob) == [], "connecting cleared the hold")
        // Gone again: nothing holds it any more.
        #expect(m.linkClosed(2) == [.linkDown(2, bob, .lost), .close(2), .report(bob, .notConnected)])

        // Every address fails: `notConnected` comes once, when the driver releases the peer.
        var n = machine()
        _ = n.inviteStarted(link: 1, expected: carol, context: [], timeout: 5 * sec, localUDPPort: 1, localToken: 1, now: 0)
        _ = n.hold(carol, until: 6 * sec)
        #expect(n.tick(now: 5 * sec) == [.close(1), .invitationFailed(1, carol, .timedOut)], "timed out, still held")
        #expect(n.state(of: carol) == .connecting)
        #expect(n.release(carol) == [.report(carol, .notConnected)])
        #expect(n.release(carol) == [])

        // A driver that never comes back: the hold's own deadline ends it.
        var o = machine()
        #expect(o.hold(dave, until: 2 * sec) == [.report(dave, .connecting)], "a hold alone reports connecting (a call through an introducer)")
        #expect(o.nextDeadline() == 2 * sec)
        #expect(o.tick(now: 2 * sec - 1) == [])
        #expect(o.tick(now: 2 * sec) == [.report(dave, .notConnected)])
        #expect(o.nextDeadline() == nil)

        // A tick that comes late finds the invitation timed out and the hold's deadline passed: the hold waits for
        // the driver, who hears of the timeout in that tick's actions; the next tick ends it if it did nothing.
        var late = machine()
        _ = late.inviteStarted(link: 1, expected: carol, context: [], timeout: 5 * sec, localUDPPort: 1, localToken: 1, now: 0)
        _ = late.hold(carol, until: 6 * sec)
        #expect(late.tick(now: 7 * sec) == [.close(1), .invitationFailed(1, carol, .timedOut)])
        #expect(late.isHeld(carol))
        #expect(late.tick(now: 7 * sec) == [.report(carol, .notConnected)])

        // A simultaneous invite's wait is the machine's own: the driver's release leaves it.
        var high = machine(bob)
        _ = high.inviteStarted(link: 1, expected: me, context: [], timeout: 5 * sec, localUDPPort: 1, localToken: 1, now: 0)
        _ = high.hold(me, until: 6 * sec)
        _ = high.received(.hello(peer: me), on: 1, now: 1)
        #expect(high.received(.decline(.simultaneousInvite, "x"), on: 1, now: 2)
                == [.close(1), .invitationFailed(1, me, .simultaneousInvite)])
        #expect(high.release(me) == [], "still waiting for the peer's own invitation")
        #expect(high.state(of: me) == .connecting)

        // The app's disconnect ends a hold at once.
        _ = o.hold(dave, until: 9 * sec)
        #expect(o.disconnect(dave) == [.report(dave, .notConnected)])
        _ = o.hold(erin, until: 9 * sec)
        #expect(o.disconnect() == [.report(erin, .notConnected)])
        #expect(o.nextDeadline() == nil)
    }

    /// A hold counts against the peer limit like the invitation it stands for, and never takes a place there is not.
    @Test func aHoldTakesAPlaceOnlyWhenThereIsOne() {
        var m = machine(maximumPeers: 3)
        #expect(m.hold(bob, until: 9 * sec) == [.report(bob, .connecting)])
        #expect(m.hold(carol, until: 9 * sec) == [.report(carol, .connecting)])
        #expect(m.hold(dave, until: 9 * sec) == [], "full: not held")
        #expect(m.state(of: dave) == .notConnected)
        #expect(m.inviteStarted(link: 1, expected: dave, context: [], timeout: 5 * sec, localUDPPort: 1, localToken: 1, now: 0)
                == [.close(1), .invitationFailed(1, dave, .peerLimit)])
        #expect(m.hold(me, until: 9 * sec) == [], "never ourselves")
        #expect(m.release(bob) == [.report(bob, .notConnected)])
        #expect(m.hold(dave, until: 9 * sec) == [.report(dave, .connecting)], "a place is free again")
        // A connected peer is not held: it is already better than connecting.
        var n = machine()
        connectOutgoing(&n, link: 1, to: bob)
        #expect(n.hold(bob, until: 9 * sec) == [])
        #expect(n.nextDeadline() != 9 * sec)
    }

    @Test(arguments: [(UInt64(0x10), UInt64(0x20)), (UInt64(0x20), UInt64(0x10))])
    func simultaneousInviteBetweenTwoMachines(_ ids: (UInt64, UInt64)) {
        let a = peer("a", ids.0), b = peer("b", ids.1)
        let lower = a.identity < b.identity ? 0 : 1
        var reasons: [DeclineReason: Int] = [:]
        for seed in UInt64(0)..<400 {
            var sim = TwoPeerSim(a: a, b: b, seed: seed)
            sim.run()
            // Exactly one connection, carrying the lower identity's invitation, connected on both ends.
            let live = sim.conns.indices.filter { sim.conns[$0].connectedOn == [true, true] }
            #expect(live.count == 1, "seed \(seed)")
            if let c = live.first { #expect(sim.conns[c].inviter == lower, "seed \(seed)") }
            #expect(sim.m[0].connectedPeers == [b], "seed \(seed)")
            #expect(sim.m[1].connectedPeers == [a], "seed \(seed)")
            #expect(sim.states[0] == [.connecting, .connected], "seed \(seed): a saw \(sim.states[0])")
            #expect(sim.states[1] == [.connecting, .connected], "seed \(seed): b saw \(sim.states[1])")
            // The higher identity's invitation failed, once, saying why; the lower one's never did.
            #expect(sim.failures.count == 1 && sim.failures[0].0 == 1 - lower, "seed \(seed): \(sim.failures)")
            for f in sim.failures { reasons[f.1, default: 0] += 1 }
        }
        #expect(Set(reasons.keys).isSubset(of: [.simultaneousInvite, .alreadyConnected]))
        #expect(reasons[.simultaneousInvite, default: 0] > 0)
    }

    // MARK: Goodbye, EOF, heartbeats, liveness

    @Test func goodbyeReportsNotConnectedOnce() {
        var m = machine()
        connectOutgoing(&m, link: 1, to: bob)
        #expect(m.received(.goodbye, on: 1, now: 1)
                == [.linkDown(1, bob, .chosen), .send(1, .goodbye), .close(1), .report(bob, .notConnected)])
        #expect(m.received(.goodbye, on: 1, now: 2) == [])
        #expect(m.linkClosed(1) == [])
        #expect(m.connectedPeers == [])
        #expect(m.primaryLink(for: bob) == nil)
    }

    @Test func endOfFileReportsNotConnected() {
        var m = machine()
        _ = connectIncoming(&m, link: 4, from: bob)
        #expect(m.linkClosed(4) == [.linkDown(4, bob, .lost), .close(4), .report(bob, .notConnected)])
        #expect(m.linkClosed(4) == [])
        #expect(m.tick(now: 100 * sec) == [])
    }

    @Test func heartbeatAtTheIntervalNotBefore() {
        var m = machine(heartbeat: 1 * sec)
        _ = connectIncoming(&m, link: 1, from: bob, now: 0)
        #expect(m.tick(now: 1 * sec - 1) == [])
        #expect(m.tick(now: 1 * sec) == [.send(1, .heartbeat)])
        #expect(m.tick(now: 1 * sec) == [])
        #expect(m.tick(now: 1500 * ms) == [])
        #expect(m.nextDeadline() == 2 * sec)
        #expect(m.tick(now: 2 * sec + 5) == [.send(1, .heartbeat)])
        #expect(m.nextDeadline() == 3 * sec + 5)
    }

    @Test func heartbeatLossDropsThePeer() {
        var m = machine(timeout: 10 * sec, heartbeat: 1 * sec)
        _ = connectIncoming(&m, link: 1, from: bob, now: 0)
        for s in 1..<10 { #expect(m.tick(now: Nanos(s) * sec) == [.send(1, .heartbeat)]) }
        #expect(m.tick(now: 10 * sec - 1) == [])
        #expect(m.tick(now: 10 * sec) == [.linkDown(1, bob, .lost), .close(1), .report(bob, .notConnected)])
        #expect(m.tick(now: 11 * sec) == [])
    }

    @Test func datagramKeepsThePeerAlive() {
        var m = machine(timeout: 10 * sec, heartbeat: 1 * sec)
        _ = connectIncoming(&m, link: 1, from: bob, now: 0)
        m.heardDatagram(on: 1, now: 9 * sec)
        m.heardDatagram(on: 99, now: 9 * sec) // unknown link: ignored
        #expect(m.tick(now: 10 * sec) == [.send(1, .heartbeat)])
        #expect(m.state(of: bob) == .connected)
        #expect(m.nextDeadline() == 11 * sec)
        #expect(m.tick(now: 19 * sec - 1) == [.send(1, .heartbeat)])
        #expect(m.tick(now: 19 * sec) == [.linkDown(1, bob, .lost), .close(1), .report(bob, .notConnected)])
    }

    @Test(arguments: [ControlFrame.heartbeat, .data([1])])
    func receivedFramesResetLiveness(_ frame: ControlFrame) {
        var m = machine(timeout: 10 * sec, heartbeat: 1 * sec)
        _ = connectIncoming(&m, link: 1, from: bob, now: 0)
        _ = m.received(frame, on: 1, now: 8 * sec)
        #expect(m.tick(now: 17 * sec) == [.send(1, .heartbeat)])
        #expect(m.tick(now: 18 * sec) == [.linkDown(1, bob, .lost), .close(1), .report(bob, .notConnected)])
    }

    @Test func datagramDoesNotRescueAPendingInvitation() {
        var m = machine()
        _ = m.inviteStarted(link: 1, expected: bob, context: [], timeout: 5 * sec, localUDPPort: 4000, localToken: 77, now: 0)
        m.heardDatagram(on: 1, now: 4 * sec)
        #expect(m.tick(now: 5 * sec) == [.close(1), .invitationFailed(1, bob, .timedOut), .report(bob, .notConnected)])
    }

    /// The driver reads the clock on several threads: a link accepted "later" than the tick's time must not wrap
    /// `now - lastHeard` around and be dropped at once.
    @Test func tickWithSlightlyEarlierClockKeepsFreshLink() {
        var m = machine(timeout: 10 * sec, heartbeat: 1 * sec)
        _ = connectIncoming(&m, link: 1, from: bob, now: 5 * sec)
        #expect(m.tick(now: 5 * sec - 1) == [])
        #expect(m.state(of: bob) == .connected)
        _ = m.received(.heartbeat, on: 1, now: 7 * sec)
        #expect(m.tick(now: 6 * sec) == [.send(1, .heartbeat)])
        #expect(m.state(of: bob) == .connected)
    }

    // MARK: Peer limit

    @Test func peerLimitDeclinesTheThirdRemote() {
        var m = machine(maximumPeers: 3)
        _ = connectIncoming(&m, link: 1, from: bob)
        _ = connectIncoming(&m, link: 2, from: carol)
        #expect(connectIncoming(&m, link: 3, from: dave) == decline(3, .peerLimit))
        #expect(m.state(of: dave) == .notConnected)
        #expect(m.inviteStarted(link: 4, expected: erin, context: [], timeout: sec, localUDPPort: 1, localToken: 1, now: 0)
                == [.close(4), .invitationFailed(4, erin, .peerLimit)])
        #expect(m.inviteStarted(link: 5, expected: nil, context: [], timeout: sec, localUDPPort: 1, localToken: 1, now: 0)
                == [.close(5), .invitationFailed(5, nil, .peerLimit)])
        // A slot frees up: the next one fits.
        _ = m.linkClosed(2)
        #expect(connectIncoming(&m, link: 6, from: dave).last == .report(dave, .connected))
        #expect(Set(m.connectedPeers) == [bob, dave])
    }

    @Test func pendingInvitationsCountAgainstTheLimit() {
        var m = machine(maximumPeers: 3)
        _ = connectIncoming(&m, link: 1, from: bob)
        _ = m.inviteStarted(link: 2, expected: carol, context: [], timeout: sec, localUDPPort: 1, localToken: 1, now: 0)
        #expect(connectIncoming(&m, link: 3, from: dave) == decline(3, .peerLimit))
        // A second invitation to a peer already counted is not limited.
        #expect(m.inviteStarted(link: 4, expected: carol, context: [], timeout: sec, localUDPPort: 1, localToken: 1, now: 0)
                == [.send(4, .hello(peer: me)), .send(4, invite(timeout: sec, port: 1, token: 1))])
    }

    @Test func directConnectsCheckTheLimitAtHello() {
        var m = machine(maximumPeers: 3)
        _ = connectIncoming(&m, link: 1, from: bob)
        _ = m.inviteStarted(link: 2, expected: nil, context: [], timeout: sec, localUDPPort: 1, localToken: 1, now: 0)
        _ = m.inviteStarted(link: 3, expected: nil, context: [], timeout: sec, localUDPPort: 1, localToken: 1, now: 0)
        #expect(m.received(.hello(peer: carol), on: 2, now: 1) == [.report(carol, .connecting)])
        #expect(m.received(.hello(peer: dave), on: 3, now: 1) == [.close(3), .invitationFailed(3, dave, .peerLimit)])
        #expect(m.state(of: dave) == .notConnected)
    }

    @Test func defaultLimitAllowsSevenRemotes() {
        var m = machine(maximumPeers: 8)
        for i in 1...7 {
            #expect(connectIncoming(&m, link: i, from: peer("p\(i)", UInt64(1000 + i))).last == .report(peer("p", UInt64(1000 + i)), .connected))
        }
        #expect(m.connectedPeers.count == 7)
        #expect(connectIncoming(&m, link: 8, from: peer("p8", 1008)) == decline(8, .peerLimit))
        #expect(m.inviteStarted(link: 9, expected: peer("p9", 1009), context: [], timeout: sec, localUDPPort: 1, localToken: 1, now: 0)
                == [.close(9), .invitationFailed(9, peer("p9", 1009), .peerLimit)])
    }

    // MARK: Already connected, disconnect, protocol violations

    @Test func secondInvitationFromConnectedPeerDeclined() {
        var m = machine()
        _ = connectIncoming(&m, link: 1, from: bob)
        #expect(connectIncoming(&m, link: 2, from: bob) == decline(2, .alreadyConnected))
        #expect(m.inviteStarted(link: 3, expected: bob, context: [], timeout: sec, localUDPPort: 1, localToken: 1, now: 0)
                == [.close(3), .invitationFailed(3, bob, .alreadyConnected)])
        #expect(m.primaryLink(for: bob) == 1)
    }

    @Test func acceptWhileAlreadyConnectedKeepsTheFirstLink() {
        // erin (0x90) is higher than bob (0x60), so erin accepts bob's invitation although its own is pending.
        var h = machine(erin)
        _ = h.inviteStarted(link: 1, expected: nil, context: [], timeout: sec, localUDPPort: 1, localToken: 1, now: 0)
        _ = h.received(.hello(peer: bob), on: 1, now: 0)
        #expect(connectIncoming(&h, link: 2, from: bob).last == .report(bob, .connected))
        #expect(h.received(.accept(udpPort: 1, token: 1), on: 1, now: 1) == [.send(1, .goodbye), .close(1)])
        #expect(h.primaryLink(for: bob) == 2)
        #expect(h.state(of: bob) == .connected)
    }

    @Test func disconnectSaysGoodbyeAndReportsEveryPeerOnce() {
        var m = machine()
        connectOutgoing(&m, link: 1, to: bob)
        _ = connectIncoming(&m, link: 2, from: carol)
        _ = m.inviteStarted(link: 3, expected: dave, context: [], timeout: sec, localUDPPort: 1, localToken: 1, now: 0)
        _ = m.inviteStarted(link: 4, expected: erin, context: [], timeout: sec, localUDPPort: 1, localToken: 1, now: 0)
        _ = m.received(.hello(peer: erin), on: 4, now: 0)
        #expect(m.disconnect() == [
            .linkDown(1, bob, .chosen), .send(1, .goodbye), .close(1),
            .linkDown(2, carol, .chosen), .send(2, .goodbye), .close(2),
            .close(3), .invitationFailed(3, dave, .unavailable),
            .send(4, .goodbye), .close(4), .invitationFailed(4, erin, .unavailable),
            .report(bob, .notConnected), .report(carol, .notConnected), .report(dave, .notConnected), .report(erin, .notConnected),
        ])
        #expect(m.disconnect() == [])
        #expect(m.connectedPeers == [])
        #expect(m.nextDeadline() == nil)
        #expect(m.tick(now: 100 * sec) == [])
        for p in [bob, carol, dave, erin] { #expect(m.state(of: p) == .notConnected) }
    }

    @Test func unexpectedFramesCloseTheLink() {
        var m = machine()
        _ = m.inviteStarted(link: 1, expected: bob, context: [], timeout: sec, localUDPPort: 1, localToken: 1, now: 0)
        _ = m.received(.hello(peer: bob), on: 1, now: 0)
        #expect(m.received(.data([1]), on: 1, now: 1)
                == [.fault(1, .unexpectedFrame("DATA")), .close(1), .invitationFailed(1, bob, .unavailable), .report(bob, .notConnected)])

        _ = m.inviteStarted(link: 2, expected: bob, context: [], timeout: sec, localUDPPort: 1, localToken: 1, now: 0)
        #expect(m.received(.accept(udpPort: 1, token: 1), on: 2, now: 1) // ACCEPT before HELLO
                == [.fault(2, .unexpectedFrame("ACCEPT")), .close(2), .invitationFailed(2, bob, .unavailable), .report(bob, .notConnected)])

        _ = m.inviteStarted(link: 3, expected: bob, context: [], timeout: sec, localUDPPort: 1, localToken: 1, now: 0)
        #expect(m.received(invite(), on: 3, now: 1)
                == [.fault(3, .unexpectedFrame("INVITE")), .close(3), .invitationFailed(3, bob, .unavailable), .report(bob, .notConnected)])

        _ = connectIncoming(&m, link: 4, from: carol)
        #expect(m.received(.hello(peer: carol), on: 4, now: 1)
                == [.fault(4, .unexpectedFrame("HELLO")), .linkDown(4, carol, .fault), .send(4, .goodbye), .close(4), .report(carol, .notConnected)])
        _ = connectIncoming(&m, link: 5, from: carol)
        #expect(m.received(.accept(udpPort: 1, token: 1), on: 5, now: 1)
                == [.fault(5, .unexpectedFrame("ACCEPT")), .linkDown(5, carol, .fault), .send(5, .goodbye), .close(5), .report(carol, .notConnected)])
        #expect(m.received(.data([1]), on: 42, now: 1) == [])
    }

    // MARK: Property: every change reported exactly once, in order

    @Test func randomEventsReportEveryChangeExactlyOnce() {
        for seed in UInt64(1)...5 { randomRun(seed: seed, events: 2000) }
    }

    private func randomRun(seed: UInt64, events: Int) {
        var rng = SeededRNG(seed: seed)
        let peers = (1...5).map { peer("p\($0)", UInt64(0x100 * $0)) }
        let local = peer("local", 0x250) // between p2 and p3: both simultaneous-invite orders occur
        let maximum = 4
        var m = machine(local, maximumPeers: maximum, timeout: 10 * sec, heartbeat: 1 * sec)
        var now: Nanos = 0
        var nextLink = 1
        var open: Set<LinkID> = []
        var outgoing: Set<LinkID> = []
        var up: Set<LinkID> = []
        var closed: Set<LinkID> = []
        var failed: Set<LinkID> = []
        var seq: [PeerID: [SessionState]] = [:]

        func anyPeer() -> PeerID {
            let r = Int.random(in: 0..<20, using: &rng)
            return r == 0 ? local : peers[r % peers.count]
        }
        func anyLink() -> LinkID { open.isEmpty || Int.random(in: 0..<10, using: &rng) == 0 ? 999 : open.randomElement(using: &rng)! }
        func frame() -> ControlFrame {
            switch Int.random(in: 0..<10, using: &rng) {
            case 0, 1: .hello(peer: anyPeer())
            case 2: invite()
            case 3, 4: .accept(udpPort: 1, token: 2)
            case 5: .decline([.declined, .simultaneousInvite, .peerLimit, .alreadyConnected].randomElement(using: &rng)!, "")
            case 6: .data([1])
            case 7, 8: .heartbeat
            default: .goodbye
            }
        }

        for step in 0..<events {
            var actions: [Action] = []
            let ctx = "seed \(seed) step \(step)"
            switch Int.random(in: 0..<100, using: &rng) {
            case 0..<18:
                let l = nextLink; nextLink += 1
                let expected: PeerID? = Int.random(in: 0..<4, using: &rng) == 0 ? nil : anyPeer()
                actions = m.inviteStarted(link: l, expected: expected, context: [], timeout: 3 * sec,
                                          localUDPPort: 1, localToken: 1, now: now)
                open.insert(l); outgoing.insert(l)
            case 18..<30:
                let l = nextLink; nextLink += 1
                actions = m.invitationAccepted(link: l, from: anyPeer(), remoteUDPPort: 1, remoteToken: 1,
                                               acceptUDPPort: 1, localToken: 1, now: now)
                open.insert(l)
            case 30..<70:
                let l = anyLink()
                actions = m.received(frame(), on: l, now: now)
                if closed.contains(l) || l == 999 { #expect(actions == [], "\(ctx): frame on a closed link") }
            case 70..<75:
                m.heardDatagram(on: anyLink(), now: now)
            case 75..<82:
                actions = m.linkClosed(anyLink())
            case 82..<99:
                now += Nanos.random(in: 0...(3 * sec), using: &rng)
                actions = m.tick(now: now)
            default:
                actions = m.disconnect()
            }

            for a in actions {
                switch a {
                case .report(let p, let s):
                    #expect(p != local, "\(ctx): reported ourselves")
                    let last = seq[p]?.last ?? .notConnected
                    #expect(last != s, "\(ctx): \(p) reported \(s) twice in a row")
                    seq[p, default: []].append(s)
                case .send(let l, _):
                    #expect(!closed.contains(l), "\(ctx): send on closed link \(l)")
                case .close(let l):
                    #expect(!closed.contains(l), "\(ctx): link \(l) closed twice")
                    #expect(!up.contains(l), "\(ctx): link \(l) closed while still up")
                    closed.insert(l); open.remove(l)
                case .linkUp(let l, _, _, _):
                    #expect(!up.contains(l) && !closed.contains(l), "\(ctx): link \(l) up twice")
                    up.insert(l)
                case .linkDown(let l, _, _):
                    #expect(up.contains(l), "\(ctx): link \(l) down without up")
                    up.remove(l)
                case .deliver, .resource, .stream, .mesh, .relay, .deliverDatagram:
                    break
                case .fault(let l, _):
                    #expect(!closed.contains(l), "\(ctx): fault on closed link \(l)")
                case .invitationFailed(let l, _, _):
                    #expect(outgoing.contains(l), "\(ctx): failure for a link we did not invite on")
                    #expect(!failed.contains(l), "\(ctx): invitation on \(l) failed twice")
                    failed.insert(l)
                }
            }
            // The machine's view agrees with what it reported.
            for p in peers + [local] {
                #expect(m.state(of: p) == (seq[p]?.last ?? .notConnected), "\(ctx): state of \(p)")
                #expect((m.primaryLink(for: p) != nil) == (m.state(of: p) == .connected), "\(ctx): primary link of \(p)")
            }
            #expect(Set(m.connectedPeers) == Set(peers.filter { seq[$0]?.last == .connected }), "\(ctx)")
            let busy = peers.filter { (seq[$0]?.last ?? .notConnected) != .notConnected }.count
            #expect(busy <= maximum - 1, "\(ctx): \(busy) peers busy, limit \(maximum)")
        }
        // Every peer's sequence starts with a change away from notConnected and never repeats a state.
        for (p, s) in seq {
            #expect(s.first != .notConnected, "\(p): \(s)")
            #expect(zip(s, s.dropFirst()).allSatisfy { $0 != $1 }, "\(p): \(s)")
        }
        #expect(seq.values.map(\.count).reduce(0, +) > 100, "the run exercised few transitions")
        #expect(seq.values.contains { $0.contains(.connected) })
    }
}

/// Two state machines and the "network" between them, with advertisers modelled by hand. Frames on one TCP
/// connection arrive in order; different connections, app decisions and EOFs interleave at random (seeded).
private struct TwoPeerSim {
    struct Conn {
        var inviter: Int
        var inviterLink: LinkID
        /// The invitee session's link once its app accepted (adopted); before that its advertiser holds it.
        var inviteeLink: LinkID?
        var toInvitee: [ControlFrame?] = [] // nil = EOF
        var toInviter: [ControlFrame?] = []
        var closed = [false, false]          // by inviter side, invitee side
        var advertiserHello: PeerID?
        var advertiserInvite: ControlFrame.InviteBody?
        var connectedOn = [false, false]      // index 0 = peer a's side, 1 = b's
        var invitee: Int { 1 - inviter }
    }

    var ids: [PeerID]
    var m: [SessionStateMachine]
    var rng: SeededRNG
    var conns: [Conn] = []
    var states: [[SessionState]] = [[], []]
    var failures: [(Int, DeclineReason)] = []
    var now: Nanos = 0
    var nextLink = [1, 1]
    var started = [false, false]

    init(a: PeerID, b: PeerID, seed: UInt64) {
        ids = [a, b]
        m = [a, b].map {
            SessionStateMachine(configuration: .init(localPeer: $0, maximumPeers: 8, peerTimeout: 10 * sec, heartbeatInterval: 1 * sec))
        }
        rng = SeededRNG(seed: seed)
    }

    mutating func apply(_ side: Int, _ actions: [SessionStateMachine.Action]) {
        for a in actions {
            switch a {
            case .report(let p, let s):
                precondition(p == ids[1 - side])
                states[side].append(s)
            case .send(let l, let f):
                let (c, asInviter) = conn(side, l)
                if conns[c].closed[asInviter ? 0 : 1] { continue }
                if asInviter { conns[c].toInvitee.append(f) } else { conns[c].toInviter.append(f) }
            case .close(let l):
                let (c, asInviter) = conn(side, l)
                conns[c].closed[asInviter ? 0 : 1] = true
                if asInviter { conns[c].toInvitee.append(nil) } else { conns[c].toInviter.append(nil) }
                conns[c].connectedOn[side] = false
            case .linkUp(let l, _, _, _):
                conns[conn(side, l).0].connectedOn[side] = true
            case .linkDown(let l, _, _):
                conns[conn(side, l).0].connectedOn[side] = false
            case .deliver, .fault, .resource, .stream, .mesh, .relay, .deliverDatagram:
                break
            case .invitationFailed(_, _, let r):
                failures.append((side, r))
            }
        }
    }

    func conn(_ side: Int, _ link: LinkID) -> (Int, Bool) {
        if let c = conns.firstIndex(where: { $0.inviter == side && $0.inviterLink == link }) { return (c, true) }
        return (conns.firstIndex(where: { $0.invitee == side && $0.inviteeLink == link })!, false)
    }

    enum Step { case start(Int), toInvitee(Int), toInviter(Int), appAccepts(Int) }

    mutating func enabled() -> [Step] {
        var out: [Step] = []
        // Both invitations start before anything is delivered: they cross.
        for s in 0..<2 where !started[s] { out.append(.start(s)) }
        if !out.isEmpty { return out }
        for (i, c) in conns.enumerated() {
            if !c.toInvitee.isEmpty { out.append(.toInvitee(i)) }
            if !c.toInviter.isEmpty { out.append(.toInviter(i)) }
            if c.inviteeLink == nil, c.advertiserInvite != nil, !c.closed[1] { out.append(.appAccepts(i)) }
        }
        return out
    }

    mutating func run() {
        while true {
            let steps = enabled()
            guard let step = steps.randomElement(using: &rng) else { break }
            now += Nanos.random(in: 0...(20 * ms), using: &rng)
            switch step {
            case .start(let s):
                started[s] = true
                let l = nextLink[s]; nextLink[s] += 1
                conns.append(Conn(inviter: s, inviterLink: l))
                // The invitee's advertiser says HELLO as soon as it accepts the TCP connection.
                conns[conns.count - 1].toInviter.append(.hello(peer: ids[1 - s]))
                apply(s, m[s].inviteStarted(link: l, expected: ids[1 - s], context: [], timeout: 5 * sec,
                                            localUDPPort: 1, localToken: 1, now: now))
            case .toInvitee(let c):
                let f = conns[c].toInvitee.removeFirst()
                let side = conns[c].invitee
                if conns[c].closed[1] { continue }
                if let l = conns[c].inviteeLink {
                    apply(side, f.map { m[side].received($0, on: l, now: now) } ?? m[side].linkClosed(l))
                } else {
                    switch f {
                    case .hello(let p)?: conns[c].advertiserHello = p
                    case .invite(let body)?: conns[c].advertiserInvite = body
                    default: // the advertiser drops the half-open invitation
                        conns[c].closed[1] = true
                        conns[c].toInviter.append(nil)
                    }
                }
            case .toInviter(let c):
                let f = conns[c].toInviter.removeFirst()
                let side = conns[c].inviter
                if conns[c].closed[0] { continue }
                let l = conns[c].inviterLink
                apply(side, f.map { m[side].received($0, on: l, now: now) } ?? m[side].linkClosed(l))
            case .appAccepts(let c):
                let side = conns[c].invitee
                let l = nextLink[side]; nextLink[side] += 1
                conns[c].inviteeLink = l
                let body = conns[c].advertiserInvite!
                apply(side, m[side].invitationAccepted(link: l, from: conns[c].advertiserHello!, remoteUDPPort: body.udpPort,
                                                       remoteToken: body.token, acceptUDPPort: 1, localToken: 1, now: now))
            }
        }
    }
}
