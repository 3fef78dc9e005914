import MeshPOSIX

/// Identifies one accepted connection inside an advertiser. Assigned by the driver.
typealias PendingID = Int

/// The invitation lifecycle of an advertiser as a pure state machine: accept, greet, learn who calls, take the
/// invitation, ask the app, carry out its answer — with deadlines and limits.
///
/// Each event is one `mutating` method that returns what the driver must do. No I/O, no clock.
///
/// Limits: at most `maximumPending` connections wait at once, and at most `maximumPendingPerHost` from one host;
/// at the cap the driver stops accepting (`isFull`) until one ends. Each connection must identify itself and
/// invite within `greetingTimeout`; an invitation the app has not answered is declined at its deadline (the
/// inviter's timeout, at most `maximumInvitationWait`).
struct AdvertiserStateMachine: Sendable {
    /// Limits and timing.
    struct Configuration: Equatable, Sendable {
        var localPeer: PeerID
        var greetingTimeout: Nanos = 10_000_000_000
        var maximumInvitationWait: Nanos = 60_000_000_000
        var maximumPending: Int = 64
        var maximumPendingPerHost: Int = 8
    }

    private enum Pending: Equatable {
        /// Accepted and greeted; the caller has not said who it is.
        case greeted(host: [UInt8], deadline: Nanos)
        /// The caller said HELLO; its INVITE has not come.
        case introduced(host: [UInt8], peer: PeerID, deadline: Nanos)
        /// The app holds the invitation.
        case asking(host: [UInt8], peer: PeerID, invite: ControlFrame.InviteBody, deadline: Nanos)

        var host: [UInt8] {
            switch self {
            case .greeted(let h, _), .introduced(let h, _, _), .asking(let h, _, _, _): h
            }
        }

        var deadline: Nanos {
            switch self {
            case .greeted(_, let d), .introduced(_, _, let d), .asking(_, _, _, let d): d
            }
        }
    }

    /// What to do with a connection just accepted.
    enum OnAccepted: Equatable, Sendable {
        /// Keep it: send our HELLO.
        case greet(PendingID, ControlFrame)
        /// Too many pending connections (from that host, or in all): close it at once.
        case refuse(PendingID)
    }

    /// What to do after a frame from a pending connection.
    enum OnFrame: Equatable, Sendable {
        /// Nothing yet.
        case wait
        /// Hand the invitation to the app; stop reading the connection until it answers.
        case ask(PendingID, PeerID, ControlFrame.InviteBody)
        /// The caller broke the protocol: close its connection.
        case close(PendingID, PeerFault)
    }

    /// What to do with the app's answer.
    enum OnAnswer: Equatable, Sendable {
        /// Give the connection to the session the app chose.
        case handOver(PendingID, PeerID, ControlFrame.InviteBody)
        /// Answer DECLINE with the reason, then close.
        case decline(PendingID, DeclineReason)
        /// The invitation is gone (expired, withdrawn, already answered): nothing to do.
        case ignore
    }

    /// What time, or a stop, did to a pending connection.
    enum OnExpiry: Equatable, Sendable {
        /// Close without a word (it never invited).
        case close(PendingID)
        /// Answer DECLINE with the reason, then close.
        case decline(PendingID, DeclineReason)
    }

    private let config: Configuration
    private var pending: [PendingID: Pending] = [:]
    private var stopped = false

    init(configuration: Configuration) {
        precondition(configuration.maximumPending >= 1 && configuration.maximumPendingPerHost >= 1)
        config = configuration
    }

    /// Whether the advertiser should stop accepting until a pending connection ends.
    var isFull: Bool { pending.count >= config.maximumPending }

    /// Connections waiting.
    var pendingCount: Int { pending.count }

    /// The next instant at which `expire` has work.
    func nextDeadline() -> Nanos? { pending.values.map(\.deadline).min() }

    // MARK: Events

    /// A connection from `host` (its address bytes) was accepted.
    mutating func accepted(_ id: PendingID, host: [UInt8], now: Nanos) -> OnAccepted {
        precondition(pending[id] == nil, "pending ids are unique")
        guard !stopped, pending.count < config.maximumPending,
              pending.values.count(where: { $0.host == host }) < config.maximumPendingPerHost
        else { return .refuse(id) }
        pending[id] = .greeted(host: host, deadline: now &+ config.greetingTimeout)
        return .greet(id, .hello(peer: config.localPeer))
    }

    /// A frame arrived on a pending connection.
    mutating func received(_ frame: ControlFrame, on id: PendingID, now: Nanos) -> OnFrame {
        guard let p = pending[id] else { return .wait }
        switch (p, frame) {
        case (.greeted(let host, let deadline), .hello(let peer)):
            if peer == config.localPeer { return close(id, .unexpectedFrame("our own HELLO")) }
            pending[id] = .introduced(host: host, peer: peer, deadline: deadline)
            return .wait
        case (.introduced(let host, let peer, _), .invite(let body)):
            var wait = UInt64(body.timeoutMillis) * 1_000_000
            if wait == 0 { wait = 30_000_000_000 }
            pending[id] = .asking(host: host, peer: peer, invite: body, deadline: now &+ min(wait, config.maximumInvitationWait))
            return .ask(id, peer, body)
        default:
            return close(id, .unexpectedFrame(frame.name))
        }
    }

    /// The app answered the invitation on `id`.
    mutating func answered(_ id: PendingID, accept: Bool) -> OnAnswer {
        guard case .asking(_, let peer, let invite, _)? = pending[id] else { return .ignore }
        pending[id] = nil
        return accept ? .handOver(id, peer, invite) : .decline(id, .declined)
    }

    /// The connection ended (the caller hung up, or it failed). An invitation the app holds is withdrawn.
    mutating func closed(_ id: PendingID) {
        pending[id] = nil
    }

    /// Time passed: close callers that never invited, decline invitations not answered in time.
    mutating func expire(now: Nanos) -> [OnExpiry] {
        var out: [OnExpiry] = []
        for id in pending.keys.sorted() where pending[id]!.deadline <= now {
            if case .asking = pending[id]! { out.append(.decline(id, .timedOut)) } else { out.append(.close(id)) }
            pending[id] = nil
        }
        return out
    }

    /// The advertiser stops: every pending invitation is declined as unavailable, the rest closed.
    mutating func stop() -> [OnExpiry] {
        stopped = true
        let out = pending.keys.sorted().map { id -> OnExpiry in
            if case .asking = pending[id]! { .decline(id, .unavailable) } else { .close(id) }
        }
        pending.removeAll()
        return out
    }

    private mutating func close(_ id: PendingID, _ fault: PeerFault) -> OnFrame {
        pending[id] = nil
        return .close(id, fault)
    }
}
