import MeshPOSIX

/// Identifies one accepted connection inside an advertiser. Assigned by the driver.
typealias PendingID = Int

/// The invitation lifecycle of an advertiser as a pure state machine: accept, greet, learn who calls, take the
/// invitation, ask the app, carry out its answer — with deadlines and limits.
///
/// Each event is one `mutating` method that returns what the driver must do. No I/O, no clock.
///
/// Limits: at most `maximumPending` connections wait at once, and at most `maximumPendingPerHost` from one host.
/// A connection must send its first bytes within `firstByteTimeout` and finish the handshake and its invitation
/// within `greetingTimeout`; an invitation the app has not answered is declined at its deadline (the inviter's
/// timeout, at most `maximumInvitationWait`). At a cap, a new connection evicts the oldest one that is still
/// handshaking — a silent one first — so idle or slow connections cannot lock a real peer out (a real peer
/// finishes its handshake within a round trip). Only when every slot holds an invitation the app is deciding
/// is a new connection refused; then the driver stops accepting (`isFull`) until one ends.
///
/// Tries are rationed per source address. A connection becomes a try, charged to its address, when its caller
/// first speaks (in Noise mode this side answers with message 2); a silent one costs
/// nothing. A try is forgiven (`admitted`) only when the session the app chose has let the caller in — after its
/// certificate check and peer limits — and that session is not a pairing window's. Every other end keeps the
/// charge: a caller that hung up, broke the protocol, ran out of time, withdrew its invitation, was declined, or
/// was turned away by the session. So a man in the middle searching for a handshake that shows the digits the
/// inviter shows (docs/PROTOCOL.md §3.2) pays for every try, however it ends it, and a real peer pays only when it
/// is turned away. A try evicted by another from the same address moves its charge to the newcomer (a wash); one
/// evicted by another address keeps it. An address may have `tryBurst` unforgiven tries at once and then one per
/// `tryInterval` (checked at accept, so the connections it already has open and silent add at most
/// `maximumPendingPerHost − 1`); past that its new connections are refused until the debt is paid. Other addresses
/// are not affected.
///
/// The caller's share of the digits (the advertiser's SAS nonce, docs/PROTOCOL.md §3.2) is opened when the app shows
/// the digits to a person (`revealRequested`) — and at most one invitation's a `revealInterval`, across every address,
/// whatever the app does. Later requests wait their turn (`expire` opens the next when it is due), served round-robin
/// across addresses and oldest first within one, so that the shares one address keeps waiting delay another's by at
/// most one turn each; one whose invitation ends first is dropped and frees its turn. So a man in the middle
/// searching for a match from any number of addresses learns at most one set of the advertiser's digits a second,
/// even from an app that shows every invitation at once and drops it the moment its caller hangs up, and a real
/// caller waits about a second per share ahead of it: at most one per other address with shares waiting, plus those
/// its own address has waiting (at most `maximumPending` in all). (The session that lets a caller in opens its share
/// without waiting: by then the app has let it in.)
struct AdvertiserStateMachine: Sendable {
    /// Limits and timing.
    struct Configuration: Equatable, Sendable {
        var localPeer: PeerID
        var firstByteTimeout: Nanos = 2_000_000_000
        var greetingTimeout: Nanos = 5_000_000_000
        var maximumInvitationWait: Nanos = 60_000_000_000
        var maximumPending: Int = 64
        var maximumPendingPerHost: Int = 8
        /// Unforgiven tries an address may have at once before it is refused.
        var tryBurst: Int = 16
        /// After the burst, one try per this interval.
        var tryInterval: Nanos = 1_000_000_000
        /// Addresses whose tries are remembered at most (those whose debt is paid go first, then the smallest).
        var maximumRationedHosts: Int = 1_024
        /// At most one invitation's share of the digits is opened per this interval.
        var revealInterval: Nanos = 1_000_000_000
    }

    /// Where an invitation's share of the digits stands.
    enum Share: Equatable, Sendable {
        /// The app has not shown the digits: the caller cannot know them.
        case held
        /// The app has shown them; the share waits for its turn (round-robin across addresses, oldest first within
        /// one: `TurnQueue`).
        case queued
        /// Sent to the caller.
        case opened
    }

    private enum Pending: Equatable {
        /// Accepted and greeted; nothing has arrived yet.
        case silent(host: [UInt8], acceptedAt: Nanos)
        /// Bytes arrived (the handshake is under way); the caller has not said who it is.
        case greeted(host: [UInt8], acceptedAt: Nanos)
        /// The caller said HELLO; its INVITE has not come.
        case introduced(host: [UInt8], acceptedAt: Nanos, peer: PeerID)
        /// The app holds the invitation.
        case asking(host: [UInt8], acceptedAt: Nanos, peer: PeerID, invite: ControlFrame.InviteBody, deadline: Nanos,
                    share: Share)

        var host: [UInt8] {
            switch self {
            case .silent(let h, _), .greeted(let h, _), .introduced(let h, _, _), .asking(let h, _, _, _, _, _): h
            }
        }

        var acceptedAt: Nanos {
            switch self {
            case .silent(_, let a), .greeted(_, let a), .introduced(_, let a, _), .asking(_, let a, _, _, _, _): a
            }
        }

        var isAsking: Bool { if case .asking = self { true } else { false } }
        var isSilent: Bool { if case .silent = self { true } else { false } }

        /// The same invitation with its share of the digits at `share` (only an invitation the app holds has one).
        func with(share: Share) -> Pending {
            guard case .asking(let h, let a, let peer, let invite, let d, _) = self else {
                preconditionFailure("only an invitation the app holds has a share of the digits")
            }
            return .asking(host: h, acceptedAt: a, peer: peer, invite: invite, deadline: d, share: share)
        }
    }

    /// What to do with a connection just accepted.
    enum OnAccepted: Equatable, Sendable {
        /// Keep it: send our HELLO (carried by the handshake when encrypted). Close `evicting` first, if any: it
        /// was the oldest connection still handshaking at a cap.
        case greet(PendingID, ControlFrame, evicting: PendingID?)
        /// Every slot holds an invitation the app is deciding, or the caller's address has used its ration of tries:
        /// close the new one at once.
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
        /// Answer DECLINE with the reason and text, then close.
        case decline(PendingID, DeclineReason, String)
        /// The invitation is gone (expired, withdrawn, already answered): nothing to do.
        case ignore
    }

    /// The app's answer to an invitation.
    enum Answer: Equatable, Sendable {
        case accept
        case decline(DeclineReason, String)
    }

    /// What time, or a stop, did to a pending connection.
    enum OnExpiry: Equatable, Sendable {
        /// Close without a word (it never invited).
        case close(PendingID)
        /// Answer DECLINE with the reason, then close.
        case decline(PendingID, DeclineReason)
        /// Send the caller its share of the digits (SAS-NONCE): its turn came.
        case open(PendingID)
    }

    /// What to do when the app shows an invitation's digits.
    enum OnReveal: Equatable, Sendable {
        /// Send the caller its share of the digits (SAS-NONCE) now.
        case open(PendingID)
        /// Nothing now: the share waits its turn (`expire` opens it), was opened already, or belongs to no invitation
        /// the app holds.
        case wait
    }

    private let config: Configuration
    /// The ration of tries per address (`tryBurst`, `tryInterval`).
    private let tryPace: RationPace
    private var pending: [PendingID: Pending] = [:]
    private var stopped = false
    /// Per address, the time at which its tries are paid off (a virtual scheduling time, as in GCRA: each try moves
    /// it `tryInterval` on from at least now; a forgiven try moves it back).
    private var tryDebt: [[UInt8]: Nanos] = [:]
    /// The earliest time at which the next share of the digits may be opened.
    private var nextOpening: Nanos = 0
    /// The invitations whose share waits its turn, by the address (or relayed caller) each is charged to.
    private var shareTurns = TurnQueue<PendingID>()

    /// Exact counts since `init`.
    private(set) var counters = AdvertiserStatistics()

    init(configuration: Configuration) {
        precondition(configuration.maximumPending >= 1 && configuration.maximumPendingPerHost >= 1)
        precondition(configuration.maximumRationedHosts >= 1)
        tryPace = RationPace(burst: configuration.tryBurst, interval: configuration.tryInterval)
        config = configuration
    }

    /// Whether the advertiser should stop accepting until a pending connection ends: every slot holds an
    /// invitation the app is deciding.
    var isFull: Bool { pending.count >= config.maximumPending && pending.values.allSatisfy(\.isAsking) }

    /// Connections waiting.
    var pendingCount: Int { pending.count }

    /// When `p` expires.
    private func deadline(_ p: Pending) -> Nanos {
        switch p {
        case .silent(_, let a): a &+ config.firstByteTimeout
        case .greeted(_, let a), .introduced(_, let a, _): a &+ config.greetingTimeout
        case .asking(_, _, _, _, let d, _): d
        }
    }

    /// The next instant at which `expire` has work: a deadline, or the turn of a share waiting to be opened.
    /// (Runs after every event the driver handles: one pass over the pending connections, nothing allocated.)
    func nextDeadline() -> Nanos? {
        var next: Nanos?
        for p in pending.values {
            let d = deadline(p)
            if next.map({ d < $0 }) ?? true { next = d }
        }
        if !shareTurns.isEmpty, next.map({ nextOpening < $0 }) ?? true { next = nextOpening }
        return next
    }

    // MARK: Events

    /// A connection from `host` (its address bytes) was accepted.
    mutating func accepted(_ id: PendingID, host: [UInt8], now: Nanos) -> OnAccepted {
        precondition(pending[id] == nil, "pending ids are unique")
        guard !stopped else { return .refuse(id) }
        guard !isRationed(host, now: now) else {
            counters.rationedConnections += 1
            return .refuse(id)
        }
        var victim: PendingID?
        let fromHost = pending.filter { $0.value.host == host }
        if fromHost.count >= config.maximumPendingPerHost {
            victim = evictionCandidate(among: fromHost)
            guard victim != nil else { return .refuse(id) }
        } else if pending.count >= config.maximumPending {
            victim = evictionCandidate(among: pending)
            guard victim != nil else { return .refuse(id) }
        }
        if let victim, let p = pending.removeValue(forKey: victim), !p.isSilent {
            counters.unadmittedHandshakes += 1
            // Within one address the newcomer pays for the try it pushed out (the victim's charge moves to it). From
            // another address the victim keeps its charge: it did get its answer, and an innocent caller that makes
            // room at the global cap must not pay for a searcher's tries.
            if p.host == host {
                forgive(p.host)
                charge(host, now: now)
            }
        }
        pending[id] = .silent(host: host, acceptedAt: now)
        return .greet(id, .hello(peer: config.localPeer), evicting: victim)
    }

    /// The oldest connection still handshaking, silent ones first; nil when all are asking the app.
    private func evictionCandidate(among candidates: [PendingID: Pending]) -> PendingID? {
        candidates.filter { !$0.value.isAsking }
            .min { a, b in
                if a.value.isSilent != b.value.isSilent { return a.value.isSilent }
                return (a.value.acceptedAt, a.key) < (b.value.acceptedAt, b.key)
            }?.key
    }

    /// The first bytes arrived on `id`: it is no longer silent, and it is a try of its address's.
    mutating func heard(_ id: PendingID, now: Nanos) {
        guard case .silent(let host, let a)? = pending[id] else { return }
        pending[id] = .greeted(host: host, acceptedAt: a)
        charge(host, now: now)
    }

    /// A frame arrived on a pending connection.
    mutating func received(_ frame: ControlFrame, on id: PendingID, now: Nanos) -> OnFrame {
        guard let p = pending[id] else { return .wait }
        switch (p, frame) {
        case (.silent(let host, let a), .hello(let peer)), (.greeted(let host, let a), .hello(let peer)):
            if peer == config.localPeer { return close(id, .unexpectedFrame("our own HELLO")) }
            pending[id] = .introduced(host: host, acceptedAt: a, peer: peer)
            return .wait
        case (.introduced(let host, let a, let peer), .invite(let body)):
            var wait = UInt64(body.timeoutMillis) * 1_000_000
            if wait == 0 { wait = 30_000_000_000 }
            pending[id] = .asking(host: host, acceptedAt: a, peer: peer, invite: body,
                                  deadline: now &+ min(wait, config.maximumInvitationWait), share: .held)
            return .ask(id, peer, body)
        default:
            return close(id, .unexpectedFrame(frame.name))
        }
    }

    /// The app answered the invitation on `id`.
    mutating func answered(_ id: PendingID, _ answer: Answer) -> OnAnswer {
        guard case .asking(_, _, let peer, let invite, _, _)? = pending[id] else { return .ignore }
        pending[id] = nil
        shareTurns.remove(id)
        switch answer {
        case .accept:
            // Still charged: the session may yet turn the caller away (`admitted` forgives it once it is in).
            return .handOver(id, peer, invite)
        case .decline(let reason, let text):
            counters.unadmittedHandshakes += 1
            return .decline(id, reason, text)
        }
    }

    /// The app showed the digits of the invitation on `id` to a person: its caller may have its share of them, now
    /// if no other share was opened within `revealInterval` and none waits, else in its turn.
    mutating func revealRequested(_ id: PendingID, now: Nanos) -> OnReveal {
        guard let p = pending[id], case .asking(let host, _, _, _, _, .held) = p else { return .wait }
        if now >= nextOpening, shareTurns.isEmpty {
            nextOpening = now &+ config.revealInterval
            pending[id] = p.with(share: .opened)
            return .open(id)
        }
        pending[id] = p.with(share: .queued)
        shareTurns.append(id, address: host)
        return .wait
    }

    /// Where the share of the digits of the invitation on `id` stands (nil: no invitation the app holds).
    func share(of id: PendingID) -> Share? {
        if case .asking(_, _, _, _, _, let s)? = pending[id] { s } else { nil }
    }

    /// The address (or relayed caller) `id`'s tries are charged to.
    func rationKey(of id: PendingID) -> [UInt8]? { pending[id]?.host }

    /// A caller handed over from `rationKey` is in the session: its try is forgiven.
    mutating func admitted(rationKey: [UInt8]) { forgive(rationKey) }

    /// Whether `id` is an invitation the app holds.
    func isAsking(_ id: PendingID) -> Bool { pending[id]?.isAsking ?? false }

    /// The connection ended (the caller hung up, or it failed). An invitation the app holds is withdrawn.
    mutating func closed(_ id: PendingID) {
        end(id)
    }

    /// Time passed: close callers that never invited, decline invitations not answered in time, and open the share
    /// of the digits whose turn has come.
    mutating func expire(now: Nanos) -> [OnExpiry] {
        var out: [OnExpiry] = []
        for id in pending.keys.sorted() where deadline(pending[id]!) <= now {
            if case .asking = pending[id]! { out.append(.decline(id, .timedOut)) } else { out.append(.close(id)) }
            end(id)
        }
        if now >= nextOpening, let id = shareTurns.next(), let p = pending[id] {
            nextOpening = now &+ config.revealInterval
            pending[id] = p.with(share: .opened)
            out.append(.open(id))
        }
        return out
    }

    /// The advertiser stops: every pending invitation is declined as unavailable, the rest closed.
    mutating func stop() -> [OnExpiry] {
        stopped = true
        counters.unadmittedHandshakes += UInt64(pending.values.filter { !$0.isSilent }.count)
        let out = pending.keys.sorted().map { id -> OnExpiry in
            if case .asking = pending[id]! { .decline(id, .unavailable) } else { .close(id) }
        }
        pending.removeAll()
        shareTurns.removeAll()
        return out
    }

    private mutating func close(_ id: PendingID, _ fault: PeerFault) -> OnFrame {
        end(id)
        return .close(id, fault)
    }

    // MARK: The ration of tries

    /// Forgets `id`, which ended without being admitted: if its caller spoke, the try keeps its charge.
    private mutating func end(_ id: PendingID) {
        shareTurns.remove(id)
        guard let p = pending.removeValue(forKey: id), !p.isSilent else { return }
        counters.unadmittedHandshakes += 1
    }

    /// One more try for `host`.
    private mutating func charge(_ host: [UInt8], now: Nanos) {
        tryDebt[host] = tryPace.charged(tryDebt[host] ?? 0, now: now)
        if tryDebt.count > config.maximumRationedHosts { forgetPaidDebts(now: now) }
    }

    /// One try of `host`'s taken back (a debt already paid off stays paid).
    private mutating func forgive(_ host: [UInt8]) {
        guard let debt = tryDebt[host] else { return }
        tryDebt[host] = debt >= config.tryInterval ? debt - config.tryInterval : 0
    }

    /// Whether `host` has used its burst, as of `now`: `tryBurst` tries at once, then one per interval.
    private func isRationed(_ host: [UInt8], now: Nanos) -> Bool {
        guard let debt = tryDebt[host] else { return false }
        return tryPace.isRationed(debt, now: now)
    }

    /// Addresses whose tries are remembered (for tests of the table's bound).
    var rationedHostCount: Int { tryDebt.count }

    /// Keeps the table within `maximumRationedHosts`: paid debts go first, then the smallest, down to 7/8 of it, so
    /// that a table kept full (by a searcher with more addresses than it holds) is trimmed once per eighth of its
    /// size, not on every try. Such a searcher makes the table forget its newest addresses first: it is not bounded
    /// per address anyway (docs/PROTOCOL.md §3.2).
    private mutating func forgetPaidDebts(now: Nanos) {
        tryDebt = tryDebt.filter { $0.value > now }
        let keep = max(1, config.maximumRationedHosts * 7 / 8)
        guard tryDebt.count > keep else { return }
        for (host, _) in tryDebt.sorted(by: { $0.value < $1.value }).prefix(tryDebt.count - keep) { tryDebt[host] = nil }
    }
}
