import Foundation
import Testing
import MeshPOSIX
import MeshTestSupport
@testable import PeerMesh

/// A member's honest MESH_INTRO_DATA that reaches the introducer after the newcomer it was about has left. It was
/// judged "not asked for", and the introducer closed the innocent member's link (seen as a rare flake of the reader
/// deadlock test: the first guest gone 0.45 s in, `peerFaults` 1).
@Suite("Mesh introductions answered after the newcomer left")
struct LateIntroductionTests {
    let host: PeerID, guest: PeerID, second: PeerID
    init() throws {
        (host, guest, second) = (try PeerID(displayName: "host"), try PeerID(displayName: "guest"), try PeerID(displayName: "second"))
    }

    func isFault(_ actions: [MembershipStateMachine.Action]) -> Bool { actions.contains { if case .fault = $0 { true } else { false } } }

    @Test("Pure: an answer about a newcomer that left meanwhile is dropped, not a fault; a second one is unasked for")
    func anAnswerAboutANewcomerThatLeftIsNoFault() {
        var m = MembershipStateMachine(me: host, topology: .mesh, maximumPeers: 8)
        #expect(m.connected(guest, introducedBy: nil).isEmpty)
        #expect(m.connected(second, introducedBy: nil) == [.send(guest, .introRequest(peer: second, members: [guest.identity]))])
        #expect(m.disconnected(second, now: 0).isEmpty, "the newcomer leaves before the guest answers")
        #expect(m.received(.introData(forIdentity: second.identity, data: [1, 2, 3]), from: guest, now: 0) == [])
        #expect(m.received(.introData(forIdentity: second.identity, data: [1]), from: guest, now: 0)
                == [.fault(guest, .unexpectedFrame("MESH_INTRO_DATA that was not asked for"))])
    }

    @Test("Pure: a newcomer that leaves and comes back before the answers: one answer per request, both passed on")
    func aNewcomerThatComesBackGetsBothAnswers() {
        var m = MembershipStateMachine(me: host, topology: .mesh, maximumPeers: 8)
        _ = m.connected(guest, introducedBy: nil)
        _ = m.connected(second, introducedBy: nil)
        _ = m.disconnected(second, now: 0)
        #expect(m.connected(second, introducedBy: nil) == [.send(guest, .introRequest(peer: second, members: [guest.identity]))], "asked again")
        #expect(m.received(.introData(forIdentity: second.identity, data: [1]), from: guest, now: 0)
                == [.send(second, .introduce(peer: guest, data: [1]))])
        #expect(m.received(.introData(forIdentity: second.identity, data: [2]), from: guest, now: 0)
                == [.send(second, .introduce(peer: guest, data: [2]))])
        #expect(isFault(m.received(.introData(forIdentity: second.identity, data: [3]), from: guest, now: 0)), "a third was not asked for")
    }

    @Test("Pure: a member that never answers: requests about the last 32 newcomers that left are kept whole, older ones as one count")
    func openRequestsAboutDepartedNewcomersAreBounded() throws {
        var m = MembershipStateMachine(me: host, topology: .mesh, maximumPeers: 8)
        _ = m.connected(guest, introducedBy: nil)
        let count = MembershipStateMachine.maximumDeparted + 8
        let newcomers = try (0..<count).map { try PeerID(displayName: "newcomer \($0)") }
        for n in newcomers {
            #expect(m.connected(n, introducedBy: nil) == [.send(guest, .introRequest(peer: n, members: [guest.identity]))])
            _ = m.disconnected(n, now: 0)
        }
        // Every one of the 40 answers is owed, so none is a fault: the oldest eight as a count, the latest 32 by name.
        for n in newcomers.reversed() {
            #expect(m.received(.introData(forIdentity: n.identity, data: [7]), from: guest, now: 0) == [], "\(n.displayName)")
        }
        #expect(isFault(m.received(.introData(forIdentity: newcomers[0].identity, data: []), from: guest, now: 0)), "a 41st was not asked for")
        // A member that leaves owes nothing: requests to it are dropped, and so are the counts.
        for n in newcomers.prefix(count) {
            _ = m.connected(n, introducedBy: nil)
            _ = m.disconnected(n, now: 0)
        }
        _ = m.disconnected(guest, now: 0)
        _ = m.connected(guest, introducedBy: nil)
        #expect(isFault(m.received(.introData(forIdentity: newcomers[0].identity, data: []), from: guest, now: 0)))
    }

    @Test("Pure: a newcomer that comes back through an introduction is a member again, not one of the departed")
    func aNewcomerBackThroughAnIntroductionIsNoLongerDeparted() throws {
        var m = MembershipStateMachine(me: host, topology: .mesh, maximumPeers: 8)
        _ = m.connected(guest, introducedBy: nil)
        _ = m.connected(second, introducedBy: nil)
        _ = m.disconnected(second, now: 0)
        // Another member asks us to make data for `second`: its next link to us comes from an introduction.
        let third = try PeerID(displayName: "third")
        _ = m.connected(third, introducedBy: nil)
        // It asked us and the guest about `second`: its ticket says so.
        var ticket = try #require(m.introduction(by: third))
        ticket.listed = [host.identity, guest.identity]
        #expect(m.received(.introRequest(peer: second, members: [host.identity, guest.identity]), from: third, now: 0)
                == [.makeData(for: second, replyTo: third, introduction: ticket)])
        #expect(m.connected(second, introducedBy: ticket).isEmpty, "an introduced link introduces no one its introducer asked")
        // 40 other newcomers come and go while the guest is slow; its answer about the connected `second` is still owed.
        for i in 0..<(MembershipStateMachine.maximumDeparted + 8) {
            let n = try PeerID(displayName: "churn \(i)")
            _ = m.connected(n, introducedBy: nil)
            _ = m.disconnected(n, now: 0)
        }
        #expect(m.received(.introData(forIdentity: second.identity, data: [1]), from: guest, now: 0)
                == [.send(second, .introduce(peer: guest, data: [1]))])
    }

    @Test("Sockets: the host reads the first guest's answer only after it dropped the second guest; the first stays")
    func theHostReadsALateAnswerAndKeepsTheMember() throws {
        let pair = try Pair(hostConfig: .init(peerTimeout: .seconds(10)), guestConfig: .init(peerTimeout: .seconds(10)))
        let host = pair.host, core = host.core, guestPeer = pair.guestPeer
        let link = try #require(core.shared.withLock { $0.machine.primaryLink(for: guestPeer) })
        // A loop that gets to the first guest's link late: the host does not read it for now.
        core.loop.submitAndWait { core.io.value.connections[link]?.pause() }
        let second = try pair.join(as: "second")
        #expect(second.log.wait(5) { s in s.states.contains { $0.0 == pair.hostPeer && $0.1 == .connected } })
        #expect(eventually(5) { host.connectedPeers.count == 2 })
        // The first guest has made its data for the second (its direct listener is up) and sent the answer.
        #expect(eventually(5) { pair.guest.direct.withLock { $0 } != nil })
        usleep(100_000)
        host.disconnect(second.peer)
        #expect(pair.hostLog.wait(5) { s in s.states.contains { $0.0 == second.peer && $0.1 == .notConnected } })
        let faultsBefore = host.statistics.peerFaults
        core.loop.submitAndWait {
            core.io.value.connections[link]?.rehome(onFrame: { [unowned core] f in core.received(f, on: link) },
                                                    onEnd: { [unowned core] why in core.ended(link, why) })
        }
        // The answer is read now; the link must outlive it.
        usleep(300_000)
        let history = "host saw \(pair.hostLog.snapshot.states.map { "\($0.0.displayName) \($0.1)" }); peerFaults \(faultsBefore) → \(host.statistics.peerFaults)"
        #expect(host.isEncrypted(guestPeer), "the first guest's link is up: \(history)")
        #expect(host.connectedPeers == [guestPeer])
        #expect(host.statistics.peerFaults == faultsBefore, "no fault: \(history)")
    }
}
