import FoundationEssentials
import Synchronization

/// An invitation as an advertiser received it: who asks (with the key its handshake proved), from where, with what
/// context — and how to answer. PeerMesh's richer form of MC's invitation handler.
///
/// Answer once, from any thread, now or later: `accept(into:)` or `decline(_:message:)`. An invitation not answered
/// before the inviter's timeout is declined for you; if the inviter hangs up or the invitation expires first, the
/// `onWithdrawn` handler runs (an app that shows a prompt takes it down then).
///
/// An app that shows a person the short authentication string (`certificate?.shortAuthenticationString`) calls
/// `revealShortAuthenticationString()` as it does, so that the inviter can show the same digits; the session lets
/// the inviter have them anyway when it lets it in. Until then the inviter — or a man in the middle posing as it —
/// cannot tell which digits this side shows, so a search for matching digits costs one invitation shown to a person
/// per guess (docs/PROTOCOL.md §3.2). The advertiser opens at most one invitation's share a second, whatever the app
/// does: a share shown sooner after the last goes out in its turn (about a second later per share ahead of it), and
/// not at all if the invitation ends first. So even an app that shows every invitation at once costs a searcher a
/// second per guess.
public final class Invitation: Sendable {
    /// Who invites. On an encrypted link its `publicKey` is proven.
    public let peer: PeerID
    /// What the inviter sent along (MC's context).
    public let context: Data?
    /// The inviter's address, as the connection saw it.
    public let address: String?
    /// The inviter's proven key and the short authentication string, on an encrypted link.
    public let certificate: PeerCertificate?

    private enum State {
        case open(withdrawn: (@Sendable () -> Void)?)
        case answered
        case withdrawn
    }

    private let state = Mutex(State.open(withdrawn: nil))
    /// Carries the answer out: the answer, the session accepted into, and the member's introduction the inviter came
    /// by (an introduced link, docs/PROTOCOL.md §3.8), if it did.
    private let answer: @Sendable (AdvertiserStateMachine.Answer, Session?, MembershipStateMachine.Introduction?) -> Void
    private let reveal: @Sendable () -> Void

    init(peer: PeerID, context: Data?, address: String?, certificate: PeerCertificate?,
         reveal: @escaping @Sendable () -> Void = {},
         answer: @escaping @Sendable (AdvertiserStateMachine.Answer, Session?, MembershipStateMachine.Introduction?) -> Void) {
        self.peer = peer
        self.context = context
        self.address = address
        self.certificate = certificate
        self.reveal = reveal
        self.answer = answer
    }

    /// Lets the inviter learn the short authentication string, so that it can show the same digits: call it when a
    /// person is shown them. The inviter has them a round trip later, or — when another invitation's were opened
    /// within the last second, or wait their turn — in its turn, a second after the one before (served round-robin
    /// across addresses: about a second per other address with digits waiting, and per earlier invitation from its
    /// own). From any thread; once is enough (later calls, and calls after the invitation was answered or withdrawn,
    /// do nothing more). Nothing in plaintext.
    public func revealShortAuthenticationString() {
        guard isOpen else { return }
        reveal()
    }

    /// Lets the inviter into `session`. Later answers do nothing.
    public func accept(into session: Session) {
        accept(into: session, introducedBy: nil)
    }

    /// Lets the inviter into `session` as a peer that came by a member's `introduction` (`DirectAcceptor`: it
    /// presented a ticket made for that member's MESH_INTRO_REQUEST), or, when nil, as one that came of its own.
    func accept(into session: Session, introducedBy introduction: MembershipStateMachine.Introduction?) {
        guard take() else { return }
        answer(.accept, session, introduction)
    }

    /// Turns the invitation down, with a reason and a line the inviter sees. Later answers do nothing.
    public func decline(_ reason: DeclineReason = .declined, message: String? = nil) {
        guard take() else { return }
        answer(.decline(reason, message ?? reason.description), nil, nil)
    }

    /// Runs `body` once if the invitation goes away unanswered (the inviter hung up, or it timed out) — at once if
    /// it already has.
    public func onWithdrawn(_ body: @escaping @Sendable () -> Void) {
        let now = state.withLock { s -> Bool in
            switch s {
            case .open: s = .open(withdrawn: body); return false
            case .withdrawn: return true
            case .answered: return false
            }
        }
        if now { body() }
    }

    /// Whether it is still waiting for an answer.
    public var isOpen: Bool { state.withLock { if case .open = $0 { true } else { false } } }

    private func take() -> Bool {
        state.withLock { s in
            guard case .open = s else { return false }
            s = .answered
            return true
        }
    }

    /// The advertiser: the invitation went away unanswered.
    func withdraw() {
        let handler = state.withLock { s -> (@Sendable () -> Void)? in
            guard case .open(let w) = s else { return nil }
            s = .withdrawn
            return w
        }
        handler?()
    }
}
