import FoundationEssentials
import MeshPOSIX
import Synchronization

/// Receives an advertiser's invitations, as MC's `MCNearbyServiceAdvertiserDelegate`. Called on the process's
/// I/O thread (`pm-io`), in order; keep it short, and answer later (from any thread) when a person must decide.
public protocol NearbyServiceAdvertiserDelegate: AnyObject, Sendable {
    /// A peer invites us. Call `invitationHandler(true, session)` to join `session`, or
    /// `invitationHandler(false, nil)` to decline — now or later, from any thread, once. An invitation not
    /// answered within the inviter's timeout is declined for you.
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceiveInvitationFromPeer peer: PeerID,
                    withContext context: Data?, invitationHandler: @escaping @Sendable (Bool, Session?) -> Void)
    /// Advertising failed (the discovery daemon is gone…).
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didNotStartAdvertisingPeer error: PeerMeshError)
    /// The advertisement went out (under `instanceName`), or waits for the discovery daemon (`.waitingForDaemon`).
    /// Lets an app tell people the truth about whether it can be found.
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didUpdate publication: PublicationEvent)
    /// A peer invites us — the richer form of the call above: the inviter's proven key and address, a decline with
    /// a reason and a message, and a notice when the invitation is withdrawn. The default forwards to the MC form.
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceive invitation: Invitation)
}

public extension NearbyServiceAdvertiserDelegate {
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didNotStartAdvertisingPeer error: PeerMeshError) {}
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didUpdate publication: PublicationEvent) {}
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceive invitation: Invitation) {
        self.advertiser(advertiser, didReceiveInvitationFromPeer: invitation.peer, withContext: invitation.context) { ok, session in
            if ok, let session { invitation.accept(into: session) } else { invitation.decline() }
        }
    }
}

/// Counters of an advertiser's callers since it started advertising: what it refused, and why.
public struct AdvertiserStatistics: Sendable, Equatable {
    /// Connections whose caller spoke (in Noise mode this side answered its message 1 with message 2) and that ended
    /// before the app let it through: it hung up, broke the protocol, ran out of time, withdrew its invitation, was
    /// declined, was evicted at a cap, or was still under way when advertising stopped. (A caller the app let through
    /// and its session then turned away is charged against its address's tries, not counted here.)
    public var unadmittedHandshakes: UInt64 = 0
    /// Connections refused at accept because their address had used up its tries (16 not let in at once, then one a
    /// second): what a man in the middle searching for matching digits runs into (docs/PROTOCOL.md §3.2), or a
    /// client that keeps being turned away and trying again at once.
    public var rationedConnections: UInt64 = 0

    public init() {}
}

/// Publishes this peer under a service type and accepts invitations, as MC's `MCNearbyServiceAdvertiser`.
///
/// It listens on a TCP port (`port`, 0 picks one) and publishes that port through a `DiscoveryBackend`
/// (Avahi by default). Give the host's `Session` the same port as its `udpPort` to use one port number per host.
public final class NearbyServiceAdvertiser: Sendable {
    /// This peer.
    public let myPeerID: PeerID
    /// The app's discovery info.
    public var discoveryInfo: [String: String]? { info.withLock { $0 } }
    private let info: Mutex<[String: String]?>
    /// The MC-style service type.
    public let serviceType: String
    /// How long an unanswered invitation may wait at most, whatever the inviter asked (default 60 s).
    public let maximumInvitationWait: Duration
    /// How much the advertiser insists on encryption when an inviter connects (default `.required`). The
    /// session an invitation is accepted into must agree: a `.required` session refuses a plaintext link.
    public let encryptionPreference: EncryptionPreference

    private let discovery: any DiscoveryBackend
    private let requestedPort: UInt16
    private let bindHost: String
    private let state = Mutex<Running?>(nil)
    /// A listener bound ahead of `startAdvertisingPeer` by `reservePort()`, which it takes.
    private let reserved = Mutex<FileDescriptor?>(nil)
    private let delegateBox = Mutex(WeakAdvertiserDelegate(nil))

    /// A started advertiser: its loop-side driver and its publication.
    private struct Running: Sendable {
        let port: UInt16
        let core: AdvertiserCore
        let registration: any DiscoveryRegistration
    }

    /// Validates the service type and discovery info. `discovery` defaults to `AvahiDiscovery`.
    public init(peer: PeerID, discoveryInfo: [String: String]?, serviceType: String,
                discovery: (any DiscoveryBackend)? = nil, port: UInt16 = 0, bindHost: String = "",
                maximumInvitationWait: Duration = .seconds(60),
                encryptionPreference: EncryptionPreference = .required) throws(PeerMeshError) {
        if encryptionPreference != .none, peer.keys == nil {
            throw .invalidParameter("peer \(peer) has no key pair; use PeerID(displayName:) or a PeerIdentity")
        }
        try DiscoveryValidation.validate(serviceType: serviceType)
        try DiscoveryValidation.validate(discoveryInfo: discoveryInfo ?? [:])
        myPeerID = peer
        info = Mutex(discoveryInfo)
        self.serviceType = serviceType
        if let discovery { self.discovery = discovery } else { self.discovery = try AvahiDiscovery() }
        requestedPort = port
        self.bindHost = bindHost
        self.maximumInvitationWait = maximumInvitationWait
        self.encryptionPreference = encryptionPreference
    }

    deinit { stopAdvertisingPeer() }

    /// The delegate, held weakly.
    public var delegate: (any NearbyServiceAdvertiserDelegate)? {
        get { delegateBox.withLock { $0.value } }
        set { delegateBox.withLock { $0 = WeakAdvertiserDelegate(newValue) } }
    }

    /// The TCP port invitations arrive on, once started.
    public var port: UInt16? { state.withLock { $0?.port } }

    /// What the advertiser refused and why, since it started advertising (zeros when it is not advertising).
    public var statistics: AdvertiserStatistics { state.withLock { $0?.core }?.statistics ?? AdvertiserStatistics() }

    /// Binds the TCP listener now, before advertising starts, so that a caller that needs this port number for
    /// something else too (the relay host: one number for TCP and UDP) learns at once whether it is free, and keeps it.
    /// `startAdvertisingPeer` then listens on it. Throws `.transport` with the bind's error ("Address already in
    /// use"…). Nothing is published and no invitation is taken until `startAdvertisingPeer`.
    package func reservePort() throws(PeerMeshError) {
        guard state.withLock({ $0 == nil }), reserved.withLock({ $0 == nil }) else { return }
        let listener = try bindListener()
        reserved.withLock { r in
            if r == nil { r = listener } else { listener.close() }
        }
    }

    private func bindListener() throws(PeerMeshError) -> FileDescriptor {
        guard let bind = SocketAddress.bindAddress(bindHost, port: requestedPort) else {
            throw .invalidParameter("bindHost \"\(bindHost)\" is not a numeric IPv4 or IPv6 address (or \"\" for all)")
        }
        do { return try FileDescriptor.tcpListener(bind) } catch { throw .transport(error.description) }
    }

    /// Opens the listener (or takes the one `reservePort` bound), publishes, and starts taking invitations. Throws if
    /// the port cannot be bound or the discovery backend refuses.
    public func startAdvertisingPeer() throws(PeerMeshError) {
        guard state.withLock({ $0 == nil }) else { return }
        let listener: FileDescriptor
        if let r = reserved.withLock({ r -> FileDescriptor? in defer { r = nil }; return r }) { listener = r } else {
            listener = try bindListener()
        }
        let core: AdvertiserCore
        do {
            core = AdvertiserCore(listener: listener, port: try listener.localAddress().port, loop: try EventLoop.shared(),
                                  configuration: .init(localPeer: myPeerID, maximumInvitationWait: maximumInvitationWait.nanoseconds),
                                  channel: SecureChannel.Configuration(role: .responder, preference: encryptionPreference,
                                                                       localPeer: myPeerID,
                                                                       maximumFrameLength: AdvertiserCore.maximumFrameBeforeAcceptance),
                                  advertiser: WeakAdvertiser(self))
        } catch {
            throw .transport(error.description)
        }
        let registration: any DiscoveryRegistration
        do { registration = try publish(port: core.port) } catch {
            // Nothing published: keep the port for the next try, as `reservePort` did.
            reserved.withLock { r in if r == nil { r = listener } }
            throw error
        }
        state.withLock { $0 = Running(port: core.port, core: core, registration: registration) }
        core.start()
    }

    private func publish(port: UInt16) throws(PeerMeshError) -> any DiscoveryRegistration {
        let ad = ServiceAdvertisement(peer: myPeerID, serviceType: serviceType, port: port, discoveryInfo: discoveryInfo ?? [:])
        return try discovery.publish(ad) { [weak self] event in
            guard let self else { return }
            if case .failed(let e) = event { self.delegate?.advertiser(self, didNotStartAdvertisingPeer: e) }
            self.delegate?.advertiser(self, didUpdate: event)
        }
    }

    /// Replaces the discovery info and, if advertising, publishes the new record (connections and pending
    /// invitations are not touched). MC has no such call — there an app stops and starts the advertiser.
    ///
    /// - Throws: `invalidParameter` for info that cannot be advertised (nothing changes then); the backend's error
    ///   when the new record cannot be published. The old one is withdrawn by then, so the peer is no longer
    ///   advertised: the delegate hears that too, as it hears a publication that fails later
    ///   (`didNotStartAdvertisingPeer`, then `didUpdate: .failed`).
    public func updateDiscoveryInfo(_ newInfo: [String: String]?) throws(PeerMeshError) {
        try DiscoveryValidation.validate(discoveryInfo: newInfo ?? [:])
        info.withLock { $0 = newInfo }
        guard let running = state.withLock({ $0 }) else { return }
        // Withdraw first: one instance name cannot be published twice at once.
        running.registration.cancel()
        let registration: any DiscoveryRegistration
        do { registration = try publish(port: running.port) } catch {
            // Told on the I/O thread, as the delegate's other calls, and after this call has returned.
            running.core.onLoop { [weak self] in
                guard let self, let delegate = self.delegate else { return }
                delegate.advertiser(self, didNotStartAdvertisingPeer: error)
                delegate.advertiser(self, didUpdate: .failed(error))
            }
            throw error
        }
        state.withLock { s in
            if let r = s { s = Running(port: r.port, core: r.core, registration: registration) } else { registration.cancel() }
        }
    }

    /// Withdraws the advertisement and closes the listener (a reserved one too). Invitations not yet answered are
    /// declined.
    public func stopAdvertisingPeer() {
        reserved.withLock { r in
            r?.close()
            r = nil
        }
        guard let r = state.withLock({ s -> Running? in let r = s; s = nil; return r }) else { return }
        r.registration.cancel()
        r.core.stop()
    }

    /// Takes `socket`, the end of a relay pipe another member splices to a caller, as a connection from the
    /// listener. False (and the socket closed) when not advertising.
    func admitRelayed(_ socket: FileDescriptor, from caller: PeerID) -> Bool {
        guard let core = state.withLock({ $0?.core }) else {
            socket.close()
            return false
        }
        core.admitRelayed(socket, from: caller)
        return true
    }

    fileprivate func deliver(_ invitation: Invitation) {
        guard let d = delegate else { return invitation.decline(.unavailable) }
        d.advertiser(self, didReceive: invitation)
    }
}

private struct WeakAdvertiserDelegate {
    weak var value: (any NearbyServiceAdvertiserDelegate)?
    init(_ v: (any NearbyServiceAdvertiserDelegate)?) { value = v }
}

private struct WeakAdvertiser: Sendable {
    weak var value: NearbyServiceAdvertiser?
    init(_ v: NearbyServiceAdvertiser) { value = v }
}

/// The advertiser's driver on the event loop: accepts connections, feeds the pure `AdvertiserStateMachine` and
/// carries out what it decides — greetings, questions to the app, hand-overs to sessions, declines.
private final class AdvertiserCore: Sendable {
    private struct IO {
        var machine: AdvertiserStateMachine
        var connections: [PendingID: Connection] = [:]
        /// Invitations the app holds, to withdraw when they go away unanswered.
        var invitations: [PendingID: Invitation] = [:]
        var registration: EventLoop.Registration?
        var accepting = true
        var timer = DeadlineTimer()
        var nextID: PendingID = 0
    }

    /// Largest frame before the app accepts: an INVITE with the largest context.
    static let maximumFrameBeforeAcceptance = 1 + 16 + ControlFrame.maximumContext

    let port: UInt16
    private let listener: FileDescriptor
    private let loop: EventLoop
    private let advertiser: WeakAdvertiser
    private let channel: SecureChannel.Configuration
    private let io: LoopBound<IO>

    init(listener: FileDescriptor, port: UInt16, loop: EventLoop, configuration: AdvertiserStateMachine.Configuration,
         channel: SecureChannel.Configuration, advertiser: WeakAdvertiser) {
        Sys.raiseFileLimit()
        self.listener = listener
        self.port = port
        self.loop = loop
        self.channel = channel
        self.advertiser = advertiser
        io = LoopBound(IO(machine: AdvertiserStateMachine(configuration: configuration)), loop: loop)
    }

    func start() {
        loop.execute { [self] in
            io.value.registration = loop.register(fd: listener.fd, interest: .readable) { [unowned self] _ in acceptAll() }
        }
    }

    /// Runs `work` on the I/O thread, where the advertiser's delegate is called.
    func onLoop(_ work: @escaping @Sendable () -> Void) { loop.execute(work) }

    /// The state machine's counters as of the loop's last event (any thread; never waits on the loop).
    var statistics: AdvertiserStatistics { published.withLock { $0 } }

    /// The machine's counters as of the loop's last event, for any thread to read without waiting on the loop.
    private let published = Mutex(AdvertiserStatistics())

    /// Runs one event through the state machine, then copies its counters out for `statistics` — before anything
    /// acts on the outcome, so that a caller never sees its refusal (a close) before it is counted. Loop thread only.
    private func decide<Outcome>(_ event: (inout AdvertiserStateMachine) -> Outcome) -> Outcome {
        let outcome = event(&io.value.machine)
        let counters = io.value.machine.counters
        published.withLock { $0 = counters }
        return outcome
    }

    /// Declines what is pending and closes the listener; waits for it unless called on the loop.
    func stop() {
        loop.submitAndWait { [self] in
            let ends = decide { $0.stop() }
            for e in ends { perform(e) }
            // Whatever the machine no longer counted: none may outlive us holding our handlers.
            for c in io.value.connections.values { c.close() }
            io.value.connections.removeAll()
            for i in io.value.invitations.values { i.withdraw() }
            io.value.invitations.removeAll()
            if let r = io.value.registration { loop.deregister(r) }
            io.value.registration = nil
            io.value.timer.cancel(on: loop)
            listener.close()
        }
    }

    // MARK: Loop

    private func acceptAll() {
        while io.value.accepting {
            let accepted: (FileDescriptor, SocketAddress?)?
            do { accepted = try listener.accept() } catch {
                // Out of descriptors (EMFILE…): the connection stays queued; retry shortly instead of spinning.
                pauseAccepting(retryAt: MonotonicClock.nowNanos() + 50_000_000)
                return
            }
            guard let (socket, remote) = accepted else { return }
            admit(socket, remote: remote, relayed: false)
            if io.value.machine.isFull { pauseAccepting(retryAt: nil) }
        }
        armTimer()
    }

    /// Takes a relay pipe's end as a connection (from any thread).
    func admitRelayed(_ socket: FileDescriptor, from caller: PeerID) {
        // A relayed caller has no address of its own: its tries are rationed by the identity its relaying member names
        // (one this side made a ticket for; the handshake proves it only at message 3), so that one relayed caller
        // cannot use up every relayed caller's tries.
        let key = [0xff] + withUnsafeBytes(of: caller.identity.bigEndian, Array.init)
        loop.execute { [self] in admit(socket, remote: nil, relayed: true, rationKey: key) }
    }

    /// Takes a connection as if accepted from the listener: a TCP one, or a relay pipe's end (no `remote`; its
    /// tries are rationed under `rationKey`). Loop thread only.
    private func admit(_ socket: FileDescriptor, remote: SocketAddress?, relayed: Bool, rationKey: [UInt8]? = nil) {
        io.value.nextID += 1
        let id = io.value.nextID
        let decision = decide { $0.accepted(id, host: rationKey ?? remote?.hostBytes ?? [], now: MonotonicClock.nowNanos()) }
        switch decision {
        case .refuse:
            socket.close()
        case .greet(_, let hello, let victim):
            if let victim { io.value.connections.removeValue(forKey: victim)?.close() }
            let c = Connection(socket: socket, remote: remote, connecting: false, loop: loop, channel: channel, relayed: relayed)
            io.value.connections[id] = c
            c.onFirstBytes = { [unowned self] in io.value.machine.heard(id, now: MonotonicClock.nowNanos()) }
            c.start(onFrame: { [unowned self] f in received(f, on: id) }, onEnd: { [unowned self] _ in ended(id) })
            c.send(hello)
        }
        if relayed { armTimer() }
    }

    /// Stops taking connections: until one ends (`retryAt` nil), or until a time.
    private func pauseAccepting(retryAt: Nanos?) {
        guard io.value.accepting, let r = io.value.registration else { return }
        io.value.accepting = false
        loop.update(r, interest: [])
        if let retryAt { loop.schedule(at: retryAt) { [weak self] in self?.resumeAccepting() } }
    }

    private func resumeAccepting() {
        guard !io.value.accepting, !io.value.machine.isFull, let r = io.value.registration else { return }
        io.value.accepting = true
        loop.update(r, interest: .readable)
    }

    private func received(_ frame: ControlFrame, on id: PendingID) {
        let action = decide { $0.received(frame, on: id, now: MonotonicClock.nowNanos()) }
        switch action {
        case .wait:
            break
        case .close(_, _):
            io.value.connections.removeValue(forKey: id)?.close()
            resumeAccepting()
        case .ask(_, let peer, let invite):
            guard let c = io.value.connections[id] else { break }
            c.pause()
            let certificate = peer.publicKey.map {
                PeerCertificate(publicKey: $0, shortAuthenticationString: c.shortAuthenticationString ?? "",
                                address: c.remote?.host, weInvited: false)
            }
            // The inviter learns the digits this side shows only once the app shows them to a person (or the session
            // lets it in), and then in its turn, one invitation a second: a man in the middle that searches for a
            // match pays one shown invitation and a second per guess (docs/PROTOCOL.md §3.2).
            // (A plaintext link has no digits: nothing to open, and no turn to take.)
            let encrypted = c.isEncrypted
            let reveal: @Sendable () -> Void = { [weak self] in
                guard encrypted, let self else { return }
                self.loop.execute { self.revealRequested(id) }
            }
            let invitation = Invitation(peer: peer, context: invite.context.isEmpty ? nil : Data(invite.context),
                                        address: c.remote?.host, certificate: c.isEncrypted ? certificate : nil,
                                        reveal: reveal) { [weak self] answer, session, introduction in
                guard let self else { return }
                self.loop.execute { self.answer(id, answer, session, introduction: introduction) }
            }
            io.value.invitations[id] = invitation
            if let a = advertiser.value { a.deliver(invitation) } else { invitation.decline(.unavailable) }
        }
        armTimer()
    }

    /// The app showed the digits of the invitation on `id`: open the caller's share now, or arm the timer for its turn.
    private func revealRequested(_ id: PendingID) {
        if case .open(let opened) = decide({ $0.revealRequested(id, now: MonotonicClock.nowNanos()) }) {
            io.value.connections[opened]?.revealNonce()
        }
        armTimer()
    }

    private func answer(_ id: PendingID, _ answer: AdvertiserStateMachine.Answer, _ session: Session?,
                        introduction: MembershipStateMachine.Introduction?) {
        io.value.invitations[id] = nil
        let rationKey = io.value.machine.rationKey(of: id)
        let action = decide { $0.answered(id, answer) }
        switch action {
        case .ignore:
            break
        case .handOver(_, let peer, let invite):
            guard let c = io.value.connections.removeValue(forKey: id) else { break }
            // The caller's try is forgiven once the session has let it in (the session runs on this loop).
            let admitted = { [weak self] in
                guard let self, let rationKey else { return }
                self.io.value.machine.admitted(rationKey: rationKey)
            }
            if let session {
                session.core.adopt(c, from: peer, invite: invite, listenerPort: port, introduction: introduction, onAdmitted: admitted)
            } else {
                c.send(.decline(.unavailable, DeclineReason.unavailable.description))
                c.close()
            }
        case .decline(_, let reason, let text):
            decline(id, reason, text)
        }
        resumeAccepting()
        armTimer()
    }

    private func ended(_ id: PendingID) {
        io.value.connections[id] = nil
        decide { $0.closed(id) }
        io.value.invitations.removeValue(forKey: id)?.withdraw()
        resumeAccepting()
    }

    private func decline(_ id: PendingID, _ reason: DeclineReason, _ text: String) {
        io.value.invitations.removeValue(forKey: id)?.withdraw()
        guard let c = io.value.connections.removeValue(forKey: id) else { return }
        c.send(.decline(reason, text))
        c.close()
    }

    private func perform(_ e: AdvertiserStateMachine.OnExpiry) {
        switch e {
        case .close(let id):
            io.value.invitations.removeValue(forKey: id)?.withdraw()
            io.value.connections.removeValue(forKey: id)?.close()
        case .decline(let id, let reason):
            decline(id, reason, reason.description)
        case .open(let id):
            io.value.connections[id]?.revealNonce()
        }
    }

    private func armTimer() {
        let next = io.value.machine.nextDeadline() ?? .max
        io.value.timer.arm(next, on: loop) { [weak self] in self?.timerFired() }
    }

    private func timerFired() {
        io.value.timer.fired()
        let ends = decide { $0.expire(now: MonotonicClock.nowNanos()) }
        for e in ends { perform(e) }
        resumeAccepting()
        armTimer()
    }
}
