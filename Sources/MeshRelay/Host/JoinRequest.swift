import PeerMesh
import Synchronization

/// A player asking to join a host whose policy is `.ask`: what the operator sees, and how to answer.
public final class JoinRequest: Sendable {
    /// The player (its display name is raw remote text: escape it before printing).
    public let peer: PeerID
    /// The numeric address the invitation came from.
    public let address: String
    /// The player's short key fingerprint.
    public let fingerprint: String
    /// Six digits the player can show too.
    public let shortAuthenticationString: String
    /// The short fingerprint of the paired player whose name this one gives, if one is paired under it: this is not
    /// that player (its key differs), whatever it calls itself.
    public let namesakeFingerprint: String?
    private let invitation: Invitation
    /// Whether the request went away unanswered, and (until then) who wants to hear of it.
    private let withdrawal = Mutex<(done: Bool, waiting: [@Sendable () -> Void])>((false, []))

    init(peer: PeerID, address: String, fingerprint: String, shortAuthenticationString: String, namesakeFingerprint: String?,
         invitation: Invitation) {
        self.peer = peer
        self.address = address
        self.fingerprint = fingerprint
        self.shortAuthenticationString = shortAuthenticationString
        self.namesakeFingerprint = namesakeFingerprint
        self.invitation = invitation
    }

    /// Runs `body` once if the request goes away unanswered (the player gave up, or it timed out) — at once if it
    /// already has.
    public func onWithdrawn(_ body: @escaping @Sendable () -> Void) {
        // Checked and registered under one lock: a withdrawal between the two would otherwise never reach `body`.
        let now = withdrawal.withLock { w -> Bool in
            if !w.done { w.waiting.append(body) }
            return w.done
        }
        if now { body() }
    }

    /// Whether the request still waits for an answer.
    public var isOpen: Bool { invitation.isOpen }

    /// Lets the player learn the check code, so that it can show it too: call it when the operator is shown
    /// `shortAuthenticationString`, not before (a request still queued behind another shows nothing, and so gives
    /// nothing away to someone searching for matching digits: docs/PROTOCOL.md §3.2).
    public func revealShortAuthenticationString() { invitation.revealShortAuthenticationString() }

    func withdraw() {
        let waiting = withdrawal.withLock { w -> [@Sendable () -> Void] in
            guard !w.done else { return [] }
            w.done = true
            defer { w.waiting = [] }
            return w.waiting
        }
        for body in waiting { body() }
    }
}

/// The operator's answer to a `JoinRequest`.
public enum JoinDecision: Sendable, Equatable {
    /// Let the player in this time.
    case once
    /// Let it in and trust its key from now on (pairs it).
    case always
    /// Turn it down (the player does not retry).
    case no
}

/// Asks someone whether a player may join (`RelayHost.AcceptPolicy.ask`).
public protocol PlayerApproval: Sendable {
    /// Asks about `request`; call `decide` exactly once, from any thread. When the operator is shown the check code,
    /// call `request.revealShortAuthenticationString()` (so that the player shows it too). If the request is withdrawn
    /// first, take the question down (`request.onWithdrawn`); a late answer changes nothing. The take-down runs on the host's
    /// I/O thread, possibly while `RelayHost.stop()` waits for it: it must not wait for the thread that stops the host.
    func ask(_ request: JoinRequest, decide: @escaping @Sendable (JoinDecision) -> Void)
}
