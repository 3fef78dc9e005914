import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// An invitation read off a TCP connection by an advertiser: who sent it, what it asks, and the connection.
struct ReceivedInvitation: Sendable {
    let socket: FileDescriptor
    let remoteAddress: SocketAddress?
    let peer: PeerID
    let body: ControlFrame.InviteBody
    let pendingBytes: [UInt8]
    let listenerPort: UInt16

    /// Answers with DECLINE and closes the connection.
    static func decline(_ inv: ReceivedInvitation, _ reason: DeclineReason) {
        let bytes = ControlFrame.decline(reason, reason.description).encoded()
        _ = bytes.withUnsafeBytes { Glibc.send(inv.socket.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        shutdown(inv.socket.fd, Int32(SHUT_RDWR))
        inv.socket.close()
    }
}

/// Receives an advertiser's invitations, as MC's `MCNearbyServiceAdvertiserDelegate`. Called on the
/// advertiser's thread, in order.
public protocol NearbyServiceAdvertiserDelegate: AnyObject, Sendable {
    /// A peer invites us. Call `invitationHandler(true, session)` to join `session`, or
    /// `invitationHandler(false, nil)` to decline — now or later, from any thread, once. An invitation not
    /// answered within the inviter's timeout is declined for you.
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceiveInvitationFromPeer peer: PeerID,
                    withContext context: Data?, invitationHandler: @escaping @Sendable (Bool, Session?) -> Void)
    /// Advertising failed (the discovery daemon is gone…).
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didNotStartAdvertisingPeer error: PeerMeshError)
}

public extension NearbyServiceAdvertiserDelegate {
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didNotStartAdvertisingPeer error: PeerMeshError) {}
}

/// Publishes this peer under a service type and accepts invitations, as MC's `MCNearbyServiceAdvertiser`.
///
/// It listens on a TCP port (`port`, 0 picks one) and publishes that port through a `DiscoveryBackend`
/// (Avahi by default). Give the host's `Session` the same port as its `udpPort` to use one port number per host.
public final class NearbyServiceAdvertiser: Sendable {
    /// This peer.
    public let myPeerID: PeerID
    /// The app's discovery info.
    public let discoveryInfo: [String: String]?
    /// The MC-style service type.
    public let serviceType: String
    /// How long an unanswered invitation may wait at most, whatever the inviter asked (default 60 s).
    public let maximumInvitationWait: Duration

    private let discovery: any DiscoveryBackend
    private let requestedPort: UInt16
    private let bindHost: String
    private let state = Mutex(AdvertiserState())
    private let delegateBox = Mutex(WeakAdvertiserDelegate(nil))

    /// Validates the service type and discovery info. `discovery` defaults to `AvahiDiscovery`.
    public init(peer: PeerID, discoveryInfo: [String: String]?, serviceType: String,
                discovery: (any DiscoveryBackend)? = nil, port: UInt16 = 0, bindHost: String = "0.0.0.0",
                maximumInvitationWait: Duration = .seconds(60)) throws(PeerMeshError) {
        try DiscoveryValidation.validate(serviceType: serviceType)
        try DiscoveryValidation.validate(discoveryInfo: discoveryInfo ?? [:])
        myPeerID = peer
        self.discoveryInfo = discoveryInfo
        self.serviceType = serviceType
        if let discovery { self.discovery = discovery } else { self.discovery = try AvahiDiscovery() }
        requestedPort = port
        self.bindHost = bindHost
        self.maximumInvitationWait = maximumInvitationWait
    }

    deinit { stopAdvertisingPeer() }

    /// The delegate, held weakly.
    public var delegate: (any NearbyServiceAdvertiserDelegate)? {
        get { delegateBox.withLock { $0.value } }
        set { delegateBox.withLock { $0 = WeakAdvertiserDelegate(newValue) } }
    }

    /// The TCP port invitations arrive on, once started.
    public var port: UInt16? { state.withLock { $0.running?.port } }

    /// Opens the listener, publishes, and starts taking invitations. Throws if the port cannot be bound or the
    /// discovery backend refuses.
    public func startAdvertisingPeer() throws(PeerMeshError) {
        guard state.withLock({ $0.running == nil }) else { return }
        let listener = try FileDescriptor.tcpListener(host: bindHost, port: requestedPort)
        let port = try listener.localAddress().port
        let waker = try Waker()
        let loop = AdvertiserLoop(listener: listener, port: port, waker: waker, advertiser: WeakAdvertiser(self),
                                  maxWait: maximumInvitationWait)
        let ad = ServiceAdvertisement(peer: myPeerID, serviceType: serviceType, port: port, discoveryInfo: discoveryInfo ?? [:])
        let registration = try discovery.publish(ad) { [weak self] event in
            guard let self, case .failed(let e) = event else { return }
            self.delegate?.advertiser(self, didNotStartAdvertisingPeer: e)
        }
        state.withLock { $0.running = .init(port: port, loop: loop, registration: registration) }
        loop.start()
    }

    /// Withdraws the advertisement and closes the listener. Invitations not yet answered are declined.
    public func stopAdvertisingPeer() {
        guard let r = state.withLock({ s -> AdvertiserState.Running? in let r = s.running; s.running = nil; return r }) else { return }
        r.registration.cancel()
        r.loop.stop()
    }

    fileprivate func deliver(_ inv: ReceivedInvitation, reply: @escaping @Sendable (Bool, Session?) -> Void) {
        guard let d = delegate else {
            reply(false, nil)
            return
        }
        d.advertiser(self, didReceiveInvitationFromPeer: inv.peer,
                     withContext: inv.body.context.isEmpty ? nil : Data(inv.body.context), invitationHandler: reply)
    }
}

private struct AdvertiserState {
    struct Running {
        let port: UInt16
        let loop: AdvertiserLoop
        let registration: any DiscoveryRegistration
    }
    var running: Running?
}

private struct WeakAdvertiserDelegate {
    weak var value: (any NearbyServiceAdvertiserDelegate)?
    init(_ v: (any NearbyServiceAdvertiserDelegate)?) { value = v }
}

private struct WeakAdvertiser: Sendable {
    weak var value: NearbyServiceAdvertiser?
    init(_ v: NearbyServiceAdvertiser) { value = v }
}

/// The advertiser's I/O thread: accepts connections, says HELLO, reads HELLO + INVITE, hands invitations to the
/// delegate and carries out the replies. Connections that speak garbage, or nothing for 10 s, are closed.
private final class AdvertiserLoop: Sendable {
    private struct Pending {
        let socket: FileDescriptor
        let remote: SocketAddress?
        var assembler = FrameAssembler()
        var peer: PeerID?
        var invite: ControlFrame.InviteBody?
        var delivered = false
        let deadline: Nanos
        var outbound: [UInt8]
    }

    private enum Reply { case accept(Session), decline }

    private struct State {
        var pending: [Int: Pending] = [:]
        var replies: [(Int, Reply)] = []
        var nextID = 0
        var stopped = false
    }

    private let listener: FileDescriptor
    let port: UInt16
    private let waker: Waker
    private let advertiser: WeakAdvertiser
    private let maxWait: Nanos
    private let state = Mutex(State())
    private let done = DispatchSemaphore(value: 0)
    private let loopThread = Atomic<UInt>(0)

    init(listener: FileDescriptor, port: UInt16, waker: Waker, advertiser: WeakAdvertiser, maxWait: Duration) {
        self.listener = listener
        self.port = port
        self.waker = waker
        self.advertiser = advertiser
        self.maxWait = UInt64(maxWait.components.seconds) * 1_000_000_000
    }

    func start() {
        let t = Thread { [self] in run() }
        t.name = "peermesh.advertiser"
        t.start()
    }

    func stop() {
        state.withLock { $0.stopped = true }
        waker.wake()
        if loopThread.load(ordering: .acquiring) != UInt(pthread_self()) { done.wait() }
    }

    private func run() {
        loopThread.store(UInt(pthread_self()), ordering: .releasing)
        defer { done.signal() }
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 65_536, alignment: 8)
        defer { buffer.deallocate() }
        var fds: [pollfd] = []
        while true {
            // Replies first: decided by the app on any thread, carried out here.
            let (replies, stopped) = state.withLock { s in
                let r = s.replies
                s.replies.removeAll()
                return (r, s.stopped)
            }
            for (id, reply) in replies { carryOut(id, reply) }
            if stopped {
                let all = state.withLock { s in let p = s.pending; s.pending.removeAll(); return p }
                for p in all.values { decline(p, .unavailable) }
                listener.close()
                return
            }
            let ids = state.withLock { s in s.pending.keys.sorted() }
            fds.removeAll(keepingCapacity: true)
            fds.append(pollfd(fd: waker.fd, events: Int16(POLLIN), revents: 0))
            fds.append(pollfd(fd: listener.fd, events: Int16(POLLIN), revents: 0))
            // An invitation handed to the app is not read again until the app answers (carryOut sends what is left
            // to send), so its socket is left out of the poll: a hang-up there would otherwise wake us in a loop.
            let sockets = state.withLock { s in
                ids.map { (s.pending[$0]!.delivered ? -1 : s.pending[$0]!.socket.fd, !s.pending[$0]!.outbound.isEmpty) }
            }
            for (fd, w) in sockets { fds.append(pollfd(fd: fd, events: Int16(POLLIN) | (w ? Int16(POLLOUT) : 0), revents: 0)) }
            _ = poll(&fds, nfds_t(fds.count), 100)
            if fds[0].revents != 0 { waker.drain() }
            if fds[1].revents != 0 { acceptAll() }
            for (i, id) in ids.enumerated() where fds[i + 2].revents != 0 { service(id, buffer: buffer) }
            expire(now: monotonicNanos())
        }
    }

    private func acceptAll() {
        while true {
            let accepted: (FileDescriptor, SocketAddress)?
            do { accepted = try listener.accept() } catch {
                // Out of descriptors (EMFILE…): the connection stays queued; back off instead of spinning.
                usleep(10_000)
                return
            }
            guard let (sock, remote) = accepted else { return }
            guard let me = advertiser.value else { sock.close(); continue }
            let hello = ControlFrame.hello(peer: me.myPeerID).encoded()
            state.withLock { s in
                s.nextID += 1
                s.pending[s.nextID] = Pending(socket: sock, remote: remote, deadline: monotonicNanos() + 10_000_000_000, outbound: hello)
            }
        }
    }

    private func service(_ id: Int, buffer: UnsafeMutableRawBufferPointer) {
        guard var p = state.withLock({ $0.pending[id] }) else { return }
        if !p.outbound.isEmpty {
            let n = p.outbound.withUnsafeBytes { Glibc.send(p.socket.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n > 0 { p.outbound.removeFirst(n) }
        }
        var closed = false
        var garbage = false
        while !p.delivered {
            let n = recv(p.socket.fd, buffer.baseAddress, buffer.count, 0)
            if n == 0 { closed = true; break }
            if n < 0 {
                if errno == EINTR { continue }
                if errno != EAGAIN && errno != EWOULDBLOCK { closed = true }
                break
            }
            p.assembler.append(UnsafeRawBufferPointer(rebasing: buffer[..<n]))
            while p.invite == nil, let r = p.assembler.next() {
                switch r {
                case .success(.hello(let peer)) where p.peer == nil: p.peer = peer
                case .success(.invite(let body)) where p.peer != nil: p.invite = body
                default: garbage = true
                }
                if garbage { break }
            }
            if garbage { break }
            if p.invite != nil { break }
        }
        if garbage || (closed && !p.delivered) {
            state.withLock { _ = $0.pending.removeValue(forKey: id) }
            p.socket.close()
            return
        }
        if let peer = p.peer, let invite = p.invite, !p.delivered, let me = advertiser.value {
            p.delivered = true
            var wait = UInt64(invite.timeoutMillis) * 1_000_000
            if wait == 0 { wait = 30_000_000_000 }
            let deadline = monotonicNanos() + min(wait, maxWait)
            let inv = ReceivedInvitation(socket: p.socket, remoteAddress: p.remote, peer: peer, body: invite,
                                         pendingBytes: p.assembler.pendingBytes, listenerPort: port)
            state.withLock { $0.pending[id] = Pending(socket: p.socket, remote: p.remote, assembler: p.assembler, peer: peer,
                                                      invite: invite, delivered: true, deadline: deadline, outbound: p.outbound) }
            let answered = Atomic<Bool>(false)
            let reply: @Sendable (Bool, Session?) -> Void = { [weak self] ok, session in
                guard answered.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged,
                      let self else { return }
                self.state.withLock { $0.replies.append((id, ok && session != nil ? .accept(session!) : .decline)) }
                self.waker.wake()
            }
            me.deliver(inv, reply: reply)
            return
        }
        state.withLock { if $0.pending[id] != nil { $0.pending[id] = p } }
    }

    private func carryOut(_ id: Int, _ reply: Reply) {
        guard let p = state.withLock({ $0.pending.removeValue(forKey: id) }), let peer = p.peer, let invite = p.invite else { return }
        switch reply {
        case .decline:
            decline(p, .declined)
        case .accept(let session):
            if !p.outbound.isEmpty {
                _ = p.outbound.withUnsafeBytes { Glibc.send(p.socket.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            }
            session.core.adopt(ReceivedInvitation(socket: p.socket, remoteAddress: p.remote, peer: peer, body: invite,
                                                  pendingBytes: p.assembler.pendingBytes, listenerPort: port))
        }
    }

    private func decline(_ p: Pending, _ reason: DeclineReason) {
        var bytes = p.outbound
        if p.invite != nil { bytes += ControlFrame.decline(reason, reason.description).encoded() }
        _ = bytes.withUnsafeBytes { Glibc.send(p.socket.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        shutdown(p.socket.fd, Int32(SHUT_RDWR))
        p.socket.close()
    }

    private func expire(now: Nanos) {
        let expired = state.withLock { s -> [Pending] in
            let ids = s.pending.filter { $0.value.deadline <= now }.map(\.key)
            return ids.compactMap { s.pending.removeValue(forKey: $0) }
        }
        for p in expired {
            if p.invite != nil { decline(p, .timedOut) } else { p.socket.close() }
        }
    }
}
