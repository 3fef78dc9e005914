import PeerMesh

/// How a player finds its host.
public enum JoinTarget: Sendable, Equatable {
    /// Browse DNS-SD; join the host with this name, or the first found when `nil`. A paired host goes by the name it
    /// was paired under (or its key's fingerprint), not by the one it advertises: see `JoinStateMachine.matches`.
    case discover(hostName: String?)
    /// Invite the advertiser at a known address, without mDNS.
    case direct(PeerEndpoint)
}

/// The player's join logic as a pure state machine: search, invite, join, and after a loss go back to searching
/// and rejoin. Direct connects back off, and are bounded until the first join (an address that never answers is a
/// mistake to report); after a join they go on every 2 s until the host is back. Time is passed in (nanoseconds).
public struct JoinStateMachine: Sendable {
    /// What the driver must do.
    public enum Action: Sendable, Equatable {
        /// Invite this discovered host.
        case invite(PeerID)
        /// Connect to the address (direct mode).
        case connect(PeerEndpoint)
        /// Tell the user (one line).
        case announce(String)
        /// Stop: the join cannot succeed. The text says why.
        case giveUp(String)
    }

    /// The player's phase, for status lines.
    public enum Phase: Sendable, Equatable {
        case searching
        case joining(String)
        case joined(String)
        case stopped
    }

    private enum State {
        case searching
        case joining(host: PeerID?, deadline: UInt64)
        case joined(host: PeerID)
        case waitingToRetry(until: UInt64)
        case stopped
    }

    /// Which host to join: one found by DNS-SD (by display name, or the first), or the advertiser at a known address.
    public let target: JoinTarget
    /// Direct connects tried in a row before giving up, before the first join (after it, a round this long is said
    /// once, and the attempts go on).
    public let maximumAttempts: Int
    /// How long one invitation may take.
    public let inviteTimeout: UInt64

    private var state: State = .searching
    private var candidates: [PeerID] = []
    private var attempts = 0
    /// Discovered hosts that did not answer at their advertised address (a killed host's record lingers), with how
    /// many times in a row. A stale host is tried again the moment it re-advertises (a restart's new port), and
    /// otherwise only after a long backoff: a stale record costs one failed attempt, not one every 250 ms.
    private var stale: [PeerID: Int] = [:]
    /// The host being joined re-advertised meanwhile: if this attempt finds nobody, the next one goes at once.
    private var readvertisedWhileJoining = false
    /// Failed invitations in a row per discovered host (not unreachable ones): the next try backs off 0.25 s, 0.5 s,
    /// 1 s, then 2 s, so a host that keeps refusing (full, busy) is not invited four times a second for ever.
    private var failures: [PeerID: Int] = [:]
    /// Hosts that refused this player for good (not paired, declined) while others were found to try: not invited
    /// again in this run (at most `maximumRefused` are kept).
    private var refused: Set<PeerID> = []
    private static let maximumRefused = 256
    /// Whether a host was joined since the start: a name that does not resolve then is the host gone (rebooting),
    /// not a typo.
    private var hasJoined = false
    /// Why the latest direct attempt past a round failed (said again only when it changes).
    private var lastRoundReason: String?
    /// The host joined last (nil before the first join).
    private var lastJoined: PeerID?
    /// The names hosts were paired under, as the driver said when it found them or joined them: announcements and
    /// phases call a host so. Kept for hosts found and for the host joined.
    private var pairedNames: [PeerID: String] = [:]

    /// A machine that starts searching for `target`.
    public init(target: JoinTarget, maximumAttempts: Int = 5, inviteTimeoutNanos: UInt64 = 5_000_000_000) {
        self.target = target
        self.maximumAttempts = maximumAttempts
        inviteTimeout = inviteTimeoutNanos
    }

    /// Where joining stands, for status lines.
    public var phase: Phase {
        switch state {
        case .searching, .waitingToRetry: .searching
        case .joining(let h, _): .joining(h.map(name(of:)) ?? describeTarget)
        case .joined(let h): .joined(name(of: h))
        case .stopped: .stopped
        }
    }

    private var describeTarget: String {
        switch target {
        case .discover(let name): name ?? "first host found"
        case .direct(let e): e.description
        }
    }

    /// Begins: direct mode connects at once; discovery mode waits for `found`.
    public mutating func start(now: UInt64) -> [Action] {
        switch target {
        case .direct(let e):
            attempts = 1
            state = .joining(host: nil, deadline: now + inviteTimeout)
            return [.connect(e)]
        case .discover(let name):
            return [.announce(name.map { "searching for host \"\($0)\"…" } ?? "searching for a host…")]
        }
    }

    /// What to call `peer`: the name it was paired under, if the driver said so, else the name it gives.
    public func name(of peer: PeerID) -> String { pairedNames[peer] ?? peer.displayName }

    /// Whether `peer` is the host `name` names (case-insensitive), or has a key whose fingerprint starts with `name`
    /// (at least 4 characters). A paired host (`pairedName` not nil) is named by the name it was paired under, never
    /// by the one it advertises: any paired host may advertise any name, so a name it chose cannot tell it from
    /// another. A host that is not paired (a player that joins any host) goes by its advertised name.
    /// `nameIsPaired` says that some host was paired under `name`: then `name` names that host alone — not another
    /// whose key was ground to a fingerprint that starts so, nor one that advertises it.
    public static func matches(_ peer: PeerID, pairedName: String?, name: String, nameIsPaired: Bool = false) -> Bool {
        if let pairedName, pairedName.lowercased() == name.lowercased() { return true }
        if nameIsPaired { return false }
        if pairedName == nil, peer.displayName.lowercased() == name.lowercased() { return true }
        return peer.publicKey?.matches(fingerprintPrefix: name) ?? false
    }

    /// The browser found a host, or a host re-advertised (new address or name). `pairedName` is the name it was
    /// paired under, when it is paired; `nameIsPaired`, whether some host was paired under the name `target` asks
    /// for (`matches`).
    public mutating func found(_ peer: PeerID, pairedName: String? = nil, nameIsPaired: Bool = false, now: UInt64) -> [Action] {
        guard case .discover(let wanted) = target else { return [] }
        if let wanted, !Self.matches(peer, pairedName: pairedName, name: wanted, nameIsPaired: nameIsPaired) { return [] }
        guard !refused.contains(peer) else { return [] }
        pairedNames[peer] = pairedName
        let known = candidates.firstIndex(of: peer)
        if let i = known { candidates[i] = peer } else { candidates.append(peer) }
        // A host that did not answer has re-advertised (it has most likely restarted), or a host appeared (or
        // reappeared after its record went away) while waiting to retry another: try it now.
        let wasStale = stale.removeValue(forKey: peer) != nil
        switch state {
        case .searching: return join(peer, now: now)
        case .waitingToRetry where wasStale || known == nil: return join(peer, now: now)
        case .joining(let host, _) where host == peer:
            readvertisedWhileJoining = true
            return []
        default: return []
        }
    }

    /// The browser lost a host.
    public mutating func lost(_ peer: PeerID) -> [Action] {
        candidates.removeAll { $0 == peer }
        stale[peer] = nil
        failures[peer] = nil
        switch state {
        case .joining(peer?, _), .joined(peer): break
        default: pairedNames[peer] = nil
        }
        return []
    }

    /// The session reported a state for `peer`. `pairedName`, when given with `.connected`, is the name the host was
    /// paired under (what a direct connect learns only now).
    public mutating func sessionState(_ peer: PeerID, _ s: SessionState, pairedName: String? = nil, now: UInt64) -> [Action] {
        let expected: Bool = switch state {
        case .joining(let host, _): host == nil || host == peer
        // An invitation this machine had given up on (its safety deadline passed first: the driver's queue was held
        // up) connected after all: the player's session connects only hosts it invited, so it is joined.
        case .waitingToRetry, .searching: true
        case .joined, .stopped: false
        }
        switch (state, s) {
        case (_, .connected) where expected:
            state = .joined(host: peer)
            hasJoined = true
            lastJoined = peer
            attempts = 0
            lastRoundReason = nil
            stale[peer] = nil
            failures[peer] = nil
            if let pairedName { pairedNames[peer] = pairedName }
            return [.announce("joined \(name(of: peer))")]
        case (.joined(let host), .notConnected) where host == peer:
            defer { if !candidates.contains(peer) { pairedNames[peer] = nil } }
            return retry(after: "host \(name(of: peer)) went away; searching again", now: now, demote: peer)
        default:
            return []
        }
    }

    /// An invitation failed (declined, timed out, refused). A permanent failure (the host does not trust this
    /// player, or its operator said no) ends the join: retrying would not help.
    /// `unreachable` says nothing answered at the host's address (refused, or no answer): for a discovered host,
    /// its record is stale until it re-advertises. `unresolvable` says the host's name does not resolve: permanent
    /// before the first join (a name that does not exist); after it, one more failed attempt, as an address that
    /// stops answering is (a `.local` name goes away with its host). `alreadyConnected` (permanent: another player
    /// runs under this identity) is likewise one more failed attempt from the host last joined (at a direct target's
    /// address, any host whose identity is not yet known): it still holds this player's own link from before the
    /// loss, until it times it out.
    public mutating func invitationFailed(_ peer: PeerID?, reason: String, permanent: Bool = false, unreachable: Bool = false,
                                          unresolvable: Bool = false, alreadyConnected: Bool = false, now: UInt64) -> [Action] {
        guard case .joining(let host, _) = state, peer == nil || host == nil || host == peer else { return [] }
        let ownOldLink: Bool = switch target {
        case .direct: alreadyConnected && (peer == nil || peer == lastJoined)
        case .discover: alreadyConnected && (peer ?? host) == lastJoined
        }
        let endsJoin = hasJoined ? permanent && !ownOldLink : permanent || unresolvable
        if endsJoin {
            if case .discover(nil) = target, let host, candidates.contains(where: { $0 != host && stale[$0] == nil }) {
                // Any host will do, and another that answers was found: this one's answer is this host's alone. (A
                // stale record is no host to go on for: with only those left, the join ends as it would alone.)
                if refused.count >= Self.maximumRefused, let any = refused.first { refused.remove(any) }
                refused.insert(host)
                candidates.removeAll { $0 == host }
                stale[host] = nil
                failures[host] = nil
                let next = candidates.first { stale[$0] == nil }!
                return [.announce("\(reason); trying another host")] + join(next, now: now)
            }
            state = .stopped
            return [.giveUp(reason)]
        }
        if case .direct(let e) = target, attempts >= maximumAttempts {
            let message = "cannot join \(e): \(reason) (\(attempts) attempts)"
            guard hasJoined else {
                state = .stopped
                return [.giveUp(message)]
            }
            // It was joined before: the host is away (restarting, rebooting), as a discovered host that goes away is
            // searched for until it is back. Every 2 s from now on; said once, and again when the reason changes
            // (the host is back, but full).
            state = .waitingToRetry(until: now + 2_000_000_000)
            defer { lastRoundReason = reason }
            if attempts == maximumAttempts { return [.announce("\(message); trying every 2 s until it is back")] }
            return reason == lastRoundReason ? [] : [.announce("still cannot join \(e): \(reason)")]
        }
        if case .discover = target, unreachable, let host {
            if readvertisedWhileJoining {
                // It announced a new address while this attempt went to the old one: try the new one now.
                readvertisedWhileJoining = false
                state = .waitingToRetry(until: now)
                return [.announce("could not join \(name(of: host)): \(reason); it has advertised again")]
            }
            let times = (stale[host] ?? 0) + 1
            stale[host] = times
            let message = "could not join \(name(of: host)): \(reason)"
                + (times == 1 ? "; waiting for it to advertise again" : "")
            // Other hosts first; this one when it re-advertises, or after 2 s, 4 s, then every 5 s.
            if let i = candidates.firstIndex(of: host) { candidates.append(candidates.remove(at: i)) }
            if candidates.contains(where: { stale[$0] == nil }) {
                state = .waitingToRetry(until: now + 250_000_000)
            } else {
                state = .waitingToRetry(until: now + min(5_000_000_000, 2_000_000_000 << UInt64(min(times - 1, 2))))
            }
            return times == 1 ? [.announce(message)] : []
        }
        return retry(after: "could not join \(host.map(name(of:)) ?? describeTarget): \(reason)", now: now, demote: host)
    }

    /// Time passed: retry when a backoff expires; give up an invitation stuck past its timeout.
    public mutating func tick(now: UInt64) -> [Action] {
        switch state {
        case .waitingToRetry(let until) where now >= until:
            switch target {
            case .direct(let e):
                attempts += 1
                state = .joining(host: nil, deadline: now + inviteTimeout)
                return [.connect(e)]
            case .discover:
                state = .searching
                // Hosts that answered last time (or were never tried) before stale ones.
                if let next = candidates.first(where: { stale[$0] == nil }) ?? candidates.first { return join(next, now: now) }
                return []
            }
        case .joining(let host, let deadline) where now >= deadline + 1_000_000_000:
            // The session reports invitation timeouts itself; this only guards against a lost report.
            return invitationFailed(host, reason: "no answer", now: now)
        default:
            return []
        }
    }

    /// The player is shutting down.
    public mutating func stop() { state = .stopped }

    private mutating func join(_ peer: PeerID, now: UInt64) -> [Action] {
        readvertisedWhileJoining = false
        state = .joining(host: peer, deadline: now + inviteTimeout)
        return [.announce("found host \(name(of: peer)); joining"), .invite(peer)]
    }

    private mutating func retry(after message: String, now: UInt64, demote: PeerID?) -> [Action] {
        // Try other hosts before the one that just failed (a killed host's advertisement may linger).
        if let demote, let i = candidates.firstIndex(of: demote) { candidates.append(candidates.remove(at: i)) }
        // Back off 0.25 s, 0.5 s, 1 s, 2 s (capped) between direct attempts, and between failed invitations of the
        // same discovered host; another host found meanwhile is tried after 0.25 s.
        var times = attempts
        if case .discover = target, let demote {
            failures[demote, default: 0] += 1
            times = candidates.contains(where: { $0 != demote && stale[$0] == nil }) ? 1 : failures[demote]!
        }
        let shift = UInt64(min(max(times - 1, 0), 3))
        state = .waitingToRetry(until: now + (250_000_000 << shift))
        return [.announce(message)]
    }
}
