import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// One TCP connection's socket and its outbound queue. Reads happen only on the session's I/O thread; writes
/// from any thread under `out`'s lock.
final class LinkIO: Sendable {
    let id: LinkID
    let socket: FileDescriptor
    /// The TCP port we reached (inviter) or were reached on (invitee).
    let remoteAddress: SocketAddress?
    /// Whether we opened this connection (and so learn last that it is connected).
    let isInviter: Bool

    struct Outbound {
        var bytes: [UInt8] = []
        var sent = 0
        var connected: Bool
        var closed = false
        var error: String?
    }

    let out: Mutex<Outbound>
    /// Reassembles frames; only the I/O thread touches it.
    let assembler: Mutex<FrameAssembler>

    init(id: LinkID, socket: FileDescriptor, remoteAddress: SocketAddress?, connected: Bool, pending: [UInt8] = []) {
        self.id = id
        self.socket = socket
        self.remoteAddress = remoteAddress
        isInviter = !connected
        out = Mutex(Outbound(connected: connected))
        var a = FrameAssembler()
        pending.withUnsafeBytes { a.append($0) }
        assembler = Mutex(a)
    }

    /// Queues `frame` and writes as much as the socket takes now.
    func enqueue(_ frame: ControlFrame) { enqueue(bytes: frame.encoded()) }

    func enqueue(bytes: [UInt8]) {
        out.withLock { o in
            guard !o.closed else { return }
            o.bytes.append(contentsOf: bytes)
            if o.connected { flushLocked(&o) }
        }
    }

    /// Writes queued bytes; returns false when the socket failed.
    @discardableResult
    func flush() -> Bool { out.withLock { flushLocked(&$0); return $0.error == nil } }

    var wantsWrite: Bool { out.withLock { !$0.connected || $0.sent < $0.bytes.count } }

    private func flushLocked(_ o: inout Outbound) {
        while o.sent < o.bytes.count, !o.closed {
            let n = o.bytes.withUnsafeBytes { raw in
                Glibc.send(socket.fd, raw.baseAddress! + o.sent, raw.count - o.sent, Int32(MSG_NOSIGNAL))
            }
            if n > 0 { o.sent += n; continue }
            if n < 0, errno == EINTR { continue }
            if n < 0, errno == EAGAIN || errno == EWOULDBLOCK { break }
            o.error = Sys.errorText(errno)
            break
        }
        if o.sent == o.bytes.count { o.bytes.removeAll(keepingCapacity: true); o.sent = 0 }
        else if o.sent > 65_536 { o.bytes.removeFirst(o.sent); o.sent = 0 }
    }

    /// Flushes what it can, then closes the socket. I/O thread only.
    func close() {
        out.withLock { o in
            flushLocked(&o)
            o.closed = true
        }
        shutdown(socket.fd, Int32(SHUT_RDWR))
        socket.close()
    }
}

/// Where a connected peer's datagrams go and come from.
struct Route: Sendable {
    var link: LinkID
    var peer: PeerID
    /// Where we send. Starts at the peer's TCP address and announced port; latches onto the source of the
    /// peer's authenticated datagrams (so NATs and relays such as the impairment proxy work).
    var remote: SocketAddress
    /// The token the peer wants on datagrams it receives.
    var remoteToken: UInt64
    /// The next sequence number we send.
    var nextSequence: UInt64 = 1
    var replay = ReplayWindow()
    var smoothedRTT: UInt64?
    /// When the last datagram that counted as proof of life arrived.
    var lastHeard: UInt64 = 0
    /// Whether `remote` follows the source of the peer's datagrams. Only the invitee latches: the inviter keeps
    /// sending where it connected (through a NAT or relay), and the invitee answers wherever that arrives from.
    /// If both latched, early datagrams sent straight to an announced port could pull both off a relay.
    var latches: Bool
}

/// The session's mutable state, under one lock.
struct SessionShared: Sendable {
    var machine: SessionStateMachine
    var links: [LinkID: LinkIO] = [:]
    /// Routes by the token we chose for the link (what arrives on datagrams).
    var routes: [UInt64: Route] = [:]
    var tokenByPeer: [PeerID: UInt64] = [:]
    var localTokens: [LinkID: UInt64] = [:]
    var nextLink: LinkID = 1
    var events: [SessionCore.Event] = []
    var closing: [LinkIO] = []
    var stats = SessionStatistics()
    var failureDetail: [LinkID: String] = [:]
    var shutDown = false
    /// Bumped whenever `links` changes, so the I/O thread knows to re-read it.
    var generation = 0
}

/// The driver of a `Session`: owns the sockets and the I/O thread, feeds the `SessionStateMachine` and performs
/// its actions. State is decided under one lock; delegate calls, socket writes and closes happen after it.
final class SessionCore: Sendable {
    enum Event: Sendable {
        case state(PeerID, SessionState)
        case data(PeerID, [UInt8])
        case failed(PeerID?, DeclineReason, String)
    }

    let peer: PeerID
    let udp: FileDescriptor
    let udpPort: UInt16
    let waker: Waker
    let shared: Mutex<SessionShared>
    let delegate = Mutex(WeakDelegate(nil))
    let owner = Mutex(WeakSession(nil))
    let heartbeat: Nanos
    private let started = Atomic<Bool>(false)
    /// Set (under the lock) whenever events are queued, so the datagram path checks for them without locking.
    private let eventsPending = Atomic<Bool>(false)
    /// `pthread_self()` of the I/O thread, so a shutdown from a delegate callback does not wait on itself.
    private let ioThread = Atomic<UInt>(0)
    private let stopped = Atomic<Bool>(false)
    private let done = DispatchSemaphore(value: 0)

    init(peer: PeerID, configuration c: Session.Configuration) throws(PeerMeshError) {
        self.peer = peer
        let timeout = UInt64(c.peerTimeout.components.seconds) * 1_000_000_000 + UInt64(c.peerTimeout.components.attoseconds / 1_000_000_000)
        var beat = timeout / 4
        if let h = c.heartbeatInterval {
            beat = UInt64(h.components.seconds) * 1_000_000_000 + UInt64(h.components.attoseconds / 1_000_000_000)
            guard beat > 0, beat < timeout else { throw .invalidParameter("heartbeatInterval must be positive and below peerTimeout") }
        }
        heartbeat = beat
        udp = try FileDescriptor.udpSocket(host: c.bindHost, port: c.udpPort)
        udpPort = try udp.localAddress().port
        waker = try Waker()
        let machine = SessionStateMachine(configuration: .init(localPeer: peer, maximumPeers: c.maximumPeers,
                                                               peerTimeout: timeout, heartbeatInterval: beat))
        shared = Mutex(SessionShared(machine: machine))
    }


    func start() {
        let t = Thread { [self] in run() }
        t.name = "peermesh.session"
        t.qualityOfService = .userInteractive
        started.store(true, ordering: .releasing)
        t.start()
    }

    func shutdown() {
        let actions = shared.withLock { s -> [SessionStateMachine.Action] in
            guard !s.shutDown else { return [] }
            s.shutDown = true
            return s.machine.disconnect()
        }
        perform(actions)
        stopped.store(true, ordering: .releasing)
        waker.wake()
        if started.load(ordering: .acquiring), ioThread.load(ordering: .acquiring) != UInt(pthread_self()) { done.wait() }
    }

    // MARK: Commands from the app

    func invite(expected: PeerID?, endpoint: PeerEndpoint, context: Data?, timeout: Duration) throws(PeerMeshError) {
        let ctx = Array(context ?? Data())
        guard ctx.count <= ControlFrame.maximumContext else {
            throw .invalidParameter("invitation context is \(ctx.count) bytes; at most \(ControlFrame.maximumContext)")
        }
        var t = timeout
        if t <= .zero { t = .seconds(30) }
        let nanos = UInt64(t.components.seconds) * 1_000_000_000 + UInt64(t.components.attoseconds / 1_000_000_000)
        let addr = try SocketAddress(host: endpoint.host, port: endpoint.port)
        let sock = try FileDescriptor.tcpConnect(to: addr)
        let token = UInt64.random(in: 1...UInt64.max)
        let actions = try shared.withLock { (s) throws(PeerMeshError) -> [SessionStateMachine.Action] in
            guard !s.shutDown else { throw .sessionClosed }
            let id = s.nextLink
            s.nextLink += 1
            s.links[id] = LinkIO(id: id, socket: sock, remoteAddress: addr, connected: false)
            s.generation += 1
            s.localTokens[id] = token
            return s.machine.inviteStarted(link: id, expected: expected, context: ctx, timeout: nanos,
                                           localUDPPort: udpPort, localToken: token, now: monotonicNanos())
        }
        perform(actions)
        waker.wake()
    }

    /// Takes over a connection whose invitation the app accepted into this session.
    func adopt(_ inv: ReceivedInvitation) {
        let token = UInt64.random(in: 1...UInt64.max)
        let acceptPort: UInt16 = udpPort == inv.listenerPort ? 0 : udpPort
        let actions = shared.withLock { s -> [SessionStateMachine.Action] in
            guard !s.shutDown else { return [] }
            let id = s.nextLink
            s.nextLink += 1
            s.links[id] = LinkIO(id: id, socket: inv.socket, remoteAddress: inv.remoteAddress, connected: true, pending: inv.pendingBytes)
            s.generation += 1
            s.localTokens[id] = token
            return s.machine.invitationAccepted(link: id, from: inv.peer, remoteUDPPort: inv.body.udpPort,
                                                remoteToken: inv.body.token, acceptUDPPort: acceptPort,
                                                localToken: token, now: monotonicNanos())
        }
        if actions.isEmpty {
            ReceivedInvitation.decline(inv, .unavailable)
            return
        }
        perform(actions)
        waker.wake()
    }

    func disconnect() {
        let actions = shared.withLock { $0.machine.disconnect() }
        perform(actions)
        waker.wake()
    }

    func sendReliable(_ bytes: [UInt8], to peers: [PeerID]) throws(PeerMeshError) {
        let targets = try shared.withLock { (s) throws(PeerMeshError) -> [LinkIO] in
            try peers.map { (p) throws(PeerMeshError) -> LinkIO in
                guard let l = s.machine.primaryLink(for: p), let io = s.links[l] else {
                    throw .notConnected("send: peer \(p) is not connected; nothing was sent")
                }
                return io
            }
        }
        let frame = ControlFrame.data(bytes).encoded()
        for io in targets { io.enqueue(bytes: frame) }
        if targets.contains(where: { $0.wantsWrite }) { waker.wake() }
    }

    func sendDatagram(_ payload: UnsafeRawBufferPointer, to peers: [PeerID]) throws(PeerMeshError) {
        // Decide under the lock (who, where, which sequence numbers); send after it. No heap allocation: the
        // decisions live in stack space sized for this call.
        try withUnsafeTemporaryAllocation(of: (SocketAddress, DatagramHeader).self, capacity: peers.count) { (batch) throws(PeerMeshError) in
            try shared.withLock { (s) throws(PeerMeshError) in
                for p in peers where s.tokenByPeer[p] == nil {
                    throw .notConnected("send: peer \(p) is not connected; nothing was sent")
                }
                for (n, p) in peers.enumerated() {
                    let i = s.routes.index(forKey: s.tokenByPeer[p]!)!
                    let seq = s.routes.values[i].nextSequence
                    s.routes.values[i].nextSequence = seq + 1
                    (batch.baseAddress! + n).initialize(to: (s.routes.values[i].remote,
                                                             DatagramHeader(kind: .data, token: s.routes.values[i].remoteToken, sequence: seq)))
                }
                s.stats.datagramsSent += UInt64(peers.count)
            }
            withUnsafeTemporaryAllocation(byteCount: DatagramHeader.size + payload.count, alignment: 8) { buf in
                UnsafeMutableRawBufferPointer(rebasing: buf[DatagramHeader.size...]).copyMemory(from: payload)
                for n in 0..<peers.count {
                    let (addr, header) = batch[n]
                    header.write(to: buf)
                    addr.withSockaddr { sa, len in _ = sendto(udp.fd, buf.baseAddress, buf.count, Int32(MSG_NOSIGNAL), sa, len) }
                }
            }
            batch.baseAddress!.deinitialize(count: peers.count)
        }
    }

    // MARK: Performing actions

    private func perform(_ actions: [SessionStateMachine.Action]) {
        guard !actions.isEmpty else { return }
        var pings: [(SocketAddress, DatagramHeader)] = []
        shared.withLock { s in
            for a in actions {
                switch a {
                case .report(let p, let st):
                    s.events.append(.state(p, st))
                    eventsPending.store(true, ordering: .releasing)
                case .deliver(let p, let d):
                    s.events.append(.data(p, d))
                    eventsPending.store(true, ordering: .releasing)
                case .invitationFailed(let l, let p, let r):
                    s.events.append(.failed(p, r, s.failureDetail.removeValue(forKey: l) ?? r.description))
                    eventsPending.store(true, ordering: .releasing)
                case .linkUp(let l, let p, let port, let token):
                    guard let io = s.links[l], var remote = io.socket.peerAddress() ?? io.remoteAddress,
                          let local = s.localTokens[l] else { continue }
                    // Port 0 means "the port you reached me on".
                    remote.raw.sin_port = (port == 0 ? (io.remoteAddress?.port ?? remote.port) : port).bigEndian
                    s.routes[local] = Route(link: l, peer: p, remote: remote, remoteToken: token, latches: !io.isInviter)
                    s.tokenByPeer[p] = local
                    // The inviter learns last that the link is up: it pings at once, so the far side latches its
                    // address and both measure the RTT early. (An invitee's ping could outrun its ACCEPT.)
                    if io.isInviter {
                        pings.append((remote, DatagramHeader(kind: .ping, token: token, sequence: s.routes[local]!.nextSequence)))
                        s.routes[local]!.nextSequence += 1
                    }
                case .linkDown(let l):
                    if let local = s.localTokens[l], let r = s.routes.removeValue(forKey: local) {
                        if s.tokenByPeer[r.peer] == local {
                            s.tokenByPeer[r.peer] = nil
                            // Another connected link to the same peer takes over.
                            if let other = s.routes.first(where: { $0.value.peer == r.peer }) { s.tokenByPeer[r.peer] = other.key }
                        }
                    }
                case .send, .close: break
                }
            }
        }
        for a in actions {
            switch a {
            case .send(let l, let f): shared.withLock { $0.links[l] }?.enqueue(f)
            case .close(let l):
                shared.withLock { s in
                    if let io = s.links.removeValue(forKey: l) {
                        s.closing.append(io)
                        s.generation += 1
                    }
                    s.localTokens[l] = nil
                }
            default: break
            }
        }
        for (addr, h) in pings { sendControlDatagram(h, payload: monotonicNanos(), to: addr) }
        waker.wake()
    }

    private func sendControlDatagram(_ h: DatagramHeader, payload: UInt64, to addr: SocketAddress) {
        withUnsafeTemporaryAllocation(byteCount: DatagramHeader.size + 8, alignment: 8) { buf in
            h.write(to: buf)
            for i in 0..<8 { buf[DatagramHeader.size + i] = UInt8((payload >> UInt64(56 - 8 * i)) & 0xff) }
            addr.withSockaddr { sa, len in _ = sendto(udp.fd, buf.baseAddress, buf.count, Int32(MSG_NOSIGNAL), sa, len) }
        }
    }

    // MARK: The I/O thread

    private func run() {
        ioThread.store(UInt(pthread_self()), ordering: .releasing)
        defer { done.signal() }
        var pollfds: [pollfd] = []
        let datagram = UnsafeMutableRawBufferPointer.allocate(byteCount: 65_536, alignment: 8)
        defer { datagram.deallocate() }
        let readBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 65_536, alignment: 8)
        defer { readBuffer.deallocate() }
        var nextPing: Nanos = 0
        var links: [LinkIO] = []
        var generation = -1
        var deadline: Nanos?
        var lastTick: Nanos = 0

        while true {
            deliverEvents()
            // Re-read the link set only when it changed: the datagram hot path should not allocate per wake-up.
            let changed = shared.withLock { s -> (closing: [LinkIO], links: [LinkIO], generation: Int, deadline: Nanos?)? in
                guard s.generation != generation || !s.closing.isEmpty else { return nil }
                let c = s.closing
                s.closing.removeAll()
                return (c, Array(s.links.values), s.generation, s.machine.nextDeadline())
            }
            if let changed {
                for io in changed.closing { io.close() }
                links = changed.links
                generation = changed.generation
                deadline = changed.deadline
            }
            if stopped.load(ordering: .acquiring) {
                for io in links { io.close() }
                deliverEvents()
                return
            }

            pollfds.removeAll(keepingCapacity: true)
            pollfds.append(pollfd(fd: waker.fd, events: Int16(POLLIN), revents: 0))
            pollfds.append(pollfd(fd: udp.fd, events: Int16(POLLIN), revents: 0))
            for io in links {
                var ev = Int16(POLLIN)
                if io.wantsWrite { ev |= Int16(POLLOUT) }
                pollfds.append(pollfd(fd: io.socket.fd, events: ev, revents: 0))
            }
            let now = monotonicNanos()
            var wait: Nanos = 50_000_000
            if let d = deadline { wait = min(wait, d > now ? d - now : 0) }
            _ = poll(&pollfds, nfds_t(pollfds.count), Int32((wait + 999_999) / 1_000_000))

            if pollfds[0].revents != 0 { waker.drain() }
            if pollfds[1].revents & Int16(POLLIN) != 0 { readDatagrams(datagram) }
            for (i, io) in links.enumerated() {
                let rev = pollfds[i + 2].revents
                guard rev != 0 else { continue }
                service(io, revents: rev, buffer: readBuffer)
            }

            // Timers: when one is due, or every 20 ms — not on every datagram.
            let t = monotonicNanos()
            if t >= (deadline ?? .max) || t &- lastTick >= 20_000_000 {
                lastTick = t
                let (actions, next) = shared.withLock { s in (s.machine.tick(now: t), s.machine.nextDeadline()) }
                deadline = next
                perform(actions)
            }
            if t >= nextPing {
                nextPing = t + heartbeat
                pingRoutes(now: t)
            }
        }
    }

    private func deliverEvents() {
        guard eventsPending.exchange(false, ordering: .acquiringAndReleasing) else { return }
        let events = shared.withLock { s -> [Event] in
            let e = s.events
            s.events.removeAll()
            return e
        }
        guard !events.isEmpty else { return }
        guard let session = owner.withLock({ $0.value }), let d = delegate.withLock({ $0.value }) else { return }
        for e in events {
            switch e {
            case .state(let p, let st): d.session(session, peer: p, didChange: st)
            case .data(let p, let bytes): d.session(session, didReceive: Data(bytes), fromPeer: p)
            case .failed(let p, let r, let detail): d.session(session, invitationTo: p, failedWith: r, detail: detail)
            }
        }
    }

    private func service(_ io: LinkIO, revents: Int16, buffer: UnsafeMutableRawBufferPointer) {
        let connectedBefore = io.out.withLock { $0.connected }
        if !connectedBefore {
            let err = io.socket.pendingError()
            if err != 0 || revents & Int16(POLLERR | POLLHUP) != 0 {
                let text = err != 0 ? Sys.errorText(err) : "connection failed"
                let where_ = io.remoteAddress.map { "\($0.host):\($0.port)" } ?? "peer"
                failLink(io, detail: "cannot connect to \(where_): \(text)")
                return
            }
            if revents & Int16(POLLOUT) != 0 {
                io.out.withLock { $0.connected = true }
            }
        }
        if revents & Int16(POLLOUT) != 0 || io.wantsWrite {
            if !io.flush() { failLink(io, detail: "write failed"); return }
        }
        guard revents & Int16(POLLIN | POLLHUP | POLLERR) != 0 else { return }
        var frames: [ControlFrame] = []
        var eof = false
        var garbage = false
        while true {
            let n = recv(io.socket.fd, buffer.baseAddress, buffer.count, 0)
            if n > 0 {
                io.assembler.withLock { a in
                    a.append(UnsafeRawBufferPointer(rebasing: buffer[..<n]))
                    while let r = a.next() {
                        switch r {
                        case .success(let f): frames.append(f)
                        case .failure: garbage = true
                        }
                        if garbage { break }
                    }
                }
                if garbage || n < buffer.count { break }
                continue
            }
            if n == 0 { eof = true; break }
            if errno == EINTR { continue }
            if errno == EAGAIN || errno == EWOULDBLOCK { break }
            eof = true
            break
        }
        let now = monotonicNanos()
        var actions: [SessionStateMachine.Action] = []
        shared.withLock { s in
            for f in frames { actions += s.machine.received(f, on: io.id, now: now) }
            if garbage { s.stats.garbageConnections += 1 }
            if garbage || eof { actions += s.machine.linkClosed(io.id) }
        }
        perform(actions)
    }

    private func failLink(_ io: LinkIO, detail: String) {
        let actions = shared.withLock { s -> [SessionStateMachine.Action] in
            s.failureDetail[io.id] = detail
            return s.machine.linkClosed(io.id)
        }
        perform(actions)
    }

    private func readDatagrams(_ buf: UnsafeMutableRawBufferPointer) {
        // One load of the (weak) session and delegate for the whole batch.
        let receiver = (owner.withLock { $0.value }, delegate.withLock { $0.value })
        var from = sockaddr_in()
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        // Bounded so a flood cannot starve TCP and timers.
        for _ in 0..<256 {
            len = socklen_t(MemoryLayout<sockaddr_in>.size)
            let n = withUnsafeMutablePointer(to: &from) { p in
                p.withMemoryRebound(to: sockaddr.self, capacity: 1) { recvfrom(udp.fd, buf.baseAddress, buf.count, Int32(MSG_DONTWAIT), $0, &len) }
            }
            if n < 0 {
                if errno == EINTR { continue }
                return
            }
            handleDatagram(UnsafeRawBufferPointer(rebasing: buf[..<n]), from: SocketAddress(from), receiver: receiver)
        }
    }

    private func handleDatagram(_ d: UnsafeRawBufferPointer, from: SocketAddress,
                                receiver: (Session?, (any SessionDelegate)?)) {
        guard case .success(let h) = DatagramHeader.decode(d) else {
            shared.withLock { $0.stats.malformedDatagrams += 1 }
            return
        }
        let now = monotonicNanos()
        enum Verdict { case drop, deliver(PeerID), pong(SocketAddress, DatagramHeader), pinged }
        let verdict: Verdict = shared.withLock { s in
            // Mutate the route in place: a copy would copy its replay window on every datagram.
            guard let i = s.routes.index(forKey: h.token), s.routes.values[i].remote.ip == from.ip else {
                s.stats.strangerDatagrams += 1
                return .drop
            }
            guard s.routes.values[i].replay.accept(h.sequence) else {
                s.stats.duplicateDatagrams += 1
                return .drop
            }
            // Latch: answer where the peer really is.
            if s.routes.values[i].latches, s.routes.values[i].remote.port != from.port { s.routes.values[i].remote = from }
            // Proof of life, at most every millisecond per route (the timeout is in seconds).
            if now &- s.routes.values[i].lastHeard > 1_000_000 {
                s.routes.values[i].lastHeard = now
                s.machine.heardDatagram(on: s.routes.values[i].link, now: now)
            }
            switch h.kind {
            case .data:
                guard d.count > DatagramHeader.size else {
                    s.stats.malformedDatagrams += 1
                    return .drop
                }
                s.stats.datagramsReceived += 1
                return .deliver(s.routes.values[i].peer)
            case .ping:
                let seq = s.routes.values[i].nextSequence
                s.routes.values[i].nextSequence = seq + 1
                return .pong(s.routes.values[i].remote, DatagramHeader(kind: .pong, token: s.routes.values[i].remoteToken, sequence: seq))
            case .pong:
                var reader = ByteReader(UnsafeRawBufferPointer(rebasing: d[DatagramHeader.size...]))
                if let sent = reader.u64(), sent <= now {
                    let sample = now - sent
                    s.routes.values[i].smoothedRTT = s.routes.values[i].smoothedRTT.map { ($0 * 7 + sample) / 8 } ?? sample
                }
                return .pinged
            }
        }
        switch verdict {
        case .drop, .pinged: break
        case .pong(let addr, let header):
            var reader = ByteReader(UnsafeRawBufferPointer(rebasing: d[DatagramHeader.size...]))
            sendControlDatagram(header, payload: reader.u64() ?? 0, to: addr)
        case .deliver(let peer):
            deliverEvents() // state changes first, in order
            if let session = receiver.0, let del = receiver.1 {
                del.session(session, didReceiveDatagramBytes: UnsafeRawBufferPointer(rebasing: d[DatagramHeader.size...]), fromPeer: peer)
            }
        }
    }

    private func pingRoutes(now: Nanos) {
        let pings = shared.withLock { s -> [(SocketAddress, DatagramHeader)] in
            var out: [(SocketAddress, DatagramHeader)] = []
            for k in s.routes.keys {
                out.append((s.routes[k]!.remote, DatagramHeader(kind: .ping, token: s.routes[k]!.remoteToken, sequence: s.routes[k]!.nextSequence)))
                s.routes[k]!.nextSequence += 1
            }
            return out
        }
        for (a, h) in pings { sendControlDatagram(h, payload: now, to: a) }
    }
}
