import Dispatch
import FoundationEssentials
import Glibc
import MeshPOSIX
import MeshRelay
import Synchronization

/// Standard input, one line at a time, on a thread of its own: open questions get the lines first, the rest go to
/// `commands` (the stdin command path). End of input ends every open question with "no".
package final class StandardInput: Sendable {
    private let questions = Mutex<[(id: Int, answer: @Sendable (String?) -> Bool)]>([])
    private let nextID = Mutex(0)
    private let commands: @Sendable (String) -> Void

    /// Starts reading standard input (or, for tests, `lines`, until it returns nil). `commands` receives the lines no
    /// question takes.
    package init(lines: @escaping @Sendable () -> String? = { readLine(strippingNewline: true) },
                 commands: @escaping @Sendable (String) -> Void = { _ in }) {
        self.commands = commands
        OSThread.detach(name: "pm-stdin") { [self] in
            while let line = lines() { deliver(line) }
            let open = questions.withLock { q -> [(id: Int, answer: @Sendable (String?) -> Bool)] in defer { q = [] }; return q }
            for q in open { _ = q.answer(nil) }
        }
    }

    /// Queues a question: `answer` gets the next line that is not for an earlier question (nil at end of input) and
    /// returns whether it took it (false asks again with the following line). Returns a handle to withdraw it.
    package func ask(_ answer: @escaping @Sendable (String?) -> Bool) -> Int {
        let id = nextID.withLock { $0 += 1; return $0 }
        questions.withLock { $0.append((id, answer)) }
        return id
    }

    /// Takes a question back (its request went away).
    package func withdraw(_ id: Int) { questions.withLock { $0.removeAll { $0.id == id } } }

    private func deliver(_ line: String) {
        guard let q = questions.withLock({ $0.first }) else { return commands(line) }
        if q.answer(line) { questions.withLock { $0.removeAll { $0.id == q.id } } }
    }
}

/// `--accept ask` on a terminal: one question at a time, with the player's escaped name, address, key fingerprint
/// and short authentication string; `y` once, `a` always (pairs it), `n` no. The status line pauses while a question
/// is open, and a request that goes away takes its question with it.
///
/// A question reveals its check code to the player only when it is shown (a request queued behind another gives
/// nothing away), and questions are shown at least `spacing` apart: someone searching for a matching code, who hangs
/// up each time the code it learns does not match, gets at most one guess per `spacing`, each a question on the
/// operator's screen (docs/PROTOCOL.md §3.2; the advertiser also opens at most one code a second, whatever asks it).
/// A line typed while the next question waits out the spacing answers nothing.
package final class TerminalApproval: PlayerApproval {
    /// The least time between two questions' appearance (and so between two codes revealed).
    package static let spacing: Double = 1

    private struct Entry {
        let request: JoinRequest
        let decide: @Sendable (JoinDecision) -> Void
        let id: Int
        var shown = false
    }

    private struct Queue {
        var entries: [Entry] = []
        /// When the latest question appeared (monotonic seconds).
        var lastShown: Double?
    }

    private let terminal: Terminal
    private let input: StandardInput
    private let spacing: Double
    private let queue = Mutex(Queue())

    package init(terminal: Terminal, input: StandardInput, spacing: Double = TerminalApproval.spacing) {
        self.terminal = terminal
        self.input = input
        self.spacing = spacing
    }

    package func ask(_ request: JoinRequest, decide: @escaping @Sendable (JoinDecision) -> Void) {
        let id = input.ask { [self] line in answer(request, line) }
        queue.withLock { $0.entries.append(Entry(request: request, decide: decide, id: id)) }
        showNext()
        request.onWithdrawn { [self] in
            let wasShown = queue.withLock { q -> Bool in
                guard let i = q.entries.firstIndex(where: { $0.id == id }) else { return false }
                return q.entries.remove(at: i).shown
            }
            input.withdraw(id)
            if wasShown {
                terminal.endQuestion()
                terminal.error("the request from \(TerminalText.escape(request.peer.displayName)) was withdrawn")
                showNext()
            }
        }
    }

    /// Shows the first question if none is on screen: now, or once `spacing` has passed since the last one appeared.
    private func showNext() {
        enum Step { case none, show(JoinRequest), wait(Double) }
        let now = Double(MonotonicClock.nowNanos()) / 1e9
        let step = queue.withLock { q -> Step in
            guard let first = q.entries.first, !first.shown else { return .none }
            if let last = q.lastShown, now - last < spacing { return .wait(spacing - (now - last)) }
            q.entries[0].shown = true
            q.lastShown = now
            return .show(first.request)
        }
        switch step {
        case .none: break
        case .show(let r): show(r)
        case .wait(let seconds):
            DispatchQueue.global().asyncAfter(deadline: .now() + seconds) { [self] in showNext() }
        }
    }

    private func show(_ r: JoinRequest) {
        // Only now may the player (or someone posing as it) learn the code.
        r.revealShortAuthenticationString()
        let namesake = r.namesakeFingerprint.map { " It is NOT the paired player of that name (key \($0)): its key differs." } ?? ""
        terminal.question("player \"\(TerminalText.escape(r.peer.displayName))\" at \(TerminalText.escape(r.address)) "
            + "(key \(r.fingerprint), check code \(r.shortAuthenticationString)) wants to listen.\(namesake) "
            + "Allow? [y] once, [a] always, [n] no:")
    }

    /// Handles a line for `request`; returns whether it was an answer.
    private func answer(_ request: JoinRequest, _ line: String?) -> Bool {
        // A line typed while the question waits out the spacing was meant for what was on screen before: it answers
        // nothing. (The end of input still declines every open question.)
        if line != nil, !queue.withLock({ q in q.entries.contains { $0.request === request && $0.shown } }) {
            terminal.error("no question is on screen; that answered nothing")
            return false
        }
        let decision: JoinDecision
        switch line.map({ $0.trimmingWhitespace().lowercased() }) {
        case nil: decision = .no
        case "y", "yes": decision = .once
        case "a", "always": decision = .always
        case "n", "no", "": decision = .no
        default:
            terminal.question("please answer y, a or n:")
            return false
        }
        let entry = queue.withLock { q -> Entry? in
            guard let i = q.entries.firstIndex(where: { $0.request === request }) else { return nil }
            return q.entries.remove(at: i)
        }
        terminal.endQuestion()
        entry?.decide(decision)
        showNext()
        return true
    }
}

extension StringProtocol {
    /// The string without leading and trailing white space.
    fileprivate func trimmingWhitespace() -> String {
        guard let first = firstIndex(where: { !$0.isWhitespace }), let last = lastIndex(where: { !$0.isWhitespace })
        else { return "" }
        return String(self[first...last])
    }
}
