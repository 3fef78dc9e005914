import MeshPOSIX

/// What a datagram carries, once it is authenticated and parsed.
enum DatagramBody: Equatable, Sendable {
    /// App data (the payload follows the header).
    case data
    /// An RTT probe: answer with a pong echoing its timestamp.
    case ping
    /// The answer to our ping sent at `sentAt` (our clock).
    case pong(sentAt: Nanos)
}

/// Why the router dropped a datagram. Each is counted in `SessionStatistics`.
enum DatagramDrop: Error, Equatable, Sendable {
    /// Not a PeerMesh datagram, or not well formed (bad magic, version, kind, length).
    case malformed
    /// Well formed, but its token names no connected link, or it came from another host than the link's peer.
    case stranger
    /// It did not authenticate under the link's keys.
    case unauthentic
    /// Seen before, or too old for the replay window.
    case duplicate
}

/// The datagram half of a session as a pure state machine: which link a datagram belongs to, whether it may be
/// believed, where to answer, and when each peer was last heard.
///
/// It holds one route per connected link, keyed by the token this side chose for that link (the token senders
/// put on datagrams to us). A datagram is routed in this order, and each step gates the next, so that only a
/// datagram that is the peer's may change anything:
///
/// 1. **Token and source.** The token must name a route, and the source host must be the link's peer host.
/// 2. **Authenticity.** The caller's `authenticate` check (the link's AEAD, when the link has keys) must pass.
/// 3. **Replay.** The sequence number must be new to the route's replay window.
/// 4. **Latching.** The invitee follows the source port of authentic datagrams newer than any before (NATs,
///    relays such as `mesh-impair`); the inviter never latches (see docs/PROTOCOL.md).
/// 5. **Liveness and RTT.** An accepted datagram is proof of life (reported at most once a millisecond per
///    route); a pong is an RTT sample.
///
/// No I/O, no clock: the driver passes `now` and performs the verdicts. Sequence numbers for sending live in the
/// driver's send table (senders are other threads); the router only judges what arrives.
struct DatagramRouter: Sendable {
    /// One connected link's receive side.
    struct Route: Sendable, Equatable {
        let link: LinkID
        let peer: PeerID
        /// Where we answer: the peer's announced address, or the latched source of its datagrams.
        private(set) var remote: SocketAddress
        /// The token the peer wants on datagrams it receives.
        let remoteToken: UInt64
        /// Whether `remote` follows the source port of the peer's datagrams.
        let latches: Bool
        fileprivate var replay = ReplayWindow()
        fileprivate var lastProof: Nanos = 0
        /// Smoothed RTT in nanoseconds (RFC 6298's 7/8 filter), nil before the first pong.
        fileprivate(set) var smoothedRTT: Nanos?

        /// A route for `link`, up since `now`: datagrams from `peer`'s host are judged for it, answers go to `remote`
        /// (which follows the source of authentic datagrams when `latches`), with `remoteToken` on them.
        init(link: LinkID, peer: PeerID, remote: SocketAddress, remoteToken: UInt64, latches: Bool, now: Nanos) {
            self.link = link
            self.peer = peer
            self.remote = remote
            self.remoteToken = remoteToken
            self.latches = latches
            lastProof = now
        }

        fileprivate mutating func latch(to address: SocketAddress) -> Bool {
            guard latches, address != remote else { return false }
            remote = address
            return true
        }

        static func == (a: Route, b: Route) -> Bool {
            a.link == b.link && a.peer == b.peer && a.remote == b.remote && a.remoteToken == b.remoteToken
                && a.latches == b.latches && a.smoothedRTT == b.smoothedRTT
        }
    }

    /// What to do with one datagram.
    enum Verdict: Equatable, Sendable {
        /// Drop it and count why.
        case drop(DatagramDrop)
        /// Hand its payload to the app as `peer`'s.
        case deliver(PeerID)
        /// Answer a ping: send a pong with `token` to `address`, echoing the ping's payload.
        case answerPing(to: SocketAddress, token: UInt64, link: LinkID)
        /// A pong measured the round trip on `link`; `smoothed` is its new smoothed RTT.
        case measured(link: LinkID, sample: Nanos, smoothed: Nanos)
        /// A pong with an impossible timestamp (from the future): ignored, the route is otherwise fine.
        case ignoredPong
    }

    /// What routing one datagram changed beyond its verdict.
    struct Effects: Equatable, Sendable {
        /// The route's send address moved (the driver republishes its send table).
        var latched = false
        /// This link's peer proved it is alive (feed `SessionStateMachine.heardDatagram`).
        var proofOfLife: LinkID?
    }

    /// How often an accepted datagram is passed on as proof of life, per route.
    static let proofInterval: Nanos = 1_000_000

    private var routes: [UInt64: Route] = [:]
    private var tokenByLink: [LinkID: UInt64] = [:]

    /// Routes, by local token.
    var all: [UInt64: Route] { routes }

    /// The route of `link`, if it is up.
    func route(for link: LinkID) -> Route? { tokenByLink[link].flatMap { routes[$0] } }

    /// A link is connected: datagrams carrying `localToken` are its peer's.
    mutating func routeUp(link: LinkID, peer: PeerID, localToken: UInt64, remoteToken: UInt64, remote: SocketAddress,
                          latches: Bool, now: Nanos) {
        precondition(routes[localToken] == nil, "local tokens are unique per session")
        routes[localToken] = Route(link: link, peer: peer, remote: remote, remoteToken: remoteToken, latches: latches,
                                   now: now)
        tokenByLink[link] = localToken
    }

    /// A link went down: its datagrams are strangers' from now on. Returns the removed route.
    @discardableResult
    mutating func routeDown(link: LinkID) -> Route? {
        guard let token = tokenByLink.removeValue(forKey: link) else { return nil }
        return routes.removeValue(forKey: token)
    }

    /// Routes one datagram with a well-formed header that arrived from `source` at `now`.
    ///
    /// `open` is the link's check of the datagram: it authenticates it (the link's AEAD, when it has keys) and
    /// parses its body, or says why it cannot (`.unauthentic`, `.malformed`). It runs only for a datagram whose
    /// token and source match a route, and before anything about the route changes.
    mutating func received(_ header: DatagramHeader, from source: SocketAddress, now: Nanos,
                           open: (LinkID) -> Result<DatagramBody, DatagramDrop>) -> (Verdict, Effects) {
        guard let i = routes.index(forKey: header.token) else { return (.drop(.stranger), Effects()) }
        return routes.values[i].received(header, from: source, now: now, open: open)
    }
}

extension DatagramRouter.Route {
    /// Judges one datagram that carries this route's token (steps 1–5 of `DatagramRouter`, from the source check
    /// on). The table lookup is the caller's: `DatagramRouter`, or a session's published route table, whose routes
    /// the one thread that reads datagrams mutates in place.
    mutating func received(_ header: DatagramHeader, from source: SocketAddress, now: Nanos,
                           open: (LinkID) -> Result<DatagramBody, DatagramDrop>)
        -> (DatagramRouter.Verdict, DatagramRouter.Effects)
    {
        guard remote.sameHost(as: source) else { return (.drop(.stranger), DatagramRouter.Effects()) }
        let body: DatagramBody
        switch open(link) {
        case .success(let b): body = b
        case .failure(let why): return (.drop(why), DatagramRouter.Effects())
        }
        let newest = header.sequence > replay.highest
        guard replay.accept(header.sequence) else { return (.drop(.duplicate), DatagramRouter.Effects()) }
        var effects = DatagramRouter.Effects()
        // Only the newest datagram moves the send address: an older one, held back and let go later from another
        // port by someone on the path, is still delivered but cannot steer the answers away from the peer.
        if newest { effects.latched = latch(to: source) }
        if now &- lastProof > DatagramRouter.proofInterval || now < lastProof {
            lastProof = now
            effects.proofOfLife = link
        }
        switch body {
        case .data:
            return (.deliver(peer), effects)
        case .ping:
            return (.answerPing(to: remote, token: remoteToken, link: link), effects)
        case .pong(let sent):
            guard sent <= now else { return (.ignoredPong, effects) }
            let sample = now - sent
            let smoothed = smoothedRTT.map { ($0 * 7 + sample) / 8 } ?? sample
            smoothedRTT = smoothed
            return (.measured(link: link, sample: sample, smoothed: smoothed), effects)
        }
    }
}

extension DatagramBody {
    /// Parses the body of a datagram of `kind`: data needs 1 … `Session.maximumDatagramSize` bytes (what a sender
    /// may send), ping and pong exactly an 8-byte timestamp.
    static func parse(kind: DatagramHeader.Kind, payload: UnsafeRawBufferPointer) -> Result<DatagramBody, DatagramDrop> {
        switch kind {
        case .data:
            return payload.isEmpty || payload.count > Session.maximumDatagramSize ? .failure(.malformed) : .success(.data)
        case .ping:
            return payload.count == 8 ? .success(.ping) : .failure(.malformed)
        case .pong:
            guard payload.count == 8 else { return .failure(.malformed) }
            return .success(.pong(sentAt: UInt64(bigEndian: payload.loadUnaligned(as: UInt64.self))))
        }
    }
}
