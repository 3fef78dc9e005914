import FoundationEssentials
import MeshPOSIX

/// A connection being made to one peer, one step at a time, until one leads to it: the addresses an advertisement
/// listed (`NearbyServiceBrowser.invitePeer`: a copied announcement at another address must not hide the peer), data
/// an introduction handed us (when no address leads to the peer, the call goes through the introducer), or data the
/// app had out of band (`connectPeer(_:withNearbyConnectionData:)`). Each step is one invitation, whose connect races
/// the addresses left (Happy Eyeballs, `ConnectRace`: the next starts as soon as one still connecting fails, or when
/// the last one started has not connected within `ConnectRace.connectionAttemptDelay`); the first to connect carries
/// it. Kept by link while one of its invitations is in flight; the peer stays `connecting` from the first invitation
/// to the last (`SessionStateMachine.hold`).
struct DirectAttempt: Sendable {
    /// Who must answer: the key its invitations pin (`ExpectedKey`).
    var peer: PeerID
    /// Where to try it, in order: the addresses no step has tried yet, or whose step's race left them untried
    /// (`ConnectRace.Outcome.untried`).
    var endpoints: [PeerEndpoint]
    /// Each invitation's context: the app's, or connection data's prefix and ticket.
    var context: Data
    /// How long each invitation may take (the app's timeout, or the introduction's).
    var timeout: Duration
    /// The pinned key came from connection data, not an advertisement (`ExpectedKey.fromConnectionData`).
    var keyFromConnectionData: Bool
    /// The member that passed the data on, or nil for the app's own data or an advertisement (nothing to call through).
    var introducer: PeerID?
    /// That member's introduction, as the link it makes carries it (`MembershipStateMachine.introduction(by:)`).
    var introduction: MembershipStateMachine.Introduction?
    /// The addresses the current step's connect races, in the race's order (its candidates): those the race leaves
    /// untried (`ConnectRace.Outcome`) go back to `endpoints`.
    var raced: [PeerEndpoint] = []
    /// Addresses a race has set aside once: set aside again, they are spent (re-racing addresses that drop connection
    /// attempts would otherwise multiply the connects to addresses a stranger chose).
    var setAsideOnce: Set<PeerEndpoint> = []
    /// An invitation of this attempt has started: the next one continues it, and starts only while the peer is still
    /// held (the app's `disconnect` ends the hold).
    var started = false
    /// The link is the call through the introducer: the last thing to try.
    var relayed = false
    /// The peer answered on the link and proved the expected key: whatever becomes of this invitation, the peer was
    /// found, so no other address is tried.
    var reached = false
    /// When the whole attempt, every address, must be over (a browser's: the app's timeout holds for the invitation
    /// as a whole, whatever the number of addresses); nil: each address has its own time.
    var deadline: Nanos?
}

extension DirectAttempt {
    /// The candidates of the current step's race (indices into `raced`) that `outcome` hands back, in order: its
    /// untried ones, and those set aside for the first time (set aside again, an address is spent).
    func handedBack(_ outcome: ConnectRace.Outcome) -> [Int] {
        let firstSetAside = outcome.setAside.filter { raced.indices.contains($0) && !setAsideOnce.contains(raced[$0]) }
        return (outcome.untried.filter { raced.indices.contains($0) } + firstSetAside).sorted()
    }

    /// An attempt with connection data: its addresses at its port, its ticket as the context (marked as following an
    /// introduction when it does), its key pinned.
    init(data: NearbyConnectionData, introducer: PeerID?, timeout: Duration) {
        let prefix = introducer == nil ? NearbyConnectionData.contextPrefix : NearbyConnectionData.introducedContextPrefix
        self.init(peer: data.peer, endpoints: data.addresses.map { PeerEndpoint(host: $0, port: data.port) },
                  context: Data(prefix + data.ticket), timeout: timeout,
                  keyFromConnectionData: true, introducer: introducer)
    }
}

/// Relayed links: the driver of `RelayStateMachine` (loop thread only). A member that cannot reach another directly
/// calls it through their introducer: both ends run an ordinary connection (Noise XX, the ticket, every frame) over
/// their side of a `socketpair`, whose other side is a `RelayEnd` carrying the bytes in relay frames.
extension SessionCore {
    /// How long an address of connection data (an introduction's, or the app's) may take to answer with the
    /// expected key before the next one is tried; an introduction's invitations also end then.
    var introductionTimeout: Duration { .nanoseconds(Int64(min(max(peerTimeout, 5_000_000_000), 30_000_000_000))) }

    /// Connects to `peer` with connection data an introducer passed on: directly, or, when that cannot be done,
    /// through the introducer. Returns whether an attempt started.
    func connectIntroduced(_ peer: PeerID, data bytes: [UInt8], introducer: PeerID) -> Bool {
        guard preference != .none, case .success(let data) = NearbyConnectionData.decode(bytes),
              data.peer.identity == peer.identity, peer.publicKey == nil || peer.publicKey == data.peer.publicKey,
              data.forIdentity == self.peer.identity
        else { return false }  // data that leads nowhere: nothing to connect to
        // In flight at once: at most a member's share of introductions from one introducer (by identity, so that
        // one that leaves and comes back to start again gets no more), and twice that from all of them, so that
        // members that introduce without end together cannot have us open more connections to addresses they chose.
        // An honest mesh introduces a newcomer to `maximumPeers − 2` members at most, through one of them.
        let share = io.value.membership.maximumIntroducedPerMember
        let inFlight = io.value.attempts.values.compactMap { $0.introducer?.identity }
        guard inFlight.count < 2 * share, inFlight.filter({ $0 == introducer.identity }).count < share else { return false }
        // Nor does one for which there is no room open a connection only to be turned away.
        guard shared.withLock({ $0.machine.hasRoom(for: data.peer) }) else { return false }
        var attempt = DirectAttempt(data: data, introducer: introducer, timeout: introductionTimeout)
        attempt.introduction = io.value.membership.introduction(by: introducer)
        if configuration.relaysIntroductions { attempt.endpoints.removeAll() }  // straight to the call
        if configuration.introductionDelayNanos > 0 {  // tests only: followed later, or counted as not followed
            loop.schedule(at: MonotonicClock.nowNanos() + configuration.introductionDelayNanos) { [weak self] in
                guard let self, advance(attempt) != nil else { return }
                io.value.membership.notFollowed(peer, introducedBy: introducer)
                counters.add { $0.introductionsNotFollowed += 1 }
            }
            return true
        }
        return advance(attempt) == nil  // when nothing could be started, nothing is held and nothing reported
    }

    /// Connects with connection data the app had (`connectPeer`): each address in turn until one leads to the peer;
    /// once the peer answers, its invitation has the usual 30 s. Returns the error of the last address when none could
    /// even be started (nothing is reported then).
    func connectDirect(_ data: NearbyConnectionData) -> PeerMeshError? {
        precondition(loop.inLoop)
        return advance(DirectAttempt(data: data, introducer: nil, timeout: .seconds(30)))
    }

    /// Invites `peer`, found by a browser at `endpoints`, each in turn until one leads to it (answers and proves the
    /// advertised key). Returns the error of the last endpoint when none could even be started (nothing is reported
    /// then).
    func inviteFound(_ peer: PeerID, at endpoints: [PeerEndpoint], context: Data, timeout: Duration) -> PeerMeshError? {
        precondition(loop.inLoop)
        var attempt = DirectAttempt(peer: peer, endpoints: endpoints, context: context, timeout: timeout,
                                    keyFromConnectionData: false, introducer: nil)
        attempt.deadline = MonotonicClock.deadline(after: UInt64(timeout.nanoseconds))
        return advance(attempt)
    }

    /// Starts the next step of `attempt`: an invitation to its next endpoint that one can be started to (one with a
    /// route, a scope that exists here), its connect raced by the other numeric endpoints left, or after the last,
    /// the call through its introducer. The peer is held `connecting` while it runs; a step that continues an attempt
    /// starts only while that hold stands (the app's `disconnect` ends it). A step that does not answer with the
    /// expected key within `introductionTimeout` (or its share of the deadline) gives way to the next (`notAnswered`).
    /// Returns nil when a step is under way, or the last error when nothing is left.
    private func advance(_ attempt: DirectAttempt) -> PeerMeshError? {
        var attempt = attempt
        var lastError = PeerMeshError.transport("no address is known for \(attempt.peer.displayName)")
        while let endpoint = attempt.endpoints.first {
            // Within a deadline, each address left gets its share of the time left to answer in, and the one that
            // answers keeps the rest.
            var stepTimeout = attempt.timeout, noAnswer = introductionTimeout
            if let deadline = attempt.deadline {
                let now = MonotonicClock.nowNanos()
                guard deadline > now else { return .timedOut("no address of \(attempt.peer.displayName) answered in time") }
                let remaining = deadline - now, left = UInt64(attempt.endpoints.count)
                stepTimeout = .nanoseconds(Int64(clamping: remaining))
                // Never less than a second (a handshake's time), however many addresses: the plainly named ones,
                // the peer's own, come first.
                let share = max(remaining / left, min(remaining, 1_000_000_000))
                noAnswer = min(noAnswer, .nanoseconds(Int64(clamping: share)))
            }
            attempt.endpoints.removeFirst()
            // The other numeric addresses left race this one's connect (Happy Eyeballs): one that drops connection
            // attempts costs the race's stagger, not the step's time.
            var seen: Set<PeerEndpoint> = [endpoint]
            let alternates = attempt.endpoints.filter { seen.insert($0).inserted }.compactMap { e in
                SocketAddress(numericHost: e.host, port: e.port).map { (endpoint: e, address: $0) }
            }
            let link: LinkID
            do {
                link = try invite(expected: attempt.peer, endpoint: endpoint, alternates: alternates.map(\.address),
                                  context: attempt.context, timeout: stepTimeout,
                                  keyFromConnectionData: attempt.keyFromConnectionData,
                                  attempt: step(of: attempt, holding: stepTimeout))
            } catch {
                switch error {
                case .cancelled, .sessionClosed, .invalidParameter: return error  // nothing more to try
                default: lastError = error
                }
                continue
            }
            attempt.raced = [endpoint] + alternates.map(\.endpoint)
            attempt.endpoints.removeAll { attempt.raced.contains($0) }
            attempt.started = true
            io.value.attempts[link] = attempt
            if !attempt.endpoints.isEmpty || attempt.raced.count > 1 || attempt.introducer != nil {
                let due = MonotonicClock.nowNanos() &+ UInt64(noAnswer.nanoseconds)
                loop.schedule(at: due) { [weak self] in self?.notAnswered(link, address: endpoint.host, within: noAnswer) }
            }
            return nil
        }
        guard attempt.introducer != nil else { return lastError }
        return call(attempt)
    }

    /// The connect of the attempt's invitation on `link` raced its addresses: those left untried go back to the
    /// attempt (before its next step, if it needs one).
    func raceDecided(_ outcome: ConnectRace.Outcome, on link: LinkID) {
        guard var attempt = io.value.attempts[link] else { return }
        let back = attempt.handedBack(outcome)
        for i in outcome.setAside where attempt.raced.indices.contains(i) { attempt.setAsideOnce.insert(attempt.raced[i]) }
        attempt.endpoints = back.map { attempt.raced[$0] } + attempt.endpoints
        attempt.raced = []
        io.value.attempts[link] = attempt
    }

    /// An attempt's invitation on `link` was answered by the peer, proving the data's key: no other address is tried.
    func reachedAttempt(on link: LinkID) {
        io.value.attempts[link]?.reached = true
    }

    /// The attempt's address on `link` has not answered with the expected key within `time`: the invitation ends
    /// (timed out), and the attempt goes on to its next step.
    private func notAnswered(_ link: LinkID, address: String, within time: Duration) {
        guard let attempt = io.value.attempts[link], !attempt.reached else { return }
        // Nothing left to try after this step (its race is over, or calling it off would hand nothing back): the
        // invitation keeps its own time, as a last address does. Otherwise the race is called off as of the moment
        // that was decided, before the link closes.
        let now = MonotonicClock.nowNanos(), connection = io.value.connections[link]
        if attempt.endpoints.isEmpty, attempt.introducer == nil,
           connection?.raceOutcomeIfCalledOff(now: now).map({ attempt.handedBack($0).isEmpty }) ?? true {
            return
        }
        connection?.callOffRace(now: now)
        let detail = if let reached = io.value.connections[link]?.connectedRemote {
            "no answer from \(reached.host) within \(time)"   // the address whose connect won
        } else if attempt.raced.count > 1 {
            "no connection to \(attempt.raced.map(\.host).joined(separator: ", ")) within \(time)"
        } else {
            "no answer from \(address) within \(time)"
        }
        let actions = shared.withLock { $0.machine.linkClosed(link) }
        guard !actions.isEmpty else { return }  // ended meanwhile (the app disconnected): its own report stands
        io.value.failureReason[link] = .timedOut
        io.value.failureDetail[link] = detail
        perform(actions)
    }

    /// The next invitation of `attempt`, holding the peer `connecting` for `duration` (and a second more).
    private func step(of attempt: DirectAttempt, holding duration: Duration) -> AttemptStep {
        AttemptStep(continuing: attempt.started,
                    holdUntil: MonotonicClock.nowNanos() &+ UInt64(duration.nanoseconds) &+ 1_000_000_000)
    }

    /// Nothing more is tried for `peer` (unless another attempt to it is still under way): it is reported as its
    /// links say.
    func release(_ peer: PeerID) {
        guard !io.value.attempts.values.contains(where: { $0.peer == peer }) else { return }
        perform(shared.withLock { $0.machine.release(peer) })
    }

    /// An invitation ended without a connection: what became of the attempt it belonged to.
    enum AttemptOutcome: Equatable {
        /// The invitation was no attempt's: report it as usual.
        case none
        /// The attempt goes on (the next address, or the call through the introducer): the failure is not reported.
        case continuing
        /// It was the attempt's last step: report the failure, then `release(peer)`.
        case ended(PeerID)
        /// An introduction's invitation that the peer turned away because it joins us by another link (two members
        /// introduced the pair at once, docs/PROTOCOL.md §3.8), or that failed while the peer is connected: what it
        /// was for is done, so nothing is reported; `release(peer)`.
        case joinedOtherwise(PeerID)

        var joinedOtherwise: PeerID? { if case .joinedOtherwise(let peer) = self { peer } else { nil } }
    }

    /// `link`'s invitation ended without a connection, for `reason`. An attempt whose address did not lead to the
    /// peer (refused, no answer, another key) goes on to the next address, and after the last to the introducer.
    /// One whose peer answered and then declined or timed out, whose peer connected meanwhile, or whose introducer
    /// has left (its introductions are no longer followed) ends; an introduction's that ends because its peer joined
    /// us by another link (`joinedOtherwise`) is not reported.
    func continueAttempt(after link: LinkID, _ reason: DeclineReason) -> AttemptOutcome {
        guard let attempt = io.value.attempts.removeValue(forKey: link) else { return .none }
        let peer = attempt.peer
        // An introduction's invitation is moot once the peer joins us by another link: turned away for that, or
        // failed for any reason while the peer is connected.
        if attempt.introducer != nil, reason == .alreadyConnected || reason == .simultaneousInvite
            || shared.withLock({ $0.machine.primaryLink(for: peer) != nil }) {
            return .joinedOtherwise(peer)
        }
        let introducerLeft = attempt.introducer.map { i in shared.withLock { $0.machine.primaryLink(for: i) == nil } } ?? false
        guard !attempt.relayed, !attempt.reached, !introducerLeft, reason == .unavailable || reason == .timedOut,
              shared.withLock({ $0.machine.primaryLink(for: peer) == nil })
        else { return .ended(peer) }
        return advance(attempt) == nil ? .continuing : .ended(peer)
    }

    /// The app disconnected from `peer` (or from everyone, when nil): its attempts stop where they are. Only the
    /// entries of links the disconnect ended go (an attempt that started just after it keeps its own).
    func stopAttempts(to peer: PeerID?) {
        let attempts = io.value.attempts
        let kept = shared.withLock { s in
            attempts.filter { link, attempt in (peer != nil && attempt.peer != peer) || s.machine.has(link) }
        }
        io.value.attempts = kept
    }

    /// Asks the attempt's introducer for a pipe to the introduced peer and starts our invitation through it (our
    /// end of the pipe opens at once; the introducer splices it, or closes it). Returns nil when that invitation
    /// started, or why not.
    private func call(_ attempt: DirectAttempt) -> PeerMeshError? {
        guard let introducer = attempt.introducer,
              let link = shared.withLock({ $0.machine.primaryLink(for: introducer) })
        else { return .transport("the introducer is no longer connected") }
        let (key, actions) = io.value.relay.call(attempt.peer, via: link)
        io.value.relayCalls[key] = attempt
        performRelay(actions)
        // Our end is open (and its invitation started) unless the pipe or the invitation could not be made.
        return io.value.relayEnds[key] != nil ? nil : .transport("the call through the introducer could not be started")
    }

    /// Connected members and their links, for splicing.
    private func memberLinks() -> [PeerID: LinkID] {
        let members = io.value.membership.members
        return shared.withLock { s in
            var out: [PeerID: LinkID] = [:]
            for p in members { if let l = s.machine.primaryLink(for: p) { out[p] = l } }
            return out
        }
    }

    /// A relay frame from `peer` on `link`.
    func receivedRelay(_ frame: RelayFrame, on link: LinkID, from peer: PeerID) {
        let members = memberLinks()
        performRelay(io.value.relay.received(frame, on: link, from: peer, members: members))
    }

    /// `link` closed: its pipes end.
    func relayLinkClosed(_ link: LinkID) {
        performRelay(io.value.relay.linkClosed(link))
    }

    /// Closes every pipe end (the session is shutting down).
    func closeRelayEnds() {
        let ends = io.value.relayEnds.values
        io.value.relayEnds.removeAll()
        io.value.relayCalls.removeAll()
        for e in ends { e.close() }
    }

    func performRelay(_ actions: [RelayStateMachine.Action]) {
        for action in actions {
            switch action {
            case .send(let link, let frame):
                let connection = io.value.connections[link]
                connection?.send(.relay(frame))
            case .openEnd(let key, let peer, let calling):
                openEnd(key, peer: peer, calling: calling)
            case .credit(let key, let n):
                let end = io.value.relayEnds[key]
                end?.grant(n)
            case .deliver(let key, let bytes):
                let end = io.value.relayEnds[key]
                end?.deliver(bytes)
            case .closeEnd(let key):
                io.value.relayCalls[key] = nil
                let end = io.value.relayEnds.removeValue(forKey: key)
                end?.close()
            case .fault(let link, let fault):
                faulted(link, fault)
            }
        }
    }

    private func openEnd(_ key: PipeKey, peer: PeerID, calling: Bool) {
        let pair: (FileDescriptor, FileDescriptor)
        do { pair = try FileDescriptor.streamPair() } catch {
            io.value.relayCalls[key] = nil
            return performRelay(io.value.relay.endClosed(key))
        }
        let end = RelayEnd(key: key, socket: pair.0, loop: loop, core: self)
        io.value.relayEnds[key] = end
        end.start()
        if calling {
            guard var attempt = io.value.relayCalls.removeValue(forKey: key) else { return endFailed(key, other: pair.1) }
            do {
                let link = try invite(expected: attempt.peer, socket: pair.1, remote: nil, relayed: true,
                                      context: attempt.context, timeout: introductionTimeout,
                                      keyFromConnectionData: attempt.keyFromConnectionData,
                                      attempt: step(of: attempt, holding: introductionTimeout))
                attempt.relayed = true
                attempt.started = true
                io.value.attempts[link] = attempt
            } catch {
                endFailed(key, other: pair.1)
            }
        } else {
            // Only a caller we made connection data for gets through to the listener (which checks the ticket).
            guard let acceptor = owner.withLock({ $0.value })?.direct.withLock({ $0 }), acceptor.hasTicket(for: peer),
                  acceptor.advertiser.admitRelayed(pair.1, from: peer)
            else { return endFailed(key, other: pair.1) }
        }
    }

    private func endFailed(_ key: PipeKey, other: FileDescriptor) {
        other.close()
        let end = io.value.relayEnds.removeValue(forKey: key)
        end?.close()
        performRelay(io.value.relay.endClosed(key))
    }

    /// Our end of `key` read `bytes` from its connection.
    fileprivate func relayEndRead(_ key: PipeKey, _ bytes: [UInt8]) {
        performRelay(io.value.relay.send(bytes, on: key))
    }

    /// Our end of `key` passed `count` bytes on to its connection.
    fileprivate func relayEndConsumed(_ key: PipeKey, _ count: Int) {
        performRelay(io.value.relay.consumed(count, on: key))
    }

    /// Our end of `key` is finished: its connection closed or the socket failed.
    fileprivate func relayEndFinished(_ key: PipeKey) {
        let end = io.value.relayEnds.removeValue(forKey: key)
        end?.close()
        performRelay(io.value.relay.endClosed(key))
    }
}

/// This member's end of a relay pipe, on the loop: reads what its connection writes into the `socketpair` (within
/// the pipe's credit) and writes in what arrives from the far end, holding at most one window of it.
final class RelayEnd {
    let key: PipeKey
    private let socket: FileDescriptor
    private let loop: EventLoop
    private weak var core: SessionCore?
    private var registration: EventLoop.Registration?
    private var credit = 0
    private var pending: [UInt8] = []
    private var written = 0
    private var closed = false

    init(key: PipeKey, socket: FileDescriptor, loop: EventLoop, core: SessionCore) {
        self.key = key
        self.socket = socket
        self.loop = loop
        self.core = core
    }

    func start() {
        registration = loop.register(fd: socket.fd, interest: interest) { [weak self] ready in self?.handle(ready) }
    }

    /// The far end lets us send `n` more bytes.
    func grant(_ n: Int) {
        guard !closed else { return }
        credit += n
        updateInterest()
    }

    /// Bytes from the far end, for our connection.
    func deliver(_ bytes: [UInt8]) {
        guard !closed else { return }
        pending.append(contentsOf: bytes)
        flush()
        if !closed { updateInterest() }
    }

    func close() {
        guard !closed else { return }
        closed = true
        if let registration { loop.deregister(registration) }
        registration = nil
        socket.close()
        pending = []
    }

    private var interest: EventLoop.Readiness {
        var r: EventLoop.Readiness = []
        if credit > 0 { r.insert(.readable) }
        if written < pending.count { r.insert(.writable) }
        return r
    }

    private func updateInterest() {
        if let registration, !closed { loop.update(registration, interest: interest) }
    }

    private func handle(_ ready: EventLoop.Readiness) {
        guard !closed else { return }
        if written < pending.count { flush() }
        if closed { return }
        if credit > 0, ready.contains(.readable) || ready.contains(.failed) {
            read()
        } else if ready.contains(.failed), !ready.contains(.writable) || written >= pending.count {
            // Hung up with no credit to read what is left: the connection is gone either way.
            return finish()
        }
        if !closed { updateInterest() }
    }

    private func read() {
        let buffer = loop.readBuffer
        // A bounded number of reads per turn, so one busy pipe cannot starve the loop.
        for _ in 0..<16 where credit > 0 && !closed {
            let want = min(credit, RelayFrame.maximumData, buffer.count)
            switch socket.readSome(into: UnsafeMutableRawBufferPointer(rebasing: buffer[..<want])) {
            case .moved(let n):
                credit -= n
                core?.relayEndRead(key, Array(buffer[..<n]))
            case .wouldBlock:
                return
            case .endOfStream, .failed:
                return finish()
            }
        }
    }

    private func flush() {
        var moved = 0
        while written < pending.count {
            let r = pending.withUnsafeBytes { raw in socket.writeSome(UnsafeRawBufferPointer(rebasing: raw[written...])) }
            switch r {
            case .moved(let n):
                written += n
                moved += n
            case .wouldBlock:
                break
            case .endOfStream, .failed:
                return finish()
            }
            if case .wouldBlock = r { break }
        }
        if written == pending.count {
            pending.removeAll(keepingCapacity: true)
            written = 0
        } else if written > 65_536 {
            pending.removeFirst(written)
            written = 0
        }
        if moved > 0 { core?.relayEndConsumed(key, moved) }
    }

    private func finish() {
        guard !closed else { return }
        close()
        core?.relayEndFinished(key)
    }
}
