import FoundationEssentials
import MeshPOSIX
import Synchronization

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
        /// The key an invited peer must prove, by link.
        var expectedKeys: [LinkID: ExpectedKey] = [:]
        /// Invitations from each host accepted by the app but still waiting on the certificate check.
        var admitting: [[UInt8]: Int] = [:]
        /// Those invitations' connections, held paused until the app answers: shutdown closes them too.
        var judged: [ObjectIdentifier: Connection] = [:]
        /// Connected links' datagram routes, by link (what the route table and the send table are built from).
        var routes: [LinkID: LoopRoute] = [:]
        /// A retry is scheduled to release route tables a reader still held when they were replaced.
        var reclaimingRoutes = false
        /// Peers connected only through a relay pipe (no UDP path), by their link: their datagrams go on the
        /// connection. Published to senders in the send table.
        var relayedLinks: [PeerID: LinkID] = [:]
        var failureDetail: [LinkID: String] = [:]
        /// A better reason than the state machine's for a link's failure (our own certificate check said no).
        var failureReason: [LinkID: DeclineReason] = [:]
        /// The UDP socket (`.delegate` delivery) or the reader's latch wake-up (`.reader`), as watched by the loop.
        var udpRegistration: EventLoop.Registration?
        /// Where senders leave datagrams for relayed peers, made with the first relayed link (published to senders in
        /// the send table), and its wake-up as watched by the loop.
        var relayedOutbox: RelayedDatagramOutbox?
        var outboxRegistration: EventLoop.Registration?
        /// The loop refused to watch the outbox: relayed peers' datagrams are counted as not sent.
        var relayedOutboxRefused = false
        var timer = DeadlineTimer()
        var nextPing: Nanos = 0
        var resources: ResourceStateMachine
        var outgoingResources: [ResourceKey: OutgoingResource] = [:]
        var incomingResources: [ResourceKey: IncomingResource] = [:]
        /// The buffer outgoing transfers read each chunk into (see `pumpResources`).
        var resourceChunk: [UInt8] = []
        /// Bytes of incoming resources written since the disk's free space was last read (`writeIncoming`).
        var resourceBytesUnchecked = 0
        var streams = StreamStateMachine()
        var membership: MembershipStateMachine
        /// Peers whose connected link ended without a GOODBYE (`linkDown(…, .lost)`) and that are not yet reported
        /// `notConnected` (that report, in the same actions or after a hold or a yield, is a loss the mesh may mend).
        var lostPeers: Set<PeerID> = []
        var outputStreams: [StreamKey: OutputByteStream] = [:]
        var inputStreams: [StreamKey: InputByteStream] = [:]
        var relay: RelayStateMachine
        var relayEnds: [PipeKey: RelayEnd] = [:]
        /// Calls through an introducer whose pipe is being opened: the attempt, which pins the key and holds the
        /// ticket.
        var relayCalls: [PipeKey: DirectAttempt] = [:]
        /// Invitations that are steps of a `DirectAttempt` (a browser's, an introduction's, the app's connection
        /// data's), by link: what to try next if they fail.
        var attempts: [LinkID: DirectAttempt] = [:]
        /// Links an introduction made, with that introduction: we followed it (the link was a step of an attempt with
        /// an introducer), or the peer came with connection data we made for it. While the introducer's membership
        /// stands, such a link introduces its peer only to members the introducer did not know of
        /// (`MembershipStateMachine.connected`). Kept until the link ends.
        var introducedLinks: [LinkID: MembershipStateMachine.Introduction] = [:]
        /// Our invitations' message 3s (our share of the digits): how many may end unaccepted before the next waits.
        var shares: InviterShareRation
    }

    /// The key an invited peer must prove, and where it came from: an advertisement (which anyone on the network can
    /// publish), or connection data (an introduction by a member, or data the app had out of band), which already
    /// decides whom the link reaches, so that the digits decide nothing on it and its message 3 is not rationed.
    struct ExpectedKey {
        let key: PublicKey
        let fromConnectionData: Bool
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
    let sendTable = SnapshotCell<SendTable>(SendTable([:], relayed: [:]))

    init(peer: PeerID, preference: EncryptionPreference, configuration c: Session.Configuration) throws(PeerMeshError) {
        self.peer = peer
        self.preference = preference
        configuration = c
        resourceDirectory = c.resourceDirectory.isEmpty ? TemporaryDirectory.system : c.resourceDirectory
        Sys.raiseFileLimit()
        let timeout = c.peerTimeout.nanoseconds
        peerTimeout = timeout
        var beat = min(timeout / 4, Session.Configuration.longestDefaultHeartbeat.nanoseconds)
        if let h = c.heartbeatInterval {
            beat = h.nanoseconds
            guard beat > 0, beat < timeout else { throw .invalidParameter("heartbeatInterval must be positive and below peerTimeout") }
        }
        heartbeat = beat
        if let reach = c.reachTimeout, reach <= .zero { throw .invalidParameter("reachTimeout must be positive") }
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
                                                               peerTimeout: timeout, heartbeatInterval: beat,
                                                               maximumMessageSize: c.maximumMessageSize,
                                                               reachTimeout: c.reachTimeout?.nanoseconds))
        shared = Mutex(Shared(machine: machine))
        var limits = ResourceStateMachine.Limits()
        // Progress counts in Int64: a larger limit (`.max` for "no limit") means as large as that can count.
        limits.maximumSize = min(c.maximumResourceSize, UInt64(Int64.max))
        let topology: Session.Topology = preference == .none ? .star : c.topology
        io = LoopBound(IO(resources: ResourceStateMachine(limits: limits),
                          membership: MembershipStateMachine(me: peer, topology: topology, maximumPeers: c.maximumPeers),
                          relay: RelayStateMachine(topology: topology),
                          shares: InviterShareRation(configuration: .init(burst: c.unansweredInvitationBurst))), loop: loop)
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
                    if datagrams.latchesLost.exchange(false, ordering: .acquiring) { moved = followLostLatches() || moved }
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
            stopAttempts(to: nil)
            perform(actions)
            if let r = io.value.udpRegistration { loop.deregister(r) }
            io.value.udpRegistration = nil
            if let r = io.value.outboxRegistration { loop.deregister(r) }
            io.value.outboxRegistration = nil
            io.value.timer.cancel(on: loop)
            io.value.shares = InviterShareRation(configuration: io.value.shares.configuration)
            for c in io.value.connections.values { c.close() }
            io.value.connections.removeAll()
            io.value.introducedLinks.removeAll()
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
    func invite(expected: PeerID?, endpoint: PeerEndpoint, alternates: [SocketAddress] = [], context: Data?,
                timeout: Duration, keyFromConnectionData: Bool = false,
                attempt: AttemptStep? = nil) throws(PeerMeshError) -> LinkID {
        guard (context?.count ?? 0) <= ControlFrame.maximumContext else {
            throw .invalidParameter("invitation context is \(context?.count ?? 0) bytes; at most \(ControlFrame.maximumContext)")
        }
        // A step that continues an attempt the app has given up on opens no connection (checked again under the
        // lock below, against a disconnect meanwhile).
        if let attempt, attempt.continuing, let expected, !shared.withLock({ $0.machine.isHeld(expected) }) {
            throw .cancelled("the connection to \(expected.displayName) was given up")
        }
        // Numeric addresses at once; names through the system resolver (/etc/hosts, DNS, mDNS .local with nss-mdns).
        let addr: SocketAddress
        do { addr = try SocketAddress.resolve(host: endpoint.host, port: endpoint.port)[0] } catch {
            throw error.isTemporary ? .transport(error.description) : .unresolvable(error.description)
        }
        let sock: FileDescriptor
        do { sock = try FileDescriptor.tcpConnect(to: addr, from: bindAddress) } catch { throw .transport(error.description) }
        return try invite(expected: expected, socket: sock, remote: addr, alternates: alternates, relayed: false,
                          context: context, timeout: timeout, keyFromConnectionData: keyFromConnectionData,
                          attempt: attempt)
    }

    /// An invitation that is a step of a `DirectAttempt`: the peer is held `connecting` until `holdUntil` (in the same
    /// locked step that starts the invitation, so that no disconnect falls between them); a step `continuing` an
    /// attempt starts only while the peer is still held.
    struct AttemptStep {
        let continuing: Bool
        let holdUntil: Nanos
    }

    /// Invites over `socket`: a TCP connect in progress to `remote` (raced against connects to `alternates`, when
    /// given: `Connection.race`), or (`relayed`) our side of a relay pipe.
    /// `keyFromConnectionData`: `expected`'s key comes from connection data, not an advertisement (`ExpectedKey`).
    /// `attempt`: the invitation is a step of a `DirectAttempt` (`AttemptStep`), checked and held under the lock the
    /// app's `disconnect` takes.
    @discardableResult
    func invite(expected: PeerID?, socket sock: FileDescriptor, remote addr: SocketAddress?, alternates: [SocketAddress] = [],
                relayed: Bool, context: Data?, timeout: Duration, keyFromConnectionData: Bool = false,
                attempt: AttemptStep? = nil) throws(PeerMeshError) -> LinkID {
        let ctx = Array(context ?? Data())
        guard ctx.count <= ControlFrame.maximumContext else {
            throw .invalidParameter("invitation context is \(ctx.count) bytes; at most \(ControlFrame.maximumContext)")
        }
        let nanos = (timeout <= .zero ? .seconds(30) : timeout).nanoseconds
        let token = UInt64.random(in: 1...UInt64.max)
        let (link, actions) = try shared.withLock { (s) throws(PeerMeshError) -> (LinkID, [SessionStateMachine.Action]) in
            guard !s.shutDown else { throw .sessionClosed }
            if let attempt, attempt.continuing, let expected, !s.machine.isHeld(expected) {
                throw .cancelled("the connection to \(expected.displayName) was given up")
            }
            let id = s.nextLink
            s.nextLink += 1
            var actions = s.machine.inviteStarted(link: id, expected: expected, context: ctx, timeout: nanos,
                                                  localUDPPort: udpPort, localToken: token, now: MonotonicClock.nowNanos())
            if let attempt, let expected, s.machine.has(id) {
                actions += s.machine.hold(expected, until: attempt.holdUntil)
            }
            return (id, actions)
        }
        let pinned = expected?.publicKey
        loop.execute { [self] in
            // A disconnect on another thread may have ended the link since, its actions carried out first: this
            // invitation's are stale then (a `connecting` after that `notConnected`), and its socket is not needed.
            if !actions.contains(.close(link)), !shared.withLock({ $0.machine.has(link) }) { return sock.close() }
            // The peer may also have connected meanwhile by another link (its invitation to us, which won), its
            // `connected` carried out first: this invitation's `connecting` is stale then, and is not reported. (An
            // invitation's start reports nothing else: `inviteStarted` and `hold` report only `connecting`.)
            let actions = shared.withLock { s in
                actions.filter {
                    guard case .report(let p, let st) = $0 else { return true }
                    precondition(st == .connecting, "an invitation's start reports only connecting")
                    return s.machine.state(of: p) != .connected
                }
            }
            let c = Connection(socket: sock, remote: addr, connecting: true, loop: loop, channel: channelConfiguration(.initiator),
                               relayed: relayed)
            c.maximumQueued = 2 * configuration.maximumQueuedBytes
            if !alternates.isEmpty {
                c.race(alternates: alternates, from: bindAddress, stagger: ConnectRace.connectionAttemptDelay) { [unowned self] outcome in
                    raceDecided(outcome, on: link)
                }
            }
            io.value.connections[link] = c
            io.value.localTokens[link] = token
            if let pinned { io.value.expectedKeys[link] = ExpectedKey(key: pinned, fromConnectionData: keyFromConnectionData) }
            c.start(onFrame: { [unowned self] f in received(f, on: link) },
                    onApproval: { [unowned self] p in identified(p, on: link) },
                    onEnd: { [unowned self] why in ended(link, why) })
            perform(actions)
        }
        return link
    }

    /// The peer on `link` broke the protocol: count it, say so, close the link.
    func faulted(_ link: LinkID, _ fault: PeerFault) {
        counters.add { $0.peerFaults += 1 }
        io.value.failureDetail[link] = fault.description
        closeForFault(link)
    }

    /// Closes `link` for its peer's fault: by choice (GOODBYE), and a connected peer is not brought back by the mesh
    /// for a while (`perform`, at its `linkDown`).
    private func closeForFault(_ link: LinkID) {
        perform(shared.withLock { $0.machine.closeForFault(link) })
    }

    func disconnect() {
        let actions = shared.withLock { $0.machine.disconnect() }
        loop.execute { [self] in
            stopAttempts(to: nil)
            // Leaving by choice: nothing is lost, and nothing waits to be asked for if the app joins again.
            io.value.lostPeers.removeAll()
            io.value.membership.leftSession()
            perform(actions)
        }
    }

    func disconnect(_ peer: PeerID) {
        let actions = shared.withLock { $0.machine.disconnect(peer) }
        // Ending a link is a choice against the peer; cancelling an invitation to it is not.
        let endsALink = actions.contains { if case .linkDown(_, let p, _) = $0 { p == peer } else { false } }
        loop.execute { [self] in
            // The app's choice stands until it connects the peer again: the mesh does not bring it back.
            if endsALink { io.value.membership.endedByChoice(peer, until: .max) }
            // A loss of it not yet reported (held, or yielding) is the app's letting go now, not a loss to mend.
            io.value.lostPeers.remove(peer)
            stopAttempts(to: peer)
            perform(actions)
        }
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

    // MARK: Loop: control connections

    func received(_ frame: ControlFrame, on link: LinkID) {
        let now = MonotonicClock.nowNanos()
        // The decliner's own words say more than the reason code ("the pairing window is closed; …").
        if case .decline(_, let text) = frame, !text.isEmpty { io.value.failureDetail[link] = text }
        // DATAGRAM frames stand in for UDP on a relayed link only: on a direct link they are out of place.
        if case .datagram = frame, io.value.connections[link]?.isRelayed == false {
            return faulted(link, .unexpectedFrame("DATAGRAM on a link that has a UDP path"))
        }
        // On a plaintext link no key is proved (`identified` is never called): the expected peer's HELLO is its
        // answer, and an attempt over several addresses stops at this one (another peer's goes on to the next).
        if case .hello(let p) = frame, io.value.connections[link]?.isPlaintext == true,
           let attempt = io.value.attempts[link], attempt.peer.identity == p.identity {
            reachedAttempt(on: link)
        }
        let actions = shared.withLock { $0.machine.received(frame, on: link, now: now) }
        perform(actions)
    }

    func ended(_ link: LinkID, _ why: ConnectionEnd) {
        // On a relayed link, a stream fault (bytes that do not open, or a stalled reader) may be the relaying member's
        // doing, not the peer's.
        let relayed = io.value.connections[link]?.isRelayed ?? false
        io.value.connections[link] = nil
        io.value.introducedLinks[link] = nil
        io.value.shares.ended(link)
        queuedBytes.withLock { $0[link] = nil }
        performResources(io.value.resources.linkClosed(link))
        performStreams(io.value.streams.linkClosed(link))
        relayLinkClosed(link)
        switch why {
        case .closedByPeer: break
        case .failed(let text):
            io.value.failureDetail[link] = text
        case .fault(let fault):
            // A peer that stopped reading sent nothing wrong: it is at fault, but its bytes were frames.
            if fault != .notReading { counters.add { $0.garbageConnections += 1 } }
            counters.add { $0.peerFaults += 1 }
            io.value.failureDetail[link] = fault.description
            // Our choice, unless the link was relayed: then it counts as lost, and the mesh may mend it.
            if !relayed { return closeForFault(link) }
        }
        let actions = shared.withLock { $0.machine.linkClosed(link) }
        perform(actions)
    }

    /// Carries out the state machine's actions, in order. Loop thread only; no lock is held.
    func perform(_ actions: [SessionStateMachine.Action]) {
        guard !actions.isEmpty else { return }
        let receiver = (owner.withLock { $0.value }, delegate.withLock { $0.value })
        var closed: [LinkID] = []
        // Handshakes whose turn an accepted invitation brought, finished once these actions are carried out.
        var due: [LinkID] = []
        // Handshakes that waited for their turn to a peer that connected meanwhile, ended once these are carried out.
        var superseded: [(PeerID, [LinkID])] = []
        // Links these actions brought up, by peer: the link a `.connected` report below is about.
        var upLinks: [PeerID: LinkID] = [:]
        defer {
            for l in closed {  // details no failure report took, and attempts no failure continued
                io.value.failureDetail[l] = nil
                io.value.failureReason[l] = nil
                io.value.attempts[l] = nil
                io.value.introducedLinks[l] = nil
            }
        }
        for a in actions {
            switch a {
            case .report(let p, let st):
                // How the link that connected `p` was made, read before the delegate runs (it may disconnect `p`).
                let introduction = st == .connected ? upLinks[p].flatMap { io.value.introducedLinks[$0] } : nil
                if let s = receiver.0, let d = receiver.1 { d.session(s, peer: p, didChange: st) }
                switch st {
                case .connected:
                    io.value.lostPeers.remove(p)
                    performMembership(io.value.membership.connected(p, introducedBy: introduction))
                case .notConnected:
                    let lost = io.value.lostPeers.remove(p) != nil
                    performMembership(io.value.membership.disconnected(p, lost: lost, now: MonotonicClock.nowNanos()))
                case .connecting: break
                }
            case .deliver(let p, let bytes):
                if let s = receiver.0, let d = receiver.1 { d.session(s, didReceive: Data(bytes), fromPeer: p) }
            case .deliverDatagram(let p, let bytes):
                counters.add { $0.datagramsReceived += 1 }
                if let s = receiver.0, let d = receiver.1 {
                    bytes.withUnsafeBytes { d.session(s, didReceiveDatagramBytes: $0, fromPeer: p) }
                }
            case .invitationFailed(let l, let p, let r):
                let outcome = continueAttempt(after: l, io.value.failureReason[l] ?? r)
                if outcome == .continuing || outcome.joinedOtherwise != nil {
                    io.value.failureDetail[l] = nil
                    io.value.failureReason[l] = nil
                    if let peer = outcome.joinedOtherwise { release(peer) }
                    continue
                }
                let detail = io.value.failureDetail.removeValue(forKey: l) ?? r.description
                let r = io.value.failureReason.removeValue(forKey: l) ?? r
                if let s = receiver.0, let d = receiver.1 { d.session(s, invitationTo: p, failedWith: r, detail: detail) }
                if case .ended(let peer) = outcome { release(peer) }
            case .fault(let l, let f):
                counters.add { $0.peerFaults += 1 }
                io.value.failureDetail[l] = f.description
            case .send(let l, let f):
                io.value.connections[l]?.send(f)
            case .close(let l):
                closed.append(l)
                io.value.connections.removeValue(forKey: l)?.close()
                io.value.shares.ended(l)
                io.value.localTokens[l] = nil
                io.value.expectedKeys[l] = nil
                queuedBytes.withLock { $0[l] = nil }
                performResources(io.value.resources.linkClosed(l))
                performStreams(io.value.streams.linkClosed(l))
                relayLinkClosed(l)
            case .linkUp(let l, let p, let port, let token):
                upLinks[p] = l
                if let introduction = io.value.attempts.removeValue(forKey: l)?.introduction {
                    io.value.introducedLinks[l] = introduction
                }
                // First the handshakes waiting for a turn to the same peer go, so that the turn this acceptance
                // frees cannot open one of them.
                superseded.append((p, io.value.shares.connected(p)))
                due += io.value.shares.accepted(l, now: MonotonicClock.nowNanos())
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
                performMembership(io.value.membership.received(frame, from: p, now: MonotonicClock.nowNanos()))
            case .relay(let l, let p, let frame):
                receivedRelay(frame, on: l, from: p)
            case .linkDown(let l, let p, let end):
                // Whether the peer's `.notConnected`, in these actions or later (after a hold or a yield), is a loss.
                if end == .lost { io.value.lostPeers.insert(p) } else { io.value.lostPeers.remove(p) }
                // Its far end may take a link we closed for a fault as lost: the mesh does not bring it back for a while.
                if end == .fault {
                    io.value.membership.endedByChoice(p, until: MonotonicClock.nowNanos() &+ MembershipStateMachine.faultQuarantine)
                }
                io.value.relayedLinks = io.value.relayedLinks.filter { $0.value != l }
                if io.value.routes.removeValue(forKey: l) != nil { publishRoutes() }
                publishSendTable()
            }
        }
        for (p, links) in superseded where !links.isEmpty { endSuperseded(links, by: p) }
        finishHandshakes(due)
        armTimer()
    }

    // MARK: Loop: timers

    /// Arms the session's one timer for the earliest of the state machine's deadline, the next ping round and the
    /// turn of a handshake waiting for the ration of our shares of the digits.
    func armTimer() {
        let machineDeadline = shared.withLock { $0.machine.nextDeadline() }
        var next = min(machineDeadline ?? .max, io.value.shares.nextDeadline() ?? .max, io.value.membership.nextDeadline ?? .max)
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
        performMembership(io.value.membership.tick(now: now))
        finishHandshakes(io.value.shares.expire(now: now))
        armTimer()
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
