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

    /// Starts reading. `commands` receives the lines no question takes.
    package init(commands: @escaping @Sendable (String) -> Void = { _ in }) {
        self.commands = commands
        OSThread.detach(name: "pm-stdin") { [self] in
            while let line = readLine(strippingNewline: true) { deliver(line) }
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
package final class TerminalApproval: PlayerApproval {
    private let terminal: Terminal
    private let input: StandardInput
    private let queue = Mutex<[(request: JoinRequest, decide: @Sendable (JoinDecision) -> Void, id: Int)]>([])

    package init(terminal: Terminal, input: StandardInput) {
        self.terminal = terminal
        self.input = input
    }

    package func ask(_ request: JoinRequest, decide: @escaping @Sendable (JoinDecision) -> Void) {
        let id = input.ask { [self] line in answer(request, line) }
        let first = queue.withLock { q -> Bool in q.append((request, decide, id)); return q.count == 1 }
        if first { show(request) }
        request.onWithdrawn { [self] in
            let (wasCurrent, next) = queue.withLock { q -> (Bool, JoinRequest?) in
                guard let i = q.firstIndex(where: { $0.id == id }) else { return (false, nil) }
                q.remove(at: i)
                return (i == 0, i == 0 ? q.first?.request : nil)
            }
            input.withdraw(id)
            if wasCurrent {
                terminal.endQuestion()
                terminal.error("the request from \(TerminalText.escape(request.peer.displayName)) was withdrawn")
                if let next { show(next) }
            }
        }
    }

    private func show(_ r: JoinRequest) {
        // Only now may the player (or someone posing as it) learn the code: a request queued behind another gives
        // nothing away.
        r.revealShortAuthenticationString()
        let namesake = r.namesakeFingerprint.map { " It is NOT the paired player of that name (key \($0)): its key differs." } ?? ""
        terminal.question("player \"\(TerminalText.escape(r.peer.displayName))\" at \(TerminalText.escape(r.address)) "
            + "(key \(r.fingerprint), check code \(r.shortAuthenticationString)) wants to listen.\(namesake) "
            + "Allow? [y] once, [a] always, [n] no:")
    }

    /// Handles a line for `request`; returns whether it was an answer.
    private func answer(_ request: JoinRequest, _ line: String?) -> Bool {
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
        let (entry, next) = queue.withLock { q -> ((request: JoinRequest, decide: @Sendable (JoinDecision) -> Void, id: Int)?, JoinRequest?) in
            guard let i = q.firstIndex(where: { $0.request === request }) else { return (nil, nil) }
            let e = q.remove(at: i)
            return (e, q.first?.request)
        }
        terminal.endQuestion()
        entry?.decide(decision)
        if let next { show(next) }
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
