import FoundationEssentials
import MeshPOSIX
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Where a scheduled datagram goes: a connected upstream socket (`destination == nil`), or the listening socket
/// with the client's address.
struct ImpairmentOutlet: Sendable {
    let socket: FileDescriptor
    let destination: SocketAddress?
}

/// The running proxy: two threads (I/O and scheduler) around one `Mutex`-guarded state. Decisions happen under
/// the lock; sends, receives and closes after it.
final class ImpairmentEngine: Sendable {
    struct Sockets: Sendable {
        var udp: FileDescriptor
        var tcp: FileDescriptor
    }

    struct State: Sendable {
        var schedule: ImpairmentSchedule<ImpairmentOutlet>
        var stopping = false
        /// Handed to the I/O thread when it starts; released when it ends.
        var sockets: Sockets?
        var tcpAccepted: UInt64 = 0
        var tcpOpen = 0
        var tcpBytesToTarget: UInt64 = 0
        var tcpBytesFromTarget: UInt64 = 0
        var udpSessions = 0
    }

    static let maximumSessions = 4096

    let configuration: ImpairmentProxy.Configuration
    let listenAddress: ImpairmentProxy.Endpoint
    private let target: SocketAddress
    private let ioWaker: Waker
    private let schedulerWaker: Waker
    private let state: Mutex<State>
    /// The I/O and scheduler threads, joined by `stop`.
    private let threads = Mutex<[OSThread]>([])

    /// Binds the UDP and TCP listeners (same port number) and starts the threads.
    init(configuration c: ImpairmentProxy.Configuration) throws(ImpairmentError) {
        configuration = c
        target = try c.target.socketAddress()
        var sockets: Sockets?
        var lastError = ImpairmentError.system("bind: no attempt")
        for _ in 0..<(c.listen.port == 0 ? 32 : 1) {
            do throws(ImpairmentError) {
                let listen = try c.listen.socketAddress()
                do throws(SyscallError) {
                    let udp = try FileDescriptor.udpSocket(listen, buffer: 4 << 20)
                    let port = try udp.localAddress().port
                    let tcp = try FileDescriptor.tcpListener(listen.with(port: port), backlog: 64)
                    sockets = Sockets(udp: udp, tcp: tcp)
                    break
                } catch {
                    throw ImpairmentError(error)
                }
            } catch {
                lastError = error
            }
        }
        guard let sockets else {
            if case .system(let text) = lastError, text.contains("Cannot assign") {
                throw .system("\(text): \(c.listen.host) is not an address of a local interface")
            }
            throw lastError
        }
        do {
            listenAddress = ImpairmentProxy.Endpoint(host: c.listen.host, port: try sockets.udp.localAddress().port)
            ioWaker = try Waker()
            schedulerWaker = try Waker()
        } catch {
            throw ImpairmentError(error)
        }
        state = Mutex(State(schedule: ImpairmentSchedule(configuration: c), sockets: sockets))

        do {
            let io = try OSThread(name: "mesh-impair-io", scheduling: .normal) { [self] in runIO() }
            threads.withLock { $0.append(io) }
            let scheduler = try OSThread(name: "mesh-impair-sch", scheduling: .normal) { [self] in runScheduler() }
            threads.withLock { $0.append(scheduler) }
        } catch {
            stop()
            throw .system("\(error)")
        }
    }

    var statistics: ImpairmentProxy.Statistics {
        state.withLock { s in
            var st = s.schedule.stats
            st.udpSessions = s.udpSessions
            st.tcpConnectionsAccepted = s.tcpAccepted
            st.tcpConnectionsOpen = s.tcpOpen
            st.tcpBytesToTarget = s.tcpBytesToTarget
            st.tcpBytesFromTarget = s.tcpBytesFromTarget
            return st
        }
    }

    /// Stops both threads, waits for them, and discards what was still queued (counted as failed). Idempotent.
    func stop() {
        let first = state.withLock { s in
            defer { s.stopping = true }
            return !s.stopping
        }
        if first {
            ioWaker.wake()
            schedulerWaker.wake()
        }
        for thread in threads.withLock({ $0 }) { thread.join() }
        let leftovers = state.withLock { s in
            s.sockets = nil
            return s.schedule.discardAll()
        }
        _ = leftovers // released here, outside the lock: their sockets close now
    }

    // MARK: Sending (both threads)

    private func sendOnce(_ e: ImpairmentSchedule<ImpairmentOutlet>.Entry) -> Bool {
        var attempts = 0
        while attempts < 4 {
            attempts += 1
            let r = e.bytes.withUnsafeBytes { raw -> Int in
                if let d = e.outlet.destination { return e.outlet.socket.send(raw, to: d) }
                return send(e.outlet.socket.fd, raw.baseAddress, raw.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT))
            }
            if r >= 0 { return true }
            let err = errno
            if err == EINTR { attempts -= 1; continue }
            // A connected UDP socket reports an earlier ICMP "port unreachable" on the next send: try again.
            if err == ECONNREFUSED { continue }
            if err == EAGAIN || err == EWOULDBLOCK || err == ENOBUFS {
                var p = pollfd(fd: e.outlet.socket.fd, events: Int16(POLLOUT), revents: 0)
                _ = poll(&p, 1, 10)
                continue
            }
            return false
        }
        return false
    }

    private func transmit(_ entries: [ImpairmentSchedule<ImpairmentOutlet>.Entry]) -> [ImpairmentSchedule<ImpairmentOutlet>.Outcome] {
        entries.map { e in
            let delivered = sendOnce(e)
            var extra = 0
            for _ in 1..<max(e.copies, 1) where sendOnce(e) { extra += 1 }
            return .init(way: e.way, delivered: delivered, extraCopiesDelivered: extra)
        }
    }

    private func admit(_ batch: [ImpairmentSchedule<ImpairmentOutlet>.Incoming], now: UInt64) {
        guard !batch.isEmpty else { return }
        let adm = state.withLock { $0.schedule.admit(batch, now: now) }
        if adm.wakeScheduler { schedulerWaker.wake() }
        guard !adm.immediate.isEmpty else { return }
        let outcomes = transmit(adm.immediate)
        state.withLock { $0.schedule.finish(outcomes) }
    }

    // MARK: Scheduler thread

    private func runScheduler() {
        var pfd = pollfd(fd: schedulerWaker.fd, events: Int16(POLLIN), revents: 0)
        while true {
            let (entries, next, stopping) = state.withLock { s -> ([ImpairmentSchedule<ImpairmentOutlet>.Entry], UInt64?, Bool) in
                if s.stopping { return ([], nil, true) }
                let r = s.schedule.takeDue(now: MonotonicClock.nowNanos())
                return (r.entries, r.next, false)
            }
            if stopping { return }
            if !entries.isEmpty {
                let outcomes = transmit(entries)
                state.withLock { $0.schedule.finish(outcomes) }
                continue
            }
            pfd.revents = 0
            if let next {
                let now = MonotonicClock.nowNanos()
                let wait = next > now ? next - now : 0
                if wait >= 1_000_000 {
                    // Whole milliseconds in poll (wakeable); the sub-millisecond rest in a precise sleep next round.
                    _ = poll(&pfd, 1, Int32(min(wait / 1_000_000, 1_000)))
                } else if wait > 0 {
                    var ts = timespec(tv_sec: 0, tv_nsec: Int(wait))
                    _ = clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, nil)
                }
            } else {
                _ = poll(&pfd, 1, -1)
            }
            if pfd.revents != 0 { schedulerWaker.drain() }
        }
    }

    // MARK: I/O thread

    private final class UDPSession {
        let id: Int
        let client: SocketAddress
        let upstream: FileDescriptor
        var lastHeard: UInt64

        init(id: Int, client: SocketAddress, upstream: FileDescriptor, now: UInt64) {
            self.id = id; self.client = client; self.upstream = upstream; lastHeard = now
        }
    }

    private func runIO() {
        guard let sockets = state.withLock({ $0.sockets.take() }) else { return }
        let listenOutlet = sockets.udp
        var sessions: [SocketAddress: UDPSession] = [:]
        var polled: [UDPSession] = []
        var pipes: [TCPPipe] = []
        var buffer = [UInt8](repeating: 0, count: 65_536)
        var fds: [pollfd] = []
        var nextSession = 0
        var lastSweep = MonotonicClock.nowNanos()
        let idleNanos = UInt64(configuration.udpSessionIdleSeconds * 1e9)
        let readable = Int16(POLLIN | POLLERR)

        while !state.withLock({ $0.stopping }) {
            fds.removeAll(keepingCapacity: true)
            fds.append(pollfd(fd: ioWaker.fd, events: Int16(POLLIN), revents: 0))
            fds.append(pollfd(fd: sockets.udp.fd, events: Int16(POLLIN), revents: 0))
            fds.append(pollfd(fd: sockets.tcp.fd, events: Int16(POLLIN), revents: 0))
            polled = Array(sessions.values)
            for s in polled { fds.append(pollfd(fd: s.upstream.fd, events: Int16(POLLIN), revents: 0)) }
            let pipeBase = fds.count
            let pipeCount = pipes.count
            for p in pipes {
                fds.append(pollfd(fd: p.client.fd, events: p.clientEvents, revents: 0))
                fds.append(pollfd(fd: p.upstream.fd, events: p.upstreamEvents, revents: 0))
            }
            let n = poll(&fds, nfds_t(fds.count), 200)
            if n < 0, errno != EINTR { usleep(10_000) }
            let now = MonotonicClock.nowNanos()
            if fds[0].revents != 0 { ioWaker.drain() }

            // UDP, client → target.
            var batch: [ImpairmentSchedule<ImpairmentOutlet>.Incoming] = []
            var rejected = 0
            if fds[1].revents & readable != 0 {
                for _ in 0..<256 {
                    guard let (r, source) = buffer.withUnsafeMutableBytes({ sockets.udp.receive(into: $0) }) else { break }
                    guard let client = source else { continue }
                    let session: UDPSession
                    if let s = sessions[client] {
                        session = s
                    } else if sessions.count < Self.maximumSessions, let up = try? FileDescriptor.udpConnected(to: target, buffer: 4 << 20) {
                        nextSession += 1
                        session = UDPSession(id: nextSession, client: client, upstream: up, now: now)
                        sessions[client] = session
                    } else {
                        rejected += 1
                        continue
                    }
                    session.lastHeard = now
                    batch.append(.init(way: .toTarget, flow: session.id, bytes: Array(buffer[0..<r]),
                                       outlet: ImpairmentOutlet(socket: session.upstream, destination: nil)))
                }
            }
            // UDP, target → client.
            for (i, s) in polled.enumerated() where fds[3 + i].revents & readable != 0 {
                for _ in 0..<256 {
                    let r = buffer.withUnsafeMutableBytes { recv(s.upstream.fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
                    if r < 0 {
                        if errno == EINTR || errno == ECONNREFUSED { continue }
                        break
                    }
                    s.lastHeard = now
                    batch.append(.init(way: .fromTarget, flow: s.id, bytes: Array(buffer[0..<r]),
                                       outlet: ImpairmentOutlet(socket: listenOutlet, destination: s.client)))
                }
            }
            admit(batch, now: now)

            // TCP passthrough.
            var accepted: UInt64 = 0
            if fds[2].revents & Int16(POLLIN) != 0 {
                while let (c, _) = (try? sockets.tcp.accept()) ?? nil {
                    guard let up = try? FileDescriptor.tcpConnect(to: target) else { continue }
                    pipes.append(TCPPipe(client: c, upstream: up))
                    accepted += 1
                }
            }
            var toTarget: UInt64 = 0, fromTarget: UInt64 = 0
            for i in 0..<pipeCount {
                let p = pipes[i]
                let cr = fds[pipeBase + 2 * i].revents, ur = fds[pipeBase + 2 * i + 1].revents
                if cr != 0 || ur != 0 { p.service(clientRevents: cr, upstreamRevents: ur, scratch: &buffer) }
                toTarget += p.movedToTarget; fromTarget += p.movedFromTarget
                p.movedToTarget = 0; p.movedFromTarget = 0
            }
            pipes.removeAll { $0.dead }

            if now &- lastSweep > 1_000_000_000 {
                lastSweep = now
                sessions = sessions.filter { now &- $0.value.lastHeard < idleNanos }
            }
            polled.removeAll()
            let open = pipes.count, sessionCount = sessions.count
            state.withLock { s in
                s.tcpAccepted += accepted
                s.tcpOpen = open
                s.tcpBytesToTarget += toTarget
                s.tcpBytesFromTarget += fromTarget
                s.udpSessions = sessionCount
                if rejected > 0 { s.schedule.reject(way: .toTarget, count: rejected) }
            }
        }
    }
}
