import Dispatch
import Foundation
import Synchronization
import Testing
import MeshTestSupport
@testable import MeshCLI
@testable import MeshRelay
@testable import PeerMesh

/// Lines for a `StandardInput`, typed by the test one at a time; nil ends the input.
private final class TypedLines: Sendable {
    private let pending = Mutex<[String?]>([])
    private let ready = DispatchSemaphore(value: 0)

    func type(_ line: String?) {
        pending.withLock { $0.append(line) }
        ready.signal()
    }

    /// The next typed line (waits for it).
    func next() -> String? {
        ready.wait()
        return pending.withLock { $0.removeFirst() }
    }
}

/// Times at which something happened (seconds since the reference date).
private final class Times: Sendable {
    let values = Mutex<[Double]>([])
    func note() { values.withLock { $0.append(Date().timeIntervalSinceReferenceDate) } }
    var count: Int { values.withLock { $0.count } }
    var first: Double { values.withLock { $0[0] } }
}

/// A join request whose reveals and answers the test can see.
private final class Asked: Sendable {
    let request: JoinRequest
    let revealed: Times
    let decisions = Mutex<[JoinDecision]>([])

    init(_ name: String) throws {
        let peer = try PeerID(displayName: name)
        let revealed = Times()
        self.revealed = revealed
        let invitation = Invitation(peer: peer, context: nil, address: "127.0.0.1", certificate: nil,
                                    reveal: { revealed.note() }, answer: { _, _, _ in })
        request = JoinRequest(peer: peer, address: "127.0.0.1", fingerprint: "0000", shortAuthenticationString: "123 456",
                              namesakeFingerprint: nil, invitation: invitation)
    }
}

/// `--accept ask` on a terminal: a question reveals its check code only when it appears, and questions appear at least
/// `spacing` apart, so that someone searching for a matching code (hanging up whenever the code it learns does not
/// match) gets one guess per `spacing`, each on the operator's screen (docs/PROTOCOL.md §3.2).
@Suite("The terminal's join questions: one at a time, codes revealed when shown, spaced")
struct TerminalApprovalTests {
    /// A terminal approval whose input the test types (end it with `type(nil)`).
    private static func approval(spacing: Double) -> (TypedLines, TerminalApproval) {
        let typed = TypedLines()
        return (typed, TerminalApproval(terminal: Terminal(program: "test", quiet: true),
                                        input: StandardInput(lines: { typed.next() }), spacing: spacing))
    }

    @Test("A queued request reveals nothing; after a withdrawal the next appears no sooner than the spacing, and a line typed meanwhile answers nothing")
    func queuedRequestsAreRevealedWhenShownAndSpaced() throws {
        let (typed, approval) = Self.approval(spacing: 0.5)
        defer { typed.type(nil) }
        let first = try Asked("first"), second = try Asked("second")
        for a in [first, second] {
            approval.ask(a.request) { d in a.decisions.withLock { $0.append(d) } }
        }
        #expect(first.revealed.count == 1, "the question on screen reveals its code")
        #expect(second.revealed.count == 0, "a question queued behind it reveals nothing")
        // The first player hangs up (its code did not match, say): the second must wait out the spacing.
        first.request.withdraw()
        typed.type("y")   // meant for the question that just went away
        #expect(eventually(3) { second.revealed.count == 1 })
        let gap = second.revealed.first - first.revealed.first
        #expect(gap >= 0.45, "shown \(gap) s after the previous question")
        #expect(second.decisions.withLock { $0.isEmpty }, "the line typed before it appeared did not answer it")
        typed.type("n")
        #expect(eventually(3) { second.decisions.withLock { $0 } == [.no] })
        #expect(first.decisions.withLock { $0.isEmpty }, "a withdrawn request is not answered")
    }

    @Test("Withdrawn and asked again at once, over and over: codes go out no faster than one per spacing")
    func aSearcherGetsOneCodePerSpacing() throws {
        let (typed, approval) = Self.approval(spacing: 0.2)
        defer { typed.type(nil) }
        let started = Date()
        var asked: [Asked] = []
        // Each try asks, waits for its code, and hangs up: what a searcher does as fast as the host lets it.
        for i in 0..<6 {
            let a = try Asked("try\(i)")
            asked.append(a)
            approval.ask(a.request) { _ in }
            #expect(eventually(3) { a.revealed.count == 1 })
            a.request.withdraw()
        }
        let elapsed = Date().timeIntervalSince(started)
        #expect(elapsed >= 5 * 0.2 * 0.9, "6 codes took \(elapsed) s: the spacing holds")
        let times = asked.map { $0.revealed.first }
        for (a, b) in zip(times, times.dropFirst()) { #expect(b - a >= 0.18, "\(b - a) s between two codes") }
    }
}
