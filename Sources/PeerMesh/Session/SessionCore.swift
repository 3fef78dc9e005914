import FoundationEssentials
import MeshPOSIX
import Synchronization

extension AtomicRecord where Value == SessionStatistics {
    /// Counts a datagram the session dropped, under its reason.
    func count(_ drop: DatagramDrop) {
        switch drop {
        case .malformed: add(to: \.malformedDatagrams)
        case .stranger: add(to: \.strangerDatagrams)
        case .unauthentic: add(to: \.unauthenticDatagrams)
        case .duplicate: add(to: \.duplicateDatagrams)
        }
    }
}

/// Per-link numbers shared by the senders, the datagram reader and the loop: the next datagram sequence number, the
/// smoothed RTT, and when the peer's datagrams last proved it alive (the loop feeds that to the state machine).
final class LinkCounters: Sendable {
    let nextSequence = Atomic<UInt64>(1)
    let smoothedRTT = Atomic<UInt64>(0)
    /// Monotonic time of the latest proof of life from a datagram (0: none yet).
    let lastHeard = Atomic<UInt64>(0)

    /// Takes the next sequence number.
    @inline(__always)
    func takeSequence() -> UInt64 { nextSequence.wrappingAdd(1, ordering: .relaxed).oldValue }
}

/// Where app threads send a connected peer's datagrams: the send table's entry for it.
struct SendRoute: Sendable {
    let link: LinkID
    let remote: SocketAddress
    let remoteToken: UInt64
    let counters: LinkCounters
    /// The link's datagram key (nil on a plaintext link).
    let key: SecretKey?
}

/// Sequence numbers never wrap: past this a link refuses to send (reconnect to get fresh keys).
let maximumDatagramSequence: UInt64 = 1 << 62

/// What the loop keeps of a connected link's datagram route, for sending and pinging (the reading thread judges
/// arrivals with its own copy, in the `LinkReceiver`).
struct LoopRoute {
    let peer: PeerID
    /// The token the peer puts on datagrams to us.
    let localToken: UInt64
    /// Where datagrams to the peer go (the invitee follows latches).
    var remote: SocketAddress
    /// The token the peer wants on datagrams to it.
    let remoteToken: UInt64
    /// The link's counters and keys, shared with the reading thread.
    let receiver: LinkReceiver
}

/// The driver of a `Session`: owns its UDP socket and connections on the process's event loop, feeds the pure
/// `SessionStateMachine` (control) and, through its `DatagramPath`, each link's `DatagramRouter.Route`
/// (datagrams), and performs their actions.
///
/// Threads: the connections are read on the loop, and so is the UDP socket unless the app reads it through a
/// `DatagramReader` (`.reader` delivery). App threads (send, invite, disconnect) decide under the `shared` lock and
/// hand the resulting actions to the loop; datagram senders read the send table (a lock-free snapshot) and write to
/// the socket themselves; the datagram reader reads the route table (another). Delegate calls happen on the loop, in
/// order, after every lock is released.
final class SessionCore: Sendable {
    /// What the app threads and the loop share, under one lock.
    struct Shared: Sendable {
        var machine: SessionStateMachine
        var nextLink: LinkID = 1
        var shutDown = false
    }

    /// What only the loop touches.
    struct IO {
        var connections: [LinkID: Connection] = [:]
        var localTokens: [LinkID: UInt64] = [:]
        /// The key an invited peer must prove (from its advertisement), by link.
        var expectedKeys: [LinkID: PublicKey] = [:]
        /// Invitations from each host accepted by the app but still waiting on the certificate check.
        var admitting: [[UInt8]: Int] = [:]
        /// Those invitations' connections, held paused until the app answers: shutdown closes them too.
        var judged: [ObjectIdentifier: Connection] = [:]
        /// Connected links' datagram routes, by link (what the route table and the send table are built from).
        var routes: [LinkID: LoopRoute] = [:]
        /// Peers connected only through a relay pipe (no UDP path), by their link: their datagrams go on the
        /// connection. Published to senders in the send table.
        var relayedLinks: [PeerID: LinkID] = [:]
        var failureDetail: [LinkID: String] = [:]
        /// A better reason than the state machine's for a link's failure (our own certificate check said no).
        var failureReason: [LinkID: DeclineReason] = [:]
        /// The UDP socket (`.delegate` delivery) or the reader's latch wake-up (`.reader`), as watched by the loop.
        var udpRegistration: EventLoop.Registration?
        var timer = DeadlineTimer()
        var nextPing: Nanos = 0
        var resources: ResourceStateMachine
        var outgoingResources: [ResourceKey: OutgoingResource] = [:]
        var incomingResources: [ResourceKey: IncomingResource] = [:]
        /// The buffer outgoing transfers read each chunk into (see `pumpResources`).
        var resourceChunk: [UInt8] = []
        var streams = StreamStateMachine()
        var membership: MembershipStateMachine
        var outputStreams: [StreamKey: OutputByteStream] = [:]
        var inputStreams: [StreamKey: InputByteStream] = [:]
        var relay: RelayStateMachine
        var relayEnds: [PipeKey: RelayEnd] = [:]
        /// Calls through an introducer whose pipe is being opened: the data that pins the key and holds the ticket.
        var relayCalls: [PipeKey: NearbyConnectionData] = [:]
        /// Direct connections an introduction started, by link: where to call through if they fail.
        var introductions: [LinkID: Introduction] = [:]
    }

    let peer: PeerID
    let preference: EncryptionPreference
    /// The session's limits, timing and topology, as the app configured them.
    let configuration: Session.Configuration
    /// `configuration`'s heartbeat interval (a quarter of the peer timeout by default) and peer timeout.
    let heartbeat, peerTimeout: Nanos
    /// The configured local address (outgoing connections leave from it too).
    let bindAddress: SocketAddress
    let loop: EventLoop
    /// The UDP socket, its port, and the path that reads and routes its datagrams (on the loop, or on the app's
    /// reader thread).
    let udp: FileDescriptor
    let udpPort: UInt16
    let datagrams: DatagramPath
    /// The app's reader (`.reader` delivery), and what it wakes the loop with when a route latched.
    let reader: DatagramReader?
    private let latchWaker: Waker?
    let shared: Mutex<Shared>
    /// The counters behind `SessionStatistics`: atomic words, so the datagram path and senders count without a lock.
    let counters = AtomicRecord(SessionStatistics())
    let delegate = Mutex(WeakDelegate(nil))
    let owner = Mutex(WeakSession(nil))
    let io: LoopBound<IO>
    /// Where incoming resources are written (each in a directory of its own).
    let resourceDirectory: String
    /// Connected peers' send routes (a peer with two links uses its oldest) and relayed links, read by senders
    /// without a lock.
    private let sendTable = SnapshotCell<SendTable>(SendTable([:], relayed: [:]))

    init(peer: PeerID, preference: EncryptionPreference, configuration c: Session.Configuration) throws(PeerMeshError) {
        self.peer = peer
        self.preference = preference
        configuration = c
        resourceDirectory = c.resourceDirectory.isEmpty ? TemporaryDirectory.system : c.resourceDirectory
        Sys.raiseFileLimit()
        let timeout = c.peerTimeout.nanoseconds
        peerTimeout = timeout
        var beat = timeout / 4
        if let h = c.heartbeatInterval {
            beat = h.nanoseconds
            guard beat > 0, beat < timeout else { throw .invalidParameter("heartbeatInterval must be positive and below peerTimeout") }
        }
        heartbeat = beat
        guard let bind = SocketAddress.bindAddress(c.bindHost, port: c.udpPort) else {
            throw .invalidParameter("bindHost \"\(c.bindHost)\" is not a numeric IPv4 or IPv6 address (or \"\" for all)")
        }
        bindAddress = bind
        do {
            loop = try EventLoop.shared()
            udp = try FileDescriptor.udpSocket(bind)
            udpPort = try udp.localAddress().port
            latchWaker = c.datagramDelivery == .reader ? try Waker() : nil
        } catch {
            throw .transport(error.description)
        }
        let path = DatagramPath(udp: udp, counters: counters)
        datagrams = path
        reader = latchWaker.map { DatagramReader(path: path, latchWaker: $0) }
        let machine = SessionStateMachine(configuration: .init(localPeer: peer, maximumPeers: c.maximumPeers,
                                                               peerTimeout: timeout, heartbeatInterval: beat))
        shared = Mutex(Shared(machine: machine))
        var limits = ResourceStateMachine.Limits()
        // Progress counts in Int64: a larger limit (`.max` for "no limit") means as large as that can count.
        limits.maximumSize = min(c.maximumResourceSize, UInt64(Int64.max))
        let topology: Session.Topology = preference == .none ? .star : c.topology
        io = LoopBound(IO(resources: ResourceStateMachine(limits: limits),
                          membership: MembershipStateMachine(me: peer, topology: topology, maximumPeers: c.maximumPeers),
                          relay: RelayStateMachine(topology: topology)), loop: loop)
    }

    /// The security layer's settings for a link of this session.
    func channelConfiguration(_ role: SecureChannel.Role) -> SecureChannel.Configuration {
        SecureChannel.Configuration(role: role, preference: preference, localPeer: peer,
                                    maximumFrameLength: max(configuration.maximumMessageSize + 1, ResourceFrame.maximumFrameLength))
    }

    /// Starts reading the UDP socket (or, when the app reads it, watching for the routes its reader latched).
    func start() {
        loop.execute { [self] in
            if let latchWaker {
                io.value.udpRegistration = loop.register(fd: latchWaker.fd, interest: .readable) { [unowned self] _ in
                    latchWaker.drain()
                    var moved = false
                    while let (link, address) = datagrams.latches.pop() { moved = latch(link, to: address) || moved }
                    if moved { publishSendTable() }
                }
            } else {
                io.value.udpRegistration = loop.register(fd: udp.fd, interest: .readable) { [unowned self] _ in readDatagrams() }
            }
        }
    }

    /// Says goodbye to every peer, closes every socket and waits until that is done (unless called on the loop).
    func shutdown() {
        loop.submitAndWait { [self] in
            let actions = shared.withLock { s -> [SessionStateMachine.Action] in
                guard !s.shutDown else { return [] }
                s.shutDown = true
                return s.machine.disconnect()
            }
            perform(actions)
            if let r = io.value.udpRegistration { loop.deregister(r) }
            io.value.udpRegistration = nil
            io.value.timer.cancel(on: loop)
            for c in io.value.connections.values { c.close() }
            io.value.connections.removeAll()
            for c in io.value.judged.values { c.close() }
            io.value.judged.removeAll()
            closeRelayEnds()
            io.value.routes.removeAll()
            publishRoutes()
            udp.close()
        }
    }

    // MARK: Commands from the app (any thread)

    @discardableResult
    func invite(expected: PeerID?, endpoint: PeerEndpoint, context: Data?, timeout: Duration) throws(PeerMeshError) -> LinkID {
        guard (context?.count ?? 0) <= ControlFrame.maximumContext else {
            throw .invalidParameter("invitation context is \(context?.count ?? 0) bytes; at most \(ControlFrame.maximumContext)")
        }
        // Numeric addresses at once; names through the system resolver (/etc/hosts, DNS, mDNS .local with nss-mdns).
        let addr: SocketAddress
        do { addr = try SocketAddress.resolve(host: endpoint.host, port: endpoint.port)[0] } catch {
            throw error.isTemporary ? .transport(error.description) : .unresolvable(error.description)
        }
        let sock: FileDescriptor
        do { sock = try FileDescriptor.tcpConnect(to: addr, from: bindAddress) } catch { throw .transport(error.description) }
        return try invite(expected: expected, socket: sock, remote: addr, relayed: false, context: context, timeout: timeout)
    }

    /// Invites over `socket`: a TCP connect in progress to `remote`, or (`relayed`) our side of a relay pipe.
    @discardableResult
    func invite(expected: PeerID?, socket sock: FileDescriptor, remote addr: SocketAddress?, relayed: Bool, context: Data?,
                timeout: Duration) throws(PeerMeshError) -> LinkID {
        let ctx = Array(context ?? Data())
        guard ctx.count <= ControlFrame.maximumContext else {
            throw .invalidParameter("invitation context is \(ctx.count) bytes; at most \(ControlFrame.maximumContext)")
        }
        let nanos = (timeout <= .zero ? .seconds(30) : timeout).nanoseconds
        let token = UInt64.random(in: 1...UInt64.max)
        let (link, actions) = try shared.withLock { (s) throws(PeerMeshError) -> (LinkID, [SessionStateMachine.Action]) in
            guard !s.shutDown else { throw .sessionClosed }
            let id = s.nextLink
            s.nextLink += 1
            return (id, s.machine.inviteStarted(link: id, expected: expected, context: ctx, timeout: nanos,
                                                localUDPPort: udpPort, localToken: token, now: MonotonicClock.nowNanos()))
        }
        let pinned = expected?.publicKey
        loop.execute { [self] in
            let c = Connection(socket: sock, remote: addr, connecting: true, loop: loop, channel: channelConfiguration(.initiator),
                               relayed: relayed)
            io.value.connections[link] = c
            io.value.localTokens[link] = token
            if let pinned { io.value.expectedKeys[link] = pinned }
            c.start(onFrame: { [unowned self] f in received(f, on: link) },
                    onApproval: { [unowned self] p in identified(p, on: link) },
                    onEnd: { [unowned self] why in ended(link, why) })
            perform(actions)
        }
        return link
    }

    /// Takes over a connection whose invitation the app accepted into this session. An encrypted link's key goes
    /// to the delegate's certificate check first; a peer over the per-host limit is declined. Loop thread only.
    func adopt(_ connection: Connection, from peer: PeerID, invite: ControlFrame.InviteBody, listenerPort: UInt16) {
        func decline(_ reason: DeclineReason, _ text: String) {
            connection.send(.decline(reason, text))
            connection.close()
        }
        if shared.withLock({ $0.shutDown }) { return decline(.unavailable, DeclineReason.unavailable.description) }
        if preference == .required, !connection.isEncrypted {
            return decline(.declined, "this session requires encryption")
        }
        let hostKey = connection.remote?.hostBytes ?? []
        let sameHost = io.value.connections.values.filter { $0.remote?.hostBytes == hostKey }.count
            + io.value.admitting[hostKey, default: 0]
        if sameHost >= configuration.maximumPeersPerHost {
            return decline(.peerLimit, "too many peers from \(connection.remote?.host ?? "one address") (at most \(configuration.maximumPeersPerHost))")
        }
        connection.setMaximumFrameLength(max(configuration.maximumMessageSize + 1, ResourceFrame.maximumFrameLength))
        guard connection.isEncrypted, let key = peer.publicKey else {
            return admit(connection, from: peer, invite: invite, listenerPort: listenerPort)
        }
        // The app judges the proven key; the connection waits (its own frames are not read meanwhile), and holds
        // its place against the per-host limit. It is ours now: a hang-up meanwhile must not reach the advertiser.
        connection.hold()
        io.value.judged[ObjectIdentifier(connection)] = connection
        io.value.admitting[hostKey, default: 0] += 1
        let certificate = PeerCertificate(publicKey: key, shortAuthenticationString: connection.shortAuthenticationString ?? "",
                                          address: connection.remote?.host, weInvited: false)
        // An app that never answers must not hold the guest's place for ever: past the invitation's own timeout
        // (as the advertiser reckons it) the guest has given up, and the answer is no.
        let wait = invite.timeoutMillis == 0 ? Self.defaultInvitationWait
            : min(UInt64(invite.timeoutMillis) * 1_000_000, Self.maximumCertificateWait)
        askCertificate(certificate, from: peer, timeout: wait) { [self] ok in
            let c = connection
            io.value.judged[ObjectIdentifier(c)] = nil
            io.value.admitting[hostKey, default: 1] -= 1
            if io.value.admitting[hostKey] == 0 { io.value.admitting[hostKey] = nil }
            // The guest left while the app judged its key: nothing to admit or to decline.
            if c.hasEnded { return }
            switch ok {
            case true?: admit(c, from: peer, invite: invite, listenerPort: listenerPort)
            case false?: decline(.declined, "certificate rejected: \(peer.displayName)'s key \(key.shortFingerprint) is not trusted")
            case nil: decline(.timedOut, "the host's app did not answer the certificate check in time")
            }
        }
    }

    private func admit(_ connection: Connection, from peer: PeerID, invite: ControlFrame.InviteBody, listenerPort: UInt16) {
        let token = Sodium.randomUInt64() | 1
        let acceptPort: UInt16 = udpPort == listenerPort ? 0 : udpPort
        let adopted = shared.withLock { s -> (LinkID, [SessionStateMachine.Action])? in
            guard !s.shutDown else { return nil }
            let id = s.nextLink
            s.nextLink += 1
            return (id, s.machine.invitationAccepted(link: id, from: peer, remoteUDPPort: invite.udpPort,
                                                     remoteToken: invite.token, acceptUDPPort: acceptPort,
                                                     localToken: token, now: MonotonicClock.nowNanos()))
        }
        guard let (link, actions) = adopted else {
            connection.send(.decline(.unavailable, DeclineReason.unavailable.description))
            connection.close()
            return
        }
        io.value.connections[link] = connection
        io.value.localTokens[link] = token
        // The acceptance first (ACCEPT sent, the app told of `connecting` then `connected`), and only then the frames
        // the guest sent behind its INVITE, which `rehome` delivers at once: a GOODBYE among them must end a peer the
        // app already knows as connected, not one it will be told about afterwards and then keep forever.
        perform(actions)
        connection.rehome(onFrame: { [unowned self] f in received(f, on: link) },
                          onEnd: { [unowned self] why in ended(link, why) })
    }

    /// How long an invitee's certificate check may wait for the app when the invitation names no timeout (as the
    /// advertiser waits for its answer), and at the most.
    static let defaultInvitationWait: Nanos = 30_000_000_000
    static let maximumCertificateWait: Nanos = 60_000_000_000

    /// Asks the delegate about a proven key; `decide` runs on the loop, once, with the answer: nil when `timeout`
    /// passed first (a session without a delegate accepts, as MC does). Loop thread only.
    private func askCertificate(_ certificate: PeerCertificate, from peer: PeerID, timeout: Nanos? = nil,
                                decide: @escaping (Bool?) -> Void) {
        let answered = Atomic<Bool>(false)
        let box = LoopBound<((Bool?) -> Void)?>(decide, loop: loop)
        let expiry = LoopBound<EventLoop.Timer?>(nil, loop: loop)
        let resolve: @Sendable (Bool?) -> Void = { [weak self] ok in
            guard answered.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged,
                  let self else { return }
            self.loop.execute { [loop = self.loop] in
                if let t = expiry.value { loop.cancel(t) }
                expiry.value = nil
                let d = box.value
                box.value = nil
                d?(ok)
            }
        }
        guard let s = owner.withLock({ $0.value }), let d = delegate.withLock({ $0.value }) else { return resolve(true) }
        if let timeout { expiry.value = loop.schedule(at: MonotonicClock.nowNanos() &+ timeout) { resolve(nil) } }
        d.session(s, didReceiveCertificate: certificate, fromPeer: peer, certificateHandler: { ok in resolve(ok) })
    }

    /// Initiator: the handshake proved who answered. Check the key against the advertised one, then ask the
    /// delegate; on yes the handshake finishes and the invitation goes out.
    private func identified(_ peer: PeerID, on link: LinkID) {
        guard let c = io.value.connections[link], let key = peer.publicKey else { return }
        if let pinned = io.value.expectedKeys[link], pinned != key {
            return faulted(link, .wrongPeer)
        }
        let certificate = PeerCertificate(publicKey: key, shortAuthenticationString: c.shortAuthenticationString ?? "",
                                          address: c.remote?.host, weInvited: true)
        askCertificate(certificate, from: peer) { [self] ok in
            guard let c = io.value.connections[link] else { return }
            if ok == true {
                c.approve()
            } else {
                io.value.failureDetail[link] = "certificate rejected: \(peer.displayName)'s key \(key.shortFingerprint) is not trusted"
                io.value.failureReason[link] = .notTrusted
                let actions = shared.withLock { $0.machine.linkClosed(link) }
                perform(actions)
            }
        }
    }

    /// The peer on `link` broke the protocol: count it, say so, close the link.
    func faulted(_ link: LinkID, _ fault: PeerFault) {
        counters.add(to: \.peerFaults)
        io.value.failureDetail[link] = fault.description
        let actions = shared.withLock { $0.machine.linkClosed(link) }
        perform(actions)
    }

    func disconnect() {
        let actions = shared.withLock { $0.machine.disconnect() }
        loop.execute { [self] in perform(actions) }
    }

    func disconnect(_ peer: PeerID) {
        let actions = shared.withLock { $0.machine.disconnect(peer) }
        loop.execute { [self] in perform(actions) }
    }

    func shortAuthenticationString(for peer: PeerID) -> String? {
        guard let link = shared.withLock({ $0.machine.primaryLink(for: peer) }) else { return nil }
        return loop.submitAndWait { [self] in io.value.connections[link]?.shortAuthenticationString }
    }

    func channelBinding(for peer: PeerID) -> [UInt8]? {
        guard let link = shared.withLock({ $0.machine.primaryLink(for: peer) }) else { return nil }
        return loop.submitAndWait { [self] in io.value.connections[link]?.channelBinding }
    }

    func isRelayed(_ peer: PeerID) -> Bool {
        guard let link = shared.withLock({ $0.machine.primaryLink(for: peer) }) else { return false }
        return loop.submitAndWait { [self] in io.value.connections[link]?.isRelayed ?? false }
    }

    func isEncrypted(_ peer: PeerID) -> Bool {
        guard let link = shared.withLock({ $0.machine.primaryLink(for: peer) }) else { return false }
        return loop.submitAndWait { [self] in io.value.connections[link]?.isEncrypted ?? false }
    }

    func sendReliable(_ bytes: [UInt8], to peers: [PeerID]) throws(PeerMeshError) {
        let links = try shared.withLock { (s) throws(PeerMeshError) -> [LinkID] in
            try peers.map { (p) throws(PeerMeshError) -> LinkID in
                guard let l = s.machine.primaryLink(for: p) else {
                    throw .notConnected("send: peer \(p) is not connected; nothing was sent")
                }
                return l
            }
        }
        let queued = queuedBytes.withLock { q in links.map { q[$0, default: 0] } }
        if let full = queued.firstIndex(where: { $0 + bytes.count > configuration.maximumQueuedBytes }) {
            throw .busy("send: \(queued[full]) bytes are already queued for \(peers[full]); nothing was sent (the peer is not reading)")
        }
        queuedBytes.withLock { q in for l in links { q[l, default: 0] += bytes.count } }
        let frame = ControlFrame.data(bytes)
        loop.execute { [self] in
            for l in links {
                io.value.connections[l]?.send(frame)
                noteQueue(l)
            }
        }
    }

    /// Bytes not yet written, by link, for `send`'s backpressure (refreshed by the loop after each write).
    private let queuedBytes = Mutex<[LinkID: Int]>([:])

    func noteQueue(_ link: LinkID) {
        let n = io.value.connections[link]?.queuedBytes ?? 0
        queuedBytes.withLock { if n == 0 { $0[link] = nil } else { $0[link] = n } }
    }

    /// Sends one datagram to each of `peers` that is connected. A peer that is not (it just left, or is not up
    /// yet) is skipped, and named in the error thrown after the others were sent to: one peer's departure never
    /// costs the rest their audio.
    func sendDatagram(_ payload: UnsafeRawBufferPointer, to peers: [PeerID]) throws(PeerMeshError) {
        var missing: PeerID?
        sendTable.withCurrent { table in
            guard let table else { return }
            _ = sendDatagram(payload, to: peers, table: table) { missing = $0 }
        }
        if let missing { throw .notConnected("send: peer \(missing) is not connected; the datagram went to the others") }
    }

    /// `sendDatagram` for a real-time thread: no error to build, no lock. Returns how many of `peers` are not
    /// connected (each skipped).
    func sendDatagramCountingMissing(_ payload: UnsafeRawBufferPointer, to peers: [PeerID]) -> Int {
        sendTable.withCurrent { table in
            guard let table else { return peers.count }
            return sendDatagram(payload, to: peers, table: table) { _ in }
        }
    }

    /// Seals and sends `payload` to each of `peers` found in `table` (or on its relayed link); `noteMissing` hears
    /// each that is not connected. Returns how many were not.
    private func sendDatagram(_ payload: UnsafeRawBufferPointer, to peers: [PeerID], table: SendTable,
                              noteMissing: (PeerID) -> Void) -> Int {
        var missing = 0
        // No heap allocation: each datagram is assembled (and sealed, on an encrypted link) in stack space.
        let size = DatagramHeader.size + payload.count + Sodium.tagSize
        var sent: UInt64 = 0, failed: UInt64 = 0
        withUnsafeTemporaryAllocation(byteCount: size, alignment: 16) { buf in
            for p in peers {
                guard let r = table.routes[p] else {
                    if let link = table.relayed[p] {
                        sendRelayedDatagram(payload, on: link)
                    } else {
                        missing += 1
                        noteMissing(p)
                    }
                    continue
                }
                let sequence = r.counters.takeSequence()
                guard sequence < maximumDatagramSequence else { continue }
                let n = Self.seal(payload, kind: .data, token: r.remoteToken, sequence: sequence, key: r.key, into: buf)
                if udp.send(UnsafeRawBufferPointer(rebasing: buf[..<n]), to: r.remote) >= 0 { sent += 1 } else { failed += 1 }
            }
        }
        counters.add(sent, to: \.datagramsSent)
        if failed > 0 { counters.add(failed, to: \.datagramsNotSent) }
        return missing
    }

    /// Sends a datagram to a peer reached only through a relay pipe: on its connection `link` (sealed end to end
    /// by the link's records), as a DATAGRAM frame, from the loop. (This path copies the bytes: a relayed peer has
    /// no UDP path for a real-time sender to write to.)
    private func sendRelayedDatagram(_ payload: UnsafeRawBufferPointer, on link: LinkID) {
        guard !payload.isEmpty else { return }
        let frame = ControlFrame.datagram(Array(payload))
        loop.execute { [self] in
            // Unreliable: a link whose queue is full drops it rather than grow.
            guard let c = io.value.connections[link], c.queuedBytes < configuration.maximumQueuedBytes else { return }
            c.send(frame)
        }
    }

    /// Writes a datagram — header, then the payload sealed under `key` (nonce: the sequence number; associated
    /// data: the header) or in clear on a plaintext link — into `out`. Returns its length.
    @inline(__always)
    static func seal(_ payload: UnsafeRawBufferPointer, kind: DatagramHeader.Kind, token: UInt64, sequence: UInt64,
                     key: SecretKey?, into out: UnsafeMutableRawBufferPointer) -> Int {
        let header = DatagramHeader(kind: kind, token: token, sequence: sequence)
        header.write(to: out)
        let body = UnsafeMutableRawBufferPointer(rebasing: out[DatagramHeader.size...])
        guard let key else {
            body.copyMemory(from: payload)
            return DatagramHeader.size + payload.count
        }
        let n = Sodium.seal(key: key, counter: sequence, ad: UnsafeRawBufferPointer(rebasing: out[..<DatagramHeader.size]),
                            plaintext: payload, into: body)
        return DatagramHeader.size + n
    }

    /// The smoothed RTT to `peer`, in nanoseconds.
    func roundTripTime(to peer: PeerID) -> Nanos? {
        let v = sendTable.withCurrent { $0?.routes[peer]?.counters.smoothedRTT.load(ordering: .relaxed) } ?? 0
        return v == 0 ? nil : v
    }

    // MARK: Loop: control connections

    private func received(_ frame: ControlFrame, on link: LinkID) {
        let now = MonotonicClock.nowNanos()
        // The decliner's own words say more than the reason code ("the pairing window is closed; …").
        if case .decline(_, let text) = frame, !text.isEmpty { io.value.failureDetail[link] = text }
        // DATAGRAM frames stand in for UDP on a relayed link only: on a direct link they are out of place.
        if case .datagram = frame, io.value.connections[link]?.isRelayed == false {
            return faulted(link, .unexpectedFrame("DATAGRAM on a link that has a UDP path"))
        }
        let actions = shared.withLock { $0.machine.received(frame, on: link, now: now) }
        perform(actions)
    }

    private func ended(_ link: LinkID, _ why: ConnectionEnd) {
        io.value.connections[link] = nil
        queuedBytes.withLock { $0[link] = nil }
        performResources(io.value.resources.linkClosed(link))
        performStreams(io.value.streams.linkClosed(link))
        relayLinkClosed(link)
        switch why {
        case .closedByPeer: break
        case .failed(let text):
            io.value.failureDetail[link] = text
        case .fault(let fault):
            counters.add(to: \.garbageConnections)
            counters.add(to: \.peerFaults)
            io.value.failureDetail[link] = fault.description
        }
        let actions = shared.withLock { $0.machine.linkClosed(link) }
        perform(actions)
    }

    /// Carries out the state machine's actions, in order. Loop thread only; no lock is held.
    private func perform(_ actions: [SessionStateMachine.Action]) {
        guard !actions.isEmpty else { return }
        let receiver = (owner.withLock { $0.value }, delegate.withLock { $0.value })
        var closed: [LinkID] = []
        defer {
            for l in closed {  // details no failure report took
                io.value.failureDetail[l] = nil
                io.value.failureReason[l] = nil
            }
        }
        for a in actions {
            switch a {
            case .report(let p, let st):
                if let s = receiver.0, let d = receiver.1 { d.session(s, peer: p, didChange: st) }
                switch st {
                case .connected: performMembership(io.value.membership.connected(p))
                case .notConnected: performMembership(io.value.membership.disconnected(p))
                case .connecting: break
                }
            case .deliver(let p, let bytes):
                if let s = receiver.0, let d = receiver.1 { d.session(s, didReceive: Data(bytes), fromPeer: p) }
            case .deliverDatagram(let p, let bytes):
                counters.add(to: \.datagramsReceived)
                if let s = receiver.0, let d = receiver.1 {
                    bytes.withUnsafeBytes { d.session(s, didReceiveDatagramBytes: $0, fromPeer: p) }
                }
            case .invitationFailed(let l, let p, let r):
                if retryIntroduction(l, io.value.failureReason[l] ?? r) {
                    io.value.failureDetail[l] = nil
                    io.value.failureReason[l] = nil
                    continue
                }
                let detail = io.value.failureDetail.removeValue(forKey: l) ?? r.description
                let r = io.value.failureReason.removeValue(forKey: l) ?? r
                if let s = receiver.0, let d = receiver.1 { d.session(s, invitationTo: p, failedWith: r, detail: detail) }
            case .fault(let l, let f):
                counters.add(to: \.peerFaults)
                io.value.failureDetail[l] = f.description
            case .send(let l, let f):
                io.value.connections[l]?.send(f)
            case .close(let l):
                closed.append(l)
                io.value.connections.removeValue(forKey: l)?.close()
                io.value.localTokens[l] = nil
                io.value.expectedKeys[l] = nil
                queuedBytes.withLock { $0[l] = nil }
                performResources(io.value.resources.linkClosed(l))
                performStreams(io.value.streams.linkClosed(l))
                relayLinkClosed(l)
            case .linkUp(let l, let p, let port, let token):
                io.value.introductions[l] = nil
                if let c = io.value.connections[l], c.isRelayed {
                    // No UDP path: liveness rides the connection's heartbeats, datagrams its DATAGRAM frames.
                    io.value.relayedLinks[p] = l
                    publishSendTable()
                    continue
                }
                guard let c = io.value.connections[l], let local = io.value.localTokens[l],
                      var remote = c.socket.peerAddress() ?? c.remote else { continue }
                // Port 0 means "the port you reached me on".
                remote.port = port == 0 ? (c.remote?.port ?? remote.port) : port
                let now = MonotonicClock.nowNanos()
                let lc = LinkCounters()
                let route = DatagramRouter.Route(link: l, peer: p, remote: remote, remoteToken: token,
                                                 latches: !c.isOutgoing, now: now)
                precondition(io.value.routes.values.allSatisfy { $0.localToken != local }, "local tokens are unique per session")
                io.value.routes[l] = LoopRoute(peer: p, localToken: local, remote: remote, remoteToken: token,
                                               receiver: LinkReceiver(route: route, counters: lc, keys: c.datagramKeys))
                publishRoutes()
                // Senders see the route before any delegate hears "connected" (which may send at once).
                publishSendTable()
                // The inviter learns last that the link is up: it pings at once, so the far side latches its
                // address and both measure the RTT early. (An invitee's ping could outrun its ACCEPT.)
                if c.isOutgoing { sendPing(to: remote, token: token, counters: lc, key: c.datagramKeys?.send, now: now) }
            case .resource(let l, let p, let frame):
                performResources(io.value.resources.received(frame, on: l, from: p))
            case .stream(let l, let p, let frame):
                performStreams(io.value.streams.received(frame, on: l, from: p))
            case .mesh(let p, let frame):
                performMembership(io.value.membership.received(frame, from: p))
            case .relay(let l, let p, let frame):
                receivedRelay(frame, on: l, from: p)
            case .linkDown(let l):
                io.value.relayedLinks = io.value.relayedLinks.filter { $0.value != l }
                if io.value.routes.removeValue(forKey: l) != nil { publishRoutes() }
                publishSendTable()
            }
        }
        armTimer()
    }

    /// Rebuilds the senders' table from the links' routes: each peer's oldest connected link.
    private func publishSendTable() {
        var table: [PeerID: SendRoute] = [:]
        for (link, route) in io.value.routes {
            if let existing = table[route.peer], existing.link < link { continue }
            table[route.peer] = SendRoute(link: link, remote: route.remote, remoteToken: route.remoteToken,
                                          counters: route.receiver.counters, key: route.receiver.keys?.send)
        }
        sendTable.replace(with: SendTable(table, relayed: io.value.relayedLinks))
    }

    /// Publishes the table datagrams are judged against (the old one is released here, once no reader is in it).
    private func publishRoutes() {
        var table: [UInt64: LinkReceiver] = [:]
        for route in io.value.routes.values { table[route.localToken] = route.receiver }
        datagrams.routes.replace(with: RouteTable(table))
    }

    /// `link`'s peer now sends from `address` (an invitee follows the inviter's source port): answers go there.
    /// Returns whether the route moved (the caller republishes the send table).
    private func latch(_ link: LinkID, to address: SocketAddress) -> Bool {
        guard io.value.routes[link] != nil, io.value.routes[link]?.remote != address else { return false }
        io.value.routes[link]?.remote = address
        return true
    }

    // MARK: Loop: timers

    /// Arms the session's one timer for the earliest of the state machine's deadline and the next ping round.
    private func armTimer() {
        let machineDeadline = shared.withLock { $0.machine.nextDeadline() }
        var next = machineDeadline ?? .max
        if !io.value.routes.isEmpty { next = min(next, io.value.nextPing) }
        io.value.timer.arm(next, on: loop) { [weak self] in self?.timerFired() }
    }

    private func timerFired() {
        io.value.timer.fired()
        let now = MonotonicClock.nowNanos()
        // Datagrams' proofs of life, noted by whichever thread read them, reach the state machine before it judges.
        let heard = io.value.routes.map { ($0.key, $0.value.receiver.counters.lastHeard.load(ordering: .relaxed)) }
        let actions = shared.withLock { s -> [SessionStateMachine.Action] in
            for (link, at) in heard where at != 0 { s.machine.heardDatagram(on: link, now: at) }
            return s.machine.tick(now: now)
        }
        if now >= io.value.nextPing {
            io.value.nextPing = now + heartbeat
            for route in io.value.routes.values {
                sendPing(to: route.remote, token: route.remoteToken, counters: route.receiver.counters,
                         key: route.receiver.keys?.send, now: now)
            }
        }
        perform(actions)
        armTimer()
    }

    // MARK: Loop: datagrams

    private func sendPing(to address: SocketAddress, token: UInt64, counters lc: LinkCounters, key: SecretKey?, now: Nanos) {
        datagrams.sendControl(.ping, token: token, counters: lc, key: key, timestamp: now, to: address)
    }

    /// The loop's turn at the UDP socket (`.delegate` delivery): datagrams go to the delegate.
    private func readDatagrams() {
        // One load of the (weak) session and delegate for the whole batch.
        let receiver = (owner.withLock { $0.value }, delegate.withLock { $0.value })
        var moved = false
        // Bounded so a flood cannot starve the control connections and timers.
        _ = datagrams.read(into: loop.readBuffer, maximum: 256, deliver: { payload, peer in
            if let s = receiver.0, let d = receiver.1 { d.session(s, didReceiveDatagramBytes: payload, fromPeer: peer) }
        }, latched: { link, address in
            moved = latch(link, to: address) || moved
        })
        if moved { publishSendTable() }
    }
}

/// The senders' table: connected peers' send routes, published whole (`SnapshotCell`) whenever a route changes.
final class SendTable: Sendable {
    let routes: [PeerID: SendRoute]
    /// Peers reached only through a relay pipe, by link.
    let relayed: [PeerID: LinkID]
    init(_ routes: [PeerID: SendRoute], relayed: [PeerID: LinkID]) {
        self.routes = routes
        self.relayed = relayed
    }
}

extension DatagramBody {
    /// Parses the body of a datagram of `kind`: data needs at least one byte, ping and pong exactly an 8-byte
    /// timestamp.
    static func parse(kind: DatagramHeader.Kind, payload: UnsafeRawBufferPointer) -> Result<DatagramBody, DatagramDrop> {
        switch kind {
        case .data:
            return payload.isEmpty ? .failure(.malformed) : .success(.data)
        case .ping:
            return payload.count == 8 ? .success(.ping) : .failure(.malformed)
        case .pong:
            guard payload.count == 8 else { return .failure(.malformed) }
            return .success(.pong(sentAt: UInt64(bigEndian: payload.loadUnaligned(as: UInt64.self))))
        }
    }
}

/// A weak reference to the delegate.
struct WeakDelegate {
    weak var value: (any SessionDelegate)?
    init(_ v: (any SessionDelegate)?) { value = v }
}

/// A weak reference from the core back to its public session, for delegate calls.
struct WeakSession {
    weak var value: Session?
    init(_ v: Session?) { value = v }
}
