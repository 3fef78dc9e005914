/// Happy Eyeballs for one outgoing TCP connection (RFC 8305 §5, without its address sorting: the caller's order
/// stands), as a pure state machine; `Connection` is its driver (it opens and closes the sockets and keeps the timer).
///
/// Candidate 0 is connecting when the race begins. The next candidate starts as soon as one fails, or when the last
/// one started has not connected within `stagger`; the first to connect wins, and the others still connecting are
/// abandoned (closed before a byte is written to them, so a peer that hears of one at all hears an empty
/// connection). An address that drops connection attempts (a firewall, a subnet with no route back) so costs the
/// stagger, not the whole time an address is given to answer.
///
/// At most `maximumConnecting` connect at once: past that, the next one's start sets the oldest still connecting
/// aside (its socket closed). So one race holds a few sockets however many addresses it has — which matters when the
/// addresses are a stranger's choice (a member's introductions, §3.8 of PROTOCOL.md: 32 may be in flight, each with
/// up to 16 addresses) — and starts at most one connect a `stagger`, beyond those that replace a failure.
///
/// Candidates abandoned, set aside or never started are untried: the `Outcome` hands them back to the caller, in
/// their order, which may race them again if the winner does not lead to the peer it wants or the race is called
/// off or lost (a real address whose first SYN was lost, set aside before the kernel sent it again, so still gets
/// its chance; the caller counts an address set aside twice as spent). Candidates that failed or won are spent, and
/// so are, when the race is called off, those still connecting that had as long as one set aside (`maximumConnecting`
/// staggers), and the oldest still connecting when none has failed: every race spends at least one.
struct ConnectRace: Sendable {
    /// How the race ended, once: who won (nil: nobody), and the candidates still untried, in order.
    struct Outcome: Equatable, Sendable {
        /// The candidate that connected first; nil when all failed, or the race was called off (`callOff`).
        var winner: Int?
        /// The candidates abandoned when another won, or never started, or still connecting but young when the race
        /// was called off, in order (see the type's description).
        var untried: [Int]
        /// The candidates the cap set aside, in order: untried too.
        var setAside: [Int] = []
    }

    /// What a connect that finished means.
    enum OnConnected: Equatable, Sendable {
        /// The candidate won (the outcome's winner): close `abandon` (still connecting), and use the winner's socket.
        case won(abandon: [Int], Outcome)
        /// The race is over, or the candidate was not in it: close its socket.
        case ignore
    }

    /// What a failed connect (or one that could not even be started) means.
    enum OnFailed: Equatable, Sendable {
        /// Start this candidate now (its failure to start is another `failed`).
        case start(Int)
        /// Others are still connecting: wait for them (and the timer).
        case wait
        /// Every candidate failed: the connection fails with this one's error.
        case lost(Outcome)
        /// The race is over, or the candidate was not in it.
        case ignore
    }

    /// What the timer means.
    enum OnTimer: Equatable, Sendable {
        /// Start this candidate now: the last one started has had its `stagger`. `setAside`: close this one first,
        /// the oldest still connecting (`maximumConnecting` are); it is untried.
        case start(Int, setAside: Int?)
        /// Nothing to start yet (see `nextStart`), or nothing left to start.
        case wait
    }

    private struct Racing: Sendable {
        /// Candidates `0..<started` have been started.
        var started: Int
        /// Those of them still connecting, in order, with when each started.
        var connecting: [(candidate: Int, since: Nanos)]
        /// Those of them the cap set aside.
        var setAside: [Int] = []
        /// Whether one of them failed (the race has spent one).
        var anyFailed = false
        /// When the last one started.
        var lastStart: Nanos
    }

    private enum State: Sendable {
        case racing(Racing)
        case over
    }

    /// RFC 8305's recommended Connection Attempt Delay: on a LAN a connect that works takes well under a
    /// millisecond, so a quarter of a second still waiting means the address is not answering.
    static let connectionAttemptDelay: Nanos = 250_000_000

    /// At most this many connect at once (see the type's description).
    static let maximumConnecting = 3

    /// How many candidates there are (at least one).
    let candidates: Int
    /// At most this many connect at once.
    let maximumConnecting: Int
    /// How long the last candidate started has to connect before the next one starts.
    let stagger: Nanos
    private var state: State

    /// A race among `candidates` addresses, the first of which started connecting at `now`.
    init(candidates: Int, stagger: Nanos, now: Nanos, maximumConnecting: Int = ConnectRace.maximumConnecting) {
        precondition(candidates >= 1 && maximumConnecting >= 1, "a race needs a candidate, and room for one")
        self.candidates = candidates
        self.stagger = stagger
        self.maximumConnecting = maximumConnecting
        state = .racing(Racing(started: 1, connecting: [(0, now)], lastStart: now))
    }

    /// Whether the race is still on.
    var isRacing: Bool { if case .racing = state { true } else { false } }

    /// When the timer should next fire: the moment the next candidate starts if none connects or fails before;
    /// nil when nothing is left to start or the race is over.
    var nextStart: Nanos? {
        guard case .racing(let r) = state, r.started < candidates else { return nil }
        return r.lastStart &+ stagger
    }

    /// `candidate`'s connect finished.
    mutating func connected(_ candidate: Int) -> OnConnected {
        guard case .racing(let r) = state, r.connecting.contains(where: { $0.candidate == candidate }) else { return .ignore }
        state = .over
        let abandon = r.connecting.map(\.candidate).filter { $0 != candidate }
        return .won(abandon: abandon, Outcome(winner: candidate, untried: abandon + Array(r.started..<candidates),
                                              setAside: r.setAside))
    }

    /// `candidate`'s connect failed (refused, unreachable, reset), or it could not be started.
    mutating func failed(_ candidate: Int, now: Nanos) -> OnFailed {
        guard case .racing(var r) = state, let i = r.connecting.firstIndex(where: { $0.candidate == candidate }) else {
            return .ignore
        }
        r.connecting.remove(at: i)
        r.anyFailed = true
        if r.started < candidates {
            let next = r.started
            r.started += 1
            r.connecting.append((next, now))
            r.lastStart = now
            state = .racing(r)
            return .start(next)
        }
        guard r.connecting.isEmpty else {
            state = .racing(r)
            return .wait
        }
        state = .over
        return .lost(Outcome(winner: nil, untried: [], setAside: r.setAside))
    }

    /// The timer fired at `now`.
    mutating func timerFired(now: Nanos) -> OnTimer {
        guard case .racing(var r) = state, r.started < candidates, now >= r.lastStart &+ stagger else { return .wait }
        let setAside = r.connecting.count >= maximumConnecting ? r.connecting.removeFirst().candidate : nil
        if let setAside { r.setAside.append(setAside) }
        let next = r.started
        r.started += 1
        r.connecting.append((next, now))
        r.lastStart = now
        state = .racing(r)
        return .start(next, setAside: setAside)
    }

    /// What calling the race off at `now` would hand back (see `callOff`); nil when the race is over.
    func outcomeIfCalledOff(now: Nanos) -> Outcome? {
        guard case .racing(let r) = state else { return nil }
        // Those that had as long as one set aside are spent, and so is the oldest when nothing else is: the rest
        // started too late to tell.
        let candidates = r.anyFailed ? r.connecting[...] : r.connecting.dropFirst()
        let young = candidates.filter { now &- $0.since < UInt64(maximumConnecting) &* stagger }
        return Outcome(winner: nil, untried: young.map(\.candidate) + Array(r.started..<self.candidates), setAside: r.setAside)
    }

    /// The race is called off at `now` (its owner gave up on the connection, or its time ran out): those still
    /// connecting that had as long as one set aside are spent, and so is the oldest when none has failed; the rest,
    /// those set aside and those never started are untried. Nil when the race was already over.
    mutating func callOff(now: Nanos) -> Outcome? {
        let outcome = outcomeIfCalledOff(now: now)
        state = .over
        return outcome
    }
}
