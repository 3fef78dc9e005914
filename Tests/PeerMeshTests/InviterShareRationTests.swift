import Testing
import MeshPOSIX
@testable import PeerMesh

private let sec: Nanos = 1_000_000_000

/// The tests' time zero.
private let t = 100 * sec
/// Addresses invited.
private let a: [UInt8] = [10, 0, 0, 1], b: [UInt8] = [10, 0, 0, 2], c: [UInt8] = [10, 0, 0, 3]
/// The peers the handshakes proved they reach: `far` for every test but the one about peers that connect meanwhile.
private let far = try! PeerID(displayName: "far", identity: 0xfa2), near = try! PeerID(displayName: "near", identity: 0x2ea2)

/// A ration of 3 at once, then one a second.
private func ration() -> InviterShareRation { InviterShareRation(configuration: .init(burst: 3, interval: sec)) }

/// A ration whose whole burst links 1, 2 and 3 opened at `t`, unanswered so far.
private func burstGivenAway() -> InviterShareRation {
    var r = ration()
    for link in 1...3 { #expect(r.approved(link, peer: far, destination: a, now: t) == .open) }
    return r
}

@Suite("InviterShareRation: the inviter's shares of the digits given away unanswered (pure, virtual time)")
struct InviterShareRationTests {
    @Test func theBurstOpensAtOnceThenOneASecondOldestFirst() {
        #expect(ration().nextDeadline() == nil)
        var r = burstGivenAway()
        // Three given away and none answered: the next ones wait, in the order approved.
        #expect(r.approved(4, peer: far, destination: a, now: t) == .wait)
        #expect(r.approved(5, peer: far, destination: a, now: t + 1) == .wait)
        #expect(r.waitingCount == 2)
        #expect(r.nextDeadline() == t + sec)
        #expect(r.expire(now: t + sec - 1) == [])
        #expect(r.expire(now: t + sec) == [4])
        #expect(r.nextDeadline() == t + 2 * sec)
        // A timer that fires late opens one, and the next is due a whole interval after the late one was due: the
        // pace is one a second on average, not one a second after each timer.
        #expect(r.expire(now: t + 2 * sec + sec / 2) == [5])
        #expect(r.waitingCount == 0 && r.nextDeadline() == nil)
        #expect(r.approved(6, peer: far, destination: a, now: t + 2 * sec + sec / 2) == .wait)
        #expect(r.nextDeadline() == t + 3 * sec)
    }

    @Test func unansweredSharesStayChargedWhetherDeclinedClosedOrTimedOut() {
        var r = burstGivenAway()
        // Every one ends unaccepted (a man in the middle that learned our digits and let each fail).
        for link in 1...3 { r.ended(link) }
        #expect(r.approved(4, peer: far, destination: a, now: t) == .wait, "ending does not give the charge back")
        #expect(r.expire(now: t + sec) == [4])
        r.ended(4)
        // A man in the middle that keeps failing them gets one a second, however fast the app re-invites.
        var opened: [Nanos] = []
        var now = t + sec
        var link = 5
        var approving = true
        while now <= t + 11 * sec {
            let went = approving ? r.approved(link, peer: far, destination: a, now: now) == .open : r.expire(now: now) == [link]
            approving = went
            if went {
                opened.append(now)
                r.ended(link)
                link += 1
            }
            now += sec / 100
        }
        #expect(opened.count == 10, "\(opened)")
        #expect(zip(opened, opened.dropFirst()).allSatisfy { $1 - $0 >= sec }, "\(opened)")
    }

    @Test func anAcceptedInvitationIsForgivenAndLetsTheNextGoAtOnce() {
        var r = burstGivenAway()
        #expect(r.approved(4, peer: far, destination: a, now: t) == .wait)
        #expect(r.approved(5, peer: far, destination: a, now: t) == .wait)
        // Link 2 is accepted: its charge is forgiven, and the oldest waiting one goes at once.
        #expect(r.accepted(2, now: t + 10) == [4])
        #expect(r.waitingCount == 1)
        // Accepting one that was never charged (or twice) forgives nothing.
        #expect(r.accepted(2, now: t + 20) == [])
        #expect(r.accepted(99, now: t + 20) == [])
        #expect(r.accepted(1, now: t + 30) == [5])
        // A session whose invitations are all accepted never waits: a mesh of many members joining at once.
        var s = ration()
        for link in 1...100 {
            #expect(s.approved(link, peer: far, destination: a, now: t + Nanos(link)) == .open)
            #expect(s.accepted(link, now: t + Nanos(link)) == [])
        }
        // And accepted ones make room in the burst only for charges not yet paid off: idle time pays the rest.
        var u = burstGivenAway()
        for link in 1...3 { u.ended(link) }
        for link in 4...6 { #expect(u.approved(link, peer: far, destination: a, now: t + 10 * sec) == .open, "a quiet ten seconds paid the debt") }
    }

    @Test func acceptingForgivesOnlyWhatOfTheChargeIsStillUnpaid() {
        var r = burstGivenAway()  // charges paid off at t + 1 s, t + 2 s and t + 3 s
        #expect(r.approved(4, peer: far, destination: a, now: t + sec + sec / 2) == .open, "half a second past the first charge's turn")
        #expect(r.approved(5, peer: far, destination: a, now: t + sec + sec / 2) == .wait)
        // Link 1's charge was paid off by time already: accepting it now frees nothing, so 5 still waits.
        #expect(r.accepted(1, now: t + sec + sec / 2) == [])
        // Link 2's was half paid: accepting it gives back that half, which is what 5 lacked.
        #expect(r.accepted(2, now: t + sec + sec / 2) == [5])
        #expect(r.waitingCount == 0)
    }

    @Test func forgivingOneChargeMovesTheLaterOnesUpSoNoneIsForgivenTwice() {
        var r = ration()
        #expect(r.approved(1, peer: far, destination: a, now: t) == .open)
        #expect(r.approved(2, peer: far, destination: a, now: t) == .open)
        // 1 is accepted at once: as if never charged, 2's charge is now the only one, paid off at t + 1 s.
        #expect(r.accepted(1, now: t) == [])
        for link in 3...5 { #expect(r.approved(link, peer: far, destination: a, now: t + sec) == .open) }
        #expect(r.approved(6, peer: far, destination: a, now: t + sec) == .wait)
        // So accepting 2 at t + 1 s gives nothing back, and 6 still waits (four unanswered shares at once otherwise).
        #expect(r.accepted(2, now: t + sec) == [])
        #expect(r.waitingCount == 1)
    }

    @Test func waitingLinksAreServedRoundRobinAcrossAddresses() {
        var r = burstGivenAway()
        // Address a fails three more and keeps them waiting; then an invitation to b: it waits one turn, not three.
        for link in 4...6 { #expect(r.approved(link, peer: far, destination: a, now: t) == .wait) }
        #expect(r.approved(7, peer: far, destination: b, now: t + 1) == .wait)
        #expect(r.expire(now: t + sec) == [4])
        #expect(r.expire(now: t + 2 * sec) == [7])
        // One to c shown after b's turn: it waits behind the next of a, whose round came first.
        #expect(r.approved(8, peer: far, destination: c, now: t + 2 * sec) == .wait)
        #expect(r.expire(now: t + 3 * sec) == [5])
        #expect(r.expire(now: t + 4 * sec) == [8])
        #expect(r.expire(now: t + 5 * sec) == [6])
    }

    @Test func anAddressThatComesLaterWaitsOneTurnPerAddressAheadOfIt() {
        var r = burstGivenAway()
        #expect(r.approved(4, peer: far, destination: a, now: t) == .wait)
        #expect(r.approved(5, peer: far, destination: b, now: t) == .wait)
        #expect(r.approved(6, peer: far, destination: b, now: t) == .wait)
        #expect(r.expire(now: t + sec) == [4])
        // c comes while b has two waiting: one of b's goes first, then c's, then b's other.
        #expect(r.approved(7, peer: far, destination: c, now: t + sec) == .wait)
        #expect(r.expire(now: t + 2 * sec) == [5])
        #expect(r.expire(now: t + 3 * sec) == [7])
        #expect(r.expire(now: t + 4 * sec) == [6])
        // An address whose earlier waiting links ended keeps its place for the one left: b's newcomer waits behind it.
        for link in 8...11 { #expect(r.approved(link, peer: far, destination: a, now: t + 4 * sec) == .wait) }
        for link in 8...10 { r.ended(link) }
        #expect(r.approved(12, peer: far, destination: b, now: t + 4 * sec) == .wait)
        #expect(r.waitingCount == 2)
        #expect(r.expire(now: t + 5 * sec) == [11])
        #expect(r.expire(now: t + 6 * sec) == [12])
    }

    @Test func aLateAcceptanceReleasesEveryWaitingLinkWhoseTurnCame() {
        var r = burstGivenAway()
        for link in 4...6 { #expect(r.approved(link, peer: far, destination: a, now: t) == .wait) }
        // No timer has fired by t + 1 s (4's turn came with it); link 2 is accepted then, which makes room for 5 too.
        #expect(r.accepted(2, now: t + sec) == [4, 5])
        #expect(r.waitingCount == 1 && r.nextDeadline() == t + 2 * sec)
        // More invitations in flight than the burst, all accepted: those past the burst wait only for the first.
        var s = ration()
        for link in 1...5 { #expect(s.approved(link, peer: far, destination: a, now: t) == (link <= 3 ? .open : .wait)) }
        #expect(s.accepted(1, now: t + 1_000) == [4])
        #expect(s.accepted(2, now: t + 2_000) == [5])
        for link in 3...5 { #expect(s.accepted(link, now: t + 3_000) == []) }
        for link in 6...8 { #expect(s.approved(link, peer: far, destination: a, now: t + 3_000) == .open, "all forgiven: the burst is whole") }
    }

    @Test func aWaitingInvitationThatEndsIsDroppedWithoutACharge() {
        var r = burstGivenAway()
        #expect(r.approved(4, peer: far, destination: a, now: t) == .wait)
        #expect(r.approved(5, peer: far, destination: a, now: t) == .wait)
        #expect(r.approved(6, peer: far, destination: a, now: t) == .wait)
        // 4 times out while it waits: it never opened its share, so 5 takes its turn and nothing is charged for 4.
        r.ended(4)
        #expect(r.waitingCount == 2)
        #expect(r.expire(now: t + sec) == [5])
        #expect(r.expire(now: t + 2 * sec) == [6])
        #expect(r.nextDeadline() == nil)
        // Only 5 and 6 were charged after the burst: with all of them ended, the debt is paid at t + 5 s, and the
        // burst is whole again (an extra charge for 4 would make the third of these wait).
        for link in [1, 2, 3, 5, 6] { r.ended(link) }
        for link in 7...9 { #expect(r.approved(link, peer: far, destination: a, now: t + 5 * sec) == .open) }
        #expect(r.approved(10, peer: far, destination: a, now: t + 5 * sec) == .wait)
    }

    @Test func aWaitingInvitationToAPeerThatConnectedMeanwhileIsDroppedWithoutACharge() {
        var r = burstGivenAway()
        #expect(r.approved(4, peer: near, destination: b, now: t) == .wait)
        #expect(r.approved(5, peer: far, destination: a, now: t) == .wait)
        #expect(r.approved(6, peer: near, destination: b, now: t) == .wait)
        #expect(r.connected(far) == [5], "only the links to the peer that connected")
        #expect(r.connected(far) == [], "dropped once")
        #expect(r.waitingCount == 2)
        // `near` connects through another link: both its waiting links go, oldest first, and none is charged.
        #expect(r.connected(near) == [4, 6])
        #expect(r.waitingCount == 0 && r.nextDeadline() == nil)
        #expect(r.expire(now: t + 10 * sec) == [])
        // Links opened before are not touched (their message 3 went out): the burst's three still count, and are
        // paid off at t + 3 s. Nothing more was charged, so three open then (with 4, 5 and 6 charged, none would).
        for link in 8...10 { #expect(r.approved(link, peer: far, destination: a, now: t + 3 * sec) == .open) }
        #expect(r.approved(11, peer: far, destination: a, now: t + 3 * sec) == .wait)
        // A link whose turn came is opened, not waiting: a later connection of its peer leaves it alone.
        #expect(r.expire(now: t + 4 * sec) == [11])
        #expect(r.connected(far) == [])
    }

    @Test func aNewInvitationNeverOvertakesOneThatWaits() {
        var r = burstGivenAway()
        #expect(r.approved(4, peer: far, destination: a, now: t) == .wait)
        // The debt is paid to the point where one may go, but the timer has not fired yet: 5 queues behind 4.
        #expect(r.approved(5, peer: far, destination: a, now: t + sec) == .wait)
        #expect(r.expire(now: t + sec) == [4])
        #expect(r.expire(now: t + 2 * sec) == [5])
    }
}

@Suite("TurnQueue: round-robin across addresses, oldest first within one (pure)")
struct TurnQueueTests {
    @Test func addressesTakeTurnsAndANewOneJoinsAtTheBack() {
        var q = TurnQueue<Int>()
        #expect(q.isEmpty && q.next() == nil)
        for item in 1...3 { q.append(item, address: a) }
        q.append(4, address: b)
        #expect(q.count == 4 && q.contains(3) && !q.contains(5))
        #expect(q.next() == 1)
        q.append(5, address: c)                     // behind a (which went to the back after its turn) and b
        #expect(q.next() == 4)
        #expect(q.next() == 2)
        #expect(q.next() == 5)
        #expect(q.next() == 3)
        #expect(q.isEmpty)
    }

    @Test func aRemovedItemFreesItsTurnAndAnEmptiedAddressLeaves() {
        var q = TurnQueue<Int>()
        q.append(1, address: a)
        q.append(2, address: a)
        q.append(3, address: b)
        q.remove(1)
        q.remove(99)                                // not waiting: nothing happens
        #expect(q.next() == 2, "a keeps its place for the item it has left")
        q.remove(3)
        #expect(q.isEmpty && q.count == 0)
        q.append(4, address: b)
        q.append(5, address: a)
        q.removeAll()
        #expect(q.isEmpty && q.next() == nil)
    }
}
