/// Identifies one TCP connection inside a session. Assigned by the driver.
typealias LinkID = Int

/// Something one side of a link numbers for itself (a resource transfer, a byte stream): the link and that side's id.
struct LinkScopedID: Hashable, Sendable, Comparable {
    var link: LinkID
    var id: UInt32

    static func < (a: LinkScopedID, b: LinkScopedID) -> Bool { (a.link, a.id) < (b.link, b.id) }
}

/// Monotonic time in nanoseconds. The state machine never reads a clock: time is passed in, so tests run on
/// virtual time.
typealias Nanos = UInt64

/// The session's protocol logic as a pure state machine: invitations, simultaneous invites, the peer limit,
/// heartbeats, liveness, goodbye — and the per-peer state each report is derived from.
///
/// Each event is one `mutating` method returning the actions the driver must perform, in order. The machine does
/// no I/O and never reads a clock. A peer may briefly have two links (during a simultaneous invite); the peer's
/// reported state is the best of its links, so every change is reported exactly once, in order.
struct SessionStateMachine: Sendable {
    /// What the driver must do.
    enum Action: Equatable {
        /// Tell the app that `peer` is now in `state`.
        case report(PeerID, SessionState)
        /// Write `frame` on `link`.
        case send(LinkID, ControlFrame)
        /// Close `link`'s socket (after writing any frames queued before).
        case close(LinkID)
        /// `link` is connected: route datagrams to and from it.
        case linkUp(LinkID, PeerID, remoteUDPPort: UInt16, remoteToken: UInt64)
        /// `link`, `peer`'s connected link, no longer carries datagrams; how it ended.
        case linkDown(LinkID, PeerID, LinkEnd)
        /// Deliver a reliable message from `peer`.
        case deliver(PeerID, [UInt8])
        /// An invitation this session sent ended without a connection.
        case invitationFailed(LinkID, PeerID?, DeclineReason)
        /// The peer on `link` broke the protocol (its link is closed by the actions that follow): count it.
        case fault(LinkID, PeerFault)
        /// A resource-transfer frame from `peer` on `link`, for the resource machine.
        case resource(LinkID, PeerID, ResourceFrame)
        /// A byte-stream frame from `peer` on `link`, for the stream machine.
        case stream(LinkID, PeerID, StreamFrame)
        /// A full-mesh frame from `peer`, for the membership machine.
        case mesh(PeerID, MeshFrame)
        /// A relay-pipe frame from `peer` on `link`, for the relay machine.
        case relay(LinkID, PeerID, RelayFrame)
        /// Deliver an unreliable message that came on the connection (a relayed link's).
        case deliverDatagram(PeerID, [UInt8])
    }

    /// How a connected link ended.
    enum LinkEnd: Equatable, Sendable {
        /// With no GOODBYE either way: its socket closed under it, or the peer went silent for `peerTimeout`.
        case lost
        /// By a choice: a GOODBYE received, or sent (the app's disconnect, the session closing).
        case chosen
        /// Closed by this side for the peer's fault, with a GOODBYE where the stream still carries one.
        case fault
    }

    /// Timing and limits.
    struct Configuration: Equatable, Sendable {
        var localPeer: PeerID
        var maximumPeers: Int
        var peerTimeout: Nanos
        var heartbeatInterval: Nanos
        /// The largest message (DATA) taken from a peer: one larger breaks this side's limit, and closes its link.
        var maximumMessageSize = ControlFrame.maximumReliableMessage
        /// How long an invitation may take to reach its peer (connect, handshake, the peer's HELLO), when shorter than
        /// the invitation's timeout; nil: the whole timeout.
        var reachTimeout: Nanos? = nil
    }

    private enum LinkState {
        /// We invited; the peer has not said HELLO yet. It must by `deadline` (the connect, the handshake and its
        /// HELLO: `Configuration.reachTimeout`, or the invitation's whole timeout); its app must answer by `answerBy`.
        case inviting(expected: PeerID?, deadline: Nanos, answerBy: Nanos, localToken: UInt64)
        /// We invited and know who answered; waiting for ACCEPT or DECLINE.
        case awaitingReply(peer: PeerID, deadline: Nanos, localToken: UInt64)
        /// Both sides agreed; data flows.
        case connected(peer: PeerID, lastHeard: Nanos, nextHeartbeat: Nanos)
    }

    private let config: Configuration
    private var links: [LinkID: LinkState] = [:]
    /// The state last reported for each peer; absent means `notConnected`.
    private var reported: [PeerID: SessionState] = [:]
    /// Peers whose invitation to us won a simultaneous invite (they declined ours with `.simultaneousInvite`):
    /// they stay `connecting` until that invitation is accepted here or this deadline passes.
    private var yielding: [PeerID: Nanos] = [:]
    /// Peers the driver is still trying to reach, at another address or through an introducer (`hold`): they stay
    /// `connecting` between its invitations, until they connect, it releases them, the app disconnects them, or this
    /// deadline passes.
    private var held: [PeerID: Nanos] = [:]

    init(configuration: Configuration) {
        precondition(configuration.maximumPeers >= 2, "a session needs room for at least one remote peer")
        precondition(configuration.heartbeatInterval > 0 && configuration.heartbeatInterval < configuration.peerTimeout)
        config = configuration
    }

    // MARK: Queries

    /// Peers whose state is `connected`.
    var connectedPeers: [PeerID] { reported.filter { $0.value == .connected }.map(\.key) }

    /// The state of `peer` as last reported.
    func state(of peer: PeerID) -> SessionState { reported[peer] ?? .notConnected }

    /// The link that carries `peer`'s reliable data: its oldest connected link.
    func primaryLink(for peer: PeerID) -> LinkID? {
        links.filter { if case .connected(let p, _, _) = $0.value { p == peer } else { false } }.keys.min()
    }

    /// Peers that count against the limit: connected or connecting, plus ourselves.
    private var occupancy: Int { 1 + reported.count }

    // MARK: Events

    /// We opened `link` to invite a peer (known from discovery, or `nil` for a direct connect).
    mutating func inviteStarted(link: LinkID, expected: PeerID?, context: [UInt8], timeout: Nanos,
                                localUDPPort: UInt16, localToken: UInt64, now: Nanos) -> [Action] {
        precondition(links[link] == nil, "link ids are unique")
        if let expected, expected == config.localPeer { return [.close(link), .invitationFailed(link, expected, .unavailable)] }
        if let expected, reported[expected] == .connected {
            return [.close(link), .invitationFailed(link, expected, .alreadyConnected)]
        }
        if expected.map({ reported[$0] == nil }) ?? true, occupancy >= config.maximumPeers {
            return [.close(link), .invitationFailed(link, expected, .peerLimit)]
        }
        let answerBy = Self.after(timeout, from: now)
        let reachBy = config.reachTimeout.map { min(answerBy, Self.after($0, from: now)) } ?? answerBy
        links[link] = .inviting(expected: expected, deadline: reachBy, answerBy: answerBy, localToken: localToken)
        let invite = ControlFrame.InviteBody(context: context, timeoutMillis: UInt32(clamping: timeout / 1_000_000),
                                             udpPort: localUDPPort, token: localToken)
        var actions: [Action] = [.send(link, .hello(peer: config.localPeer)), .send(link, .invite(invite))]
        if let expected { actions += refresh(expected) }
        return actions
    }

    /// An advertiser handed us an invitation the app accepted into this session. `link` has already exchanged
    /// HELLO and INVITE.
    mutating func invitationAccepted(link: LinkID, from peer: PeerID, remoteUDPPort: UInt16, remoteToken: UInt64,
                                     acceptUDPPort: UInt16, localToken: UInt64, now: Nanos) -> [Action] {
        precondition(links[link] == nil, "link ids are unique")
        func decline(_ r: DeclineReason) -> [Action] { [.send(link, .decline(r, r.description)), .close(link)] }
        if peer == config.localPeer { return decline(.unavailable) }
        if reported[peer] == .connected { return decline(.alreadyConnected) }
        let pendingOutgoing = links.filter { (_, s) in
            switch s {
            case .inviting(let e, _, _, _): e == peer
            case .awaitingReply(let p, _, _): p == peer
            case .connected: false
            }
        }.map(\.key)
        if !pendingOutgoing.isEmpty, config.localPeer.identity < peer.identity {
            // Simultaneous invitations: the one sent by the lower identity wins, on both sides.
            return decline(.simultaneousInvite)
        }
        if reported[peer] == nil, occupancy >= config.maximumPeers { return decline(.peerLimit) }
        var actions: [Action] = []
        if reported[peer] == nil {
            // As in MC, the invitee passes through `connecting` while it answers.
            reported[peer] = .connecting
            actions.append(.report(peer, .connecting))
        }
        yielding[peer] = nil
        links[link] = .connected(peer: peer, lastHeard: now, nextHeartbeat: now &+ config.heartbeatInterval)
        actions += [.send(link, .accept(udpPort: acceptUDPPort, token: localToken)),
                                 .linkUp(link, peer, remoteUDPPort: remoteUDPPort, remoteToken: remoteToken)]
        // Our own pending invitation to the same peer lost the race: the peer will decline it.
        actions += refresh(peer)
        return actions
    }

    /// A frame arrived on `link`.
    mutating func received(_ frame: ControlFrame, on link: LinkID, now: Nanos) -> [Action] {
        guard let state = links[link] else { return [] }
        switch (state, frame) {
        case (.inviting(let expected, _, let answerBy, let token), .hello(let peer)):
            if let expected, expected != peer {
                // A different peer (another key) answers at that address: a stale advertisement, or an impostor.
                return [.fault(link, .wrongPeer)] + drop(link, failure: (expected, .unavailable), end: .fault)
            }
            if peer == config.localPeer { return drop(link, failure: (peer, .unavailable)) }
            if expected == nil, reported[peer] == .connected {
                return drop(link, failure: (peer, .alreadyConnected))
            }
            if expected == nil, reported[peer] == nil, occupancy >= config.maximumPeers {
                // A direct connect only learns who it reached now: the limit is checked here.
                return drop(link, failure: (peer, .peerLimit))
            }
            links[link] = .awaitingReply(peer: peer, deadline: answerBy, localToken: token)
            return refresh(peer)
        case (.awaitingReply(let peer, _, _), .accept(let udpPort, let token)):
            if reported[peer] == .connected {
                // Already connected through another link: keep that one.
                links[link] = nil
                return [.send(link, .goodbye), .close(link)]
            }
            links[link] = .connected(peer: peer, lastHeard: now, nextHeartbeat: now &+ config.heartbeatInterval)
            return [.linkUp(link, peer, remoteUDPPort: udpPort, remoteToken: token)] + refresh(peer)
        case (.awaitingReply(let peer, let deadline, _), .decline(let reason, _)):
            // The peer's own invitation to us wins: it is on its way, so the peer stays `connecting`.
            if reason == .simultaneousInvite { yielding[peer] = max(yielding[peer] ?? 0, deadline) }
            return drop(link, failure: (peer, reason))
        case (.connected, .data(let bytes)) where bytes.count > config.maximumMessageSize:
            // The frame limit lets frames of other kinds (resource chunks) be larger than the messages taken.
            return [.fault(link, .malformedFrame("a message of \(bytes.count) bytes, over the \(config.maximumMessageSize) this side takes"))]
                + drop(link, failure: nil, end: .fault)
        case (.connected(let peer, _, let next), _) where frame.isTraffic:
            // Whatever a connected peer sends proves it alive; each kind goes to its own consumer.
            links[link] = .connected(peer: peer, lastHeard: now, nextHeartbeat: next)
            return Self.route(frame, on: link, from: peer)
        case (.connected, .goodbye):
            return drop(link, failure: nil)
        case (.awaitingReply(let peer, _, _), .goodbye):
            // The invitee left before answering: the invitation ended without a connection.
            return drop(link, failure: (peer, .unavailable))
        default:
            // A frame that makes no sense in this state: the peer is broken. Close its link.
            return [.fault(link, .unexpectedFrame(frame.name))]
                + drop(link, failure: failure(for: state, reason: .unavailable), end: .fault)
        }
    }

    /// Where a connected peer's traffic goes (`frame.isTraffic`): messages to the app, the rest to its machine.
    private static func route(_ frame: ControlFrame, on link: LinkID, from peer: PeerID) -> [Action] {
        switch frame {
        case .data(let bytes): [.deliver(peer, bytes)]
        case .datagram(let bytes): [.deliverDatagram(peer, bytes)]
        case .resource(let r): [.resource(link, peer, r)]
        case .stream(let f): [.stream(link, peer, f)]
        case .mesh(let f): [.mesh(peer, f)]
        case .relay(let f): [.relay(link, peer, f)]
        case .heartbeat: []
        case .hello, .invite, .accept, .decline, .goodbye, .sasNonce: preconditionFailure("\(frame.name) is not traffic")
        }
    }

    /// A datagram from the peer on `link`, read at `now`, proves it is alive (a proof older than what the link last
    /// heard changes nothing: datagrams' proofs reach the machine in batches).
    mutating func heardDatagram(on link: LinkID, now: Nanos) {
        if case .connected(let peer, let last, let next) = links[link], now > last {
            links[link] = .connected(peer: peer, lastHeard: now, nextHeartbeat: next)
        }
    }

    /// `link`'s socket reached end-of-file or failed, or its byte stream was garbage.
    mutating func linkClosed(_ link: LinkID) -> [Action] {
        guard let state = links[link] else { return [] }
        return drop(link, failure: failure(for: state, reason: .unavailable), end: .lost)
    }

    /// We close `link` for a fault of its peer's that the driver found (a mesh, relay, resource or stream frame that
    /// breaks its rules, a byte stream that is garbage, a peer that stopped reading): by choice, so a connected peer is
    /// told GOODBYE (where the stream still carries one) and the link does not count as lost.
    mutating func closeForFault(_ link: LinkID) -> [Action] {
        guard let state = links[link] else { return [] }
        return drop(link, failure: failure(for: state, reason: .unavailable), end: .fault)
    }

    /// Time passed: send heartbeats, expire invitations and silent peers.
    mutating func tick(now: Nanos) -> [Action] {
        var actions: [Action] = []
        // Peers whose invitation timed out in this tick: the driver decides on their hold when it hears of it, even
        // if a late tick finds the hold's deadline passed too.
        var timedOut: Set<PeerID> = []
        for link in links.keys.sorted() {
            guard let state = links[link] else { continue }
            switch state {
            case .inviting(let expected, let deadline, _, _) where now >= deadline:
                if let expected { timedOut.insert(expected) }
                actions += drop(link, failure: (expected, .timedOut))
            case .awaitingReply(let peer, let deadline, _) where now >= deadline:
                timedOut.insert(peer)
                actions += drop(link, failure: (peer, .timedOut))
            case .connected(let peer, let lastHeard, let next):
                // `lastHeard` may be a little after `now` (another thread read the clock later): never wrap.
                if now > lastHeard, now - lastHeard >= config.peerTimeout {
                    actions += drop(link, failure: nil, end: .lost)
                } else if now >= next {
                    links[link] = .connected(peer: peer, lastHeard: lastHeard, nextHeartbeat: now &+ config.heartbeatInterval)
                    actions.append(.send(link, .heartbeat))
                }
            default:
                break
            }
        }
        for (peer, deadline) in yielding.sorted(by: { $0.key.identity < $1.key.identity }) where now >= deadline {
            yielding[peer] = nil
            actions += refresh(peer)
        }
        for (peer, deadline) in held.sorted(by: { $0.key.identity < $1.key.identity })
        where now >= deadline && !timedOut.contains(peer) {
            held[peer] = nil
            actions += refresh(peer)
        }
        return actions
    }

    /// The driver goes on trying to reach `peer` (the next address of its connection data, or a call through an
    /// introducer) and will start the next invitation itself: the peer stays `connecting` meanwhile — it is reported
    /// `connecting` now if it was not — instead of going `notConnected` when one attempt fails, until it connects,
    /// `release` or `disconnect` is called, or `deadline` passes. A peer the session has no room for is not held.
    mutating func hold(_ peer: PeerID, until deadline: Nanos) -> [Action] {
        guard hasRoom(for: peer) else { return [] }
        held[peer] = max(held[peer] ?? 0, deadline)
        return refresh(peer)
    }

    /// The driver gave up on `peer` (or it connected): it is reported as its links say.
    mutating func release(_ peer: PeerID) -> [Action] {
        guard held.removeValue(forKey: peer) != nil else { return [] }
        return refresh(peer)
    }

    /// Whether `link` is one of the machine's (an invitation under way, or a connection).
    func has(_ link: LinkID) -> Bool { links[link] != nil }

    /// Whether an invitation to `peer` could start now: it is not us, not connected, and there is room for it.
    func hasRoom(for peer: PeerID) -> Bool {
        peer != config.localPeer && reported[peer] != .connected && (reported[peer] != nil || occupancy < config.maximumPeers)
    }

    /// Whether the driver's hold on `peer` still stands (not released, disconnected or expired): its next
    /// invitation may start.
    func isHeld(_ peer: PeerID) -> Bool { held[peer] != nil }

    /// The app disconnected: say goodbye on every link and report every peer `notConnected`.
    mutating func disconnect() -> [Action] {
        var actions: [Action] = []
        for link in links.keys.sorted() {
            let state = links[link]!
            if case .connected(let peer, _, _) = state { actions.append(.linkDown(link, peer, .chosen)) }
            if case .inviting = state {} else { actions.append(.send(link, .goodbye)) }
            actions.append(.close(link))
            if let f = failure(for: state, reason: .unavailable) { actions.append(.invitationFailed(link, f.0, f.1)) }
        }
        links.removeAll()
        yielding.removeAll()
        held.removeAll()
        for peer in reported.keys.sorted(by: { $0.identity < $1.identity }) { actions += refresh(peer) }
        return actions
    }

    /// The app disconnected from `peer` only: goodbye on its links, its pending invitations end, it is reported
    /// `notConnected`.
    mutating func disconnect(_ peer: PeerID) -> [Action] {
        var actions: [Action] = []
        for link in links.keys.sorted() {
            switch links[link]! {
            case .inviting(let e?, _, _, _) where e == peer: actions += drop(link, failure: (peer, .unavailable))
            case .awaitingReply(let p, _, _) where p == peer: actions += drop(link, failure: (peer, .unavailable))
            case .connected(let p, _, _) where p == peer: actions += drop(link, failure: nil)
            default: break
            }
        }
        yielding[peer] = nil
        held[peer] = nil
        return actions + refresh(peer)
    }

    /// The peer on `link`, if known.
    func peer(on link: LinkID) -> PeerID? {
        switch links[link] {
        case .inviting(let e, _, _, _): e
        case .awaitingReply(let p, _, _), .connected(let p, _, _): p
        case nil: nil
        }
    }

    /// Links that are not closed, with their peers when known.
    var openLinks: [LinkID: PeerID?] { links.mapValues { s in
        switch s {
        case .inviting(let e, _, _, _): e
        case .awaitingReply(let p, _, _), .connected(let p, _, _): p
        }
    } }

    /// The next instant at which `tick` has work, for the driver's poll timeout.
    func nextDeadline() -> Nanos? {
        (links.values.map { s -> Nanos in
            switch s {
            case .inviting(_, let d, _, _), .awaitingReply(_, let d, _): d
            case .connected(_, let heard, let next): min(next, heard &+ config.peerTimeout)
            }
        } + yielding.values + held.values).min()
    }

    // MARK: Helpers

    /// `now + duration`, or `.max` (never) when that would overflow: a timeout of `.max` never comes.
    private static func after(_ duration: Nanos, from now: Nanos) -> Nanos {
        let (sum, overflow) = now.addingReportingOverflow(duration)
        return overflow ? .max : sum
    }

    private func failure(for state: LinkState, reason: DeclineReason) -> (PeerID?, DeclineReason)? {
        switch state {
        case .inviting(let e, _, _, _): (e, reason)
        case .awaitingReply(let p, _, _): (p, reason)
        case .connected: nil
        }
    }

    /// Ends `link`: a connected peer is told GOODBYE unless the link was `lost`.
    private mutating func drop(_ link: LinkID, failure: (PeerID?, DeclineReason)?, end: LinkEnd = .chosen) -> [Action] {
        guard let state = links.removeValue(forKey: link) else { return [] }
        var actions: [Action] = []
        var peer: PeerID?
        switch state {
        case .inviting(let e, _, _, _): peer = e
        case .awaitingReply(let p, _, _): peer = p
        case .connected(let p, _, _):
            peer = p
            actions.append(.linkDown(link, p, end))
        }
        if end != .lost, case .connected = state { actions.append(.send(link, .goodbye)) }
        actions.append(.close(link))
        if let failure { actions.append(.invitationFailed(link, failure.0, failure.1)) }
        if let peer { actions += refresh(peer) }
        return actions
    }

    /// Recomputes `peer`'s state from its links and reports a change, exactly once.
    private mutating func refresh(_ peer: PeerID) -> [Action] {
        var best: SessionState = .notConnected
        for state in links.values {
            switch state {
            case .connected(let p, _, _) where p == peer: best = .connected
            case .awaitingReply(let p, _, _) where p == peer && best == .notConnected: best = .connecting
            case .inviting(let e?, _, _, _) where e == peer && best == .notConnected: best = .connecting
            default: break
            }
        }
        if best == .connected {  // nothing left to wait for (a late decline's yield would make a later loss `connecting`)
            held[peer] = nil
            yielding[peer] = nil
        }
        if best == .notConnected, yielding[peer] != nil || held[peer] != nil { best = .connecting }
        let old = reported[peer] ?? .notConnected
        guard best != old else { return [] }
        reported[peer] = best == .notConnected ? nil : best
        return [.report(peer, best)]
    }
}

/// A peer's state in a session, as MultipeerConnectivity's `MCSessionState`.
public enum SessionState: Sendable, Equatable, CustomStringConvertible {
    case notConnected
    case connecting
    case connected

    public var description: String {
        switch self {
        case .notConnected: "notConnected"
        case .connecting: "connecting"
        case .connected: "connected"
        }
    }
}

extension ControlFrame {
    /// Frames a connected link carries (messages, heartbeats, and the resource, stream, mesh and relay protocols'),
    /// as opposed to the handshake's and GOODBYE.
    fileprivate var isTraffic: Bool {
        switch self {
        case .data, .datagram, .resource, .stream, .mesh, .relay, .heartbeat: true
        // SAS-NONCE never reaches a session: the channel takes it.
        case .hello, .invite, .accept, .decline, .goodbye, .sasNonce: false
        }
    }
}
