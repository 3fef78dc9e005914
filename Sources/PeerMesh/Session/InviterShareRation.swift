/// The inviter's ration of handshakes that give its share of the digits away for nothing, as a pure state machine
/// (docs/PROTOCOL.md §3.2).
///
/// An inviter opens its nonce in handshake message 3, so whoever answered knows the inviter's digits from then on;
/// the inviter learns the other side's only when that side opens its share (SAS-NONCE), which a man in the middle
/// facing the inviter never has to do. When the digits it learned are not the ones it needs, it just lets the
/// invitation fail (declines, or hangs up). So every invitation that ends unaccepted after message 3 may have been a
/// silent guess, and an app that re-invites by itself after each failure would give one guess per round trip.
///
/// A session rations them as an advertiser rations tries per address: each message 3 is a charge, forgiven only when
/// its invitation is accepted (the link comes up, which in Noise mode needs the advertiser's SAS-NONCE first: the
/// inviter's app was told the digits); a session may have `burst` unforgiven charges at once and then one per
/// `interval`. Past that, a message 3 waits its turn (`approved` says `.wait`; `expire` and `accepted` return the
/// links whose turn came), round-robin across the addresses invited and oldest first within one, so that the links
/// waiting for other addresses delay it by one turn per address; one whose invitation ends while it waits is dropped
/// and charges nothing, and so is one whose peer connects meanwhile through another link (`connected`): its
/// message 3 would give a share away for an invitation the peer can only decline. Forgiving takes back only what of
/// that charge is still unpaid, and moves the later charges up by as much, so a charge time has already paid off
/// frees no room for later ones and none is forgiven twice.
///
/// So a man in the middle gets at most `burst + t / interval` silent guesses in `t` seconds from one session, however
/// fast its app re-invites, and a session waits only once `burst` of its message 3s are neither forgiven nor paid off
/// by time (so invitations that are accepted wait only while more than `burst` are in flight at once). Links whose
/// key connection data pinned are not rationed at all: the driver does not ask.
struct InviterShareRation: Sendable {
    /// The ration's size and pace.
    struct Configuration: Equatable, Sendable {
        /// Unforgiven message 3s a session may have at once before the next one waits.
        var burst: Int = 16
        /// After the burst, one per this interval.
        var interval: Nanos = 1_000_000_000
    }

    /// What to do with a link whose peer the app approved.
    enum OnApproved: Equatable, Sendable {
        /// Finish the handshake now (send message 3).
        case open
        /// Hold message 3: its turn comes at `nextDeadline()`, or sooner when an earlier invitation is accepted.
        case wait
    }

    /// The ration's size and pace.
    let configuration: Configuration
    private let pace: RationPace
    /// The time at which the charges are paid off (a virtual scheduling time, as in GCRA: each charge moves it one
    /// `interval` on from at least now; a forgiven one moves it back).
    private var debt: Nanos = 0
    /// Links whose message 3 went out and whose invitation is not yet accepted or ended, each with the time at which
    /// its charge is paid off (the debt just after it was charged, moved up as earlier ones are forgiven).
    private var opened: [LinkID: Nanos] = [:]
    /// The links whose message 3 waits its turn, by the address each invites.
    private var waiting = TurnQueue<LinkID>()
    /// The peer each waiting link's handshake proved it reaches.
    private var waitingPeer: [LinkID: PeerID] = [:]

    init(configuration: Configuration = Configuration()) {
        pace = RationPace(burst: configuration.burst, interval: configuration.interval)
        self.configuration = configuration
    }

    /// Links whose message 3 waits.
    var waitingCount: Int { waiting.count }

    /// When the next waiting link's turn comes (nil: none waits).
    func nextDeadline() -> Nanos? {
        waiting.isEmpty ? nil : pace.nextCharge(after: debt)
    }

    // MARK: Events

    /// The app approved `peer` on `link`, which invites `destination` (its address), and its certificate check
    /// said yes: open now, or wait.
    mutating func approved(_ link: LinkID, peer: PeerID, destination: [UInt8], now: Nanos) -> OnApproved {
        precondition(opened[link] == nil && !waiting.contains(link), "a link is approved once")
        // A link never overtakes one that waits.
        guard waiting.isEmpty, !isRationed(now: now) else {
            waiting.append(link, address: destination)
            waitingPeer[link] = peer
            return .wait
        }
        charge(link, now: now)
        return .open
    }

    /// `link`'s invitation was accepted: what of its charge is still unpaid is forgiven, and the charges made after it
    /// move up by as much. Returns the waiting links whose turn has come.
    mutating func accepted(_ link: LinkID, now: Nanos) -> [LinkID] {
        if let paidOff = opened.removeValue(forKey: link), paidOff > now {
            let unpaid = min(paidOff - now, configuration.interval)
            debt = debt >= unpaid ? debt - unpaid : 0
            // The charges made after it are paid off that much sooner now: without this, forgiving one of them later
            // would give back time it no longer owes.
            for (other, p) in opened where p > paidOff { opened[other] = p - unpaid }
        }
        return turnsDue(now: now)
    }

    /// `link` ended unaccepted (declined, failed, timed out, closed): an opened one keeps its charge, a waiting one
    /// is dropped without one.
    mutating func ended(_ link: LinkID) {
        opened[link] = nil
        waiting.remove(link)
        waitingPeer[link] = nil
    }

    /// `peer` is connected, through another link: the links that wait to finish a handshake with it are dropped
    /// without a charge and returned, oldest first, for the driver to end as already connected.
    mutating func connected(_ peer: PeerID) -> [LinkID] {
        let superseded = waitingPeer.filter { $0.value == peer }.map(\.key).sorted()
        for link in superseded {
            waiting.remove(link)
            waitingPeer[link] = nil
        }
        return superseded
    }

    /// Time passed: the waiting links whose turn has come, in turn order (each now holds a charge).
    mutating func expire(now: Nanos) -> [LinkID] { turnsDue(now: now) }

    // MARK: The ration

    private mutating func turnsDue(now: Nanos) -> [LinkID] {
        var due: [LinkID] = []
        while !isRationed(now: now), let link = waiting.next() {
            waitingPeer[link] = nil
            charge(link, now: now)
            due.append(link)
        }
        return due
    }

    private mutating func charge(_ link: LinkID, now: Nanos) {
        debt = pace.charged(debt, now: now)
        opened[link] = debt
    }

    /// Whether the burst is used up as of `now`: `burst` charges at once, then one per interval.
    private func isRationed(now: Nanos) -> Bool { pace.isRationed(debt, now: now) }
}
