import MeshPOSIX
import Synchronization

/// A link's datagram keys: ours to seal, the peer's to open.
typealias DatagramKeys = (send: SecretKey, receive: SecretKey)

/// One connected link's receive side: the pure `DatagramRouter.Route` that judges its datagrams, with the link's
/// keys and shared counters. The loop creates it when the link comes up; from then on only the thread whose turn it
/// is to read datagrams (`DatagramPath.read`) touches `route`.
final class LinkReceiver: @unchecked Sendable {  // `route` is mutated only under DatagramPath's reading turn (acquire/release)
    let counters: LinkCounters
    /// The link's keys (nil on a plaintext link).
    let keys: DatagramKeys?
    /// The link's routing state; the reading thread's alone.
    var route: DatagramRouter.Route

    init(route: DatagramRouter.Route, counters: LinkCounters, keys: DatagramKeys?) {
        self.route = route
        self.counters = counters
        self.keys = keys
    }
}

/// The routes in force, by the local token datagrams to us carry: an immutable table the loop publishes whenever a
/// link comes up or goes down (`DatagramPath.routes`).
final class RouteTable: Sendable {
    let receivers: [UInt64: LinkReceiver]
    init(_ receivers: [UInt64: LinkReceiver]) { self.receivers = receivers }
}

/// The datagram half of a session's driver: reads the session's UDP socket, judges each datagram with its link's
/// pure `DatagramRouter.Route` (token, source, AEAD, replay window, latching), answers pings and notes liveness and
/// RTT in the link's atomic counters — with no lock and no allocation, on whichever thread reads: the event loop
/// (the delegate gets the datagrams) or one app thread through a `DatagramReader`.
///
/// One thread reads at a time (`read` takes the turn; a concurrent call returns nil at once). The loop publishes the
/// route table through a `SnapshotCell`, so the reader never waits for it; a route whose address latched is reported
/// to the caller, which tells the loop (directly on the loop, through `latches` and a wake-up off it).
final class DatagramPath: Sendable {
    /// The session's UDP socket.
    let udp: FileDescriptor
    /// The routes datagrams are judged against.
    let routes = SnapshotCell<RouteTable>(RouteTable([:]))
    /// The session's counters (drops by reason, datagrams delivered).
    let counters: AtomicRecord<SessionStatistics>
    /// Addresses that authentic datagrams moved a route to, from a reader off the loop (the loop drains them).
    let latches = SPSCQueue<(LinkID, SocketAddress)>(capacity: 64)
    /// Set when a latch did not fit in `latches`: the loop must compare every route with its receiver's.
    let latchesLost = Atomic<Bool>(false)
    /// Whether a thread holds the turn to read.
    private let reading = Atomic<Bool>(false)

    init(udp: FileDescriptor, counters: AtomicRecord<SessionStatistics>) {
        self.udp = udp
        self.counters = counters
    }

    /// Reads up to `maximum` datagrams that are waiting (never blocks) into `buffer`, routes each, and hands every
    /// app datagram to `deliver` (its bytes valid only during the call). `latched` hears each route whose send address
    /// moved. Returns how many datagrams were read, or nil when another thread holds the turn.
    func read(into buffer: UnsafeMutableRawBufferPointer, maximum: Int,
              deliver: (UnsafeRawBufferPointer, PeerID) -> Void,
              latched: (LinkID, SocketAddress) -> Void) -> Int? {
        withReadingTurn {
            routes.withCurrent { table -> Int in
                guard let table else { return 0 }
                var count = 0
                while count < maximum, let (length, source) = udp.receive(into: buffer) {
                    count += 1
                    guard let source else { counters.add { $0.malformedDatagrams += 1 }; continue }
                    handle(UnsafeMutableRawBufferPointer(rebasing: buffer[..<length]), from: source, table: table,
                           deliver: deliver, latched: latched)
                }
                return count
            }
        }
    }

    /// Runs `body` holding the reading turn — no thread judges datagrams meanwhile, so the receivers' routes may be
    /// read — or returns nil at once when another thread holds it.
    func withReadingTurn<T>(_ body: () -> T) -> T? {
        guard reading.compareExchange(expected: false, desired: true, ordering: .acquiring).exchanged else { return nil }
        defer { reading.store(false, ordering: .releasing) }
        return body()
    }

    /// Routes one datagram and acts on the verdict.
    private func handle(_ d: UnsafeMutableRawBufferPointer, from source: SocketAddress, table: RouteTable,
                        deliver: (UnsafeRawBufferPointer, PeerID) -> Void, latched: (LinkID, SocketAddress) -> Void) {
        guard case .success(let header) = DatagramHeader.decode(UnsafeRawBufferPointer(d)) else {
            counters.add { $0.malformedDatagrams += 1 }
            return
        }
        guard let receiver = table.receivers[header.token] else {
            counters.count(.stranger)
            return
        }
        let now = MonotonicClock.nowNanos()
        var payload = UnsafeRawBufferPointer(rebasing: d[DatagramHeader.size...])
        let key = receiver.keys?.receive
        let (verdict, effects) = receiver.route.received(header, from: source, now: now) { _ in
            // An encrypted link's datagram is opened in place; only then is its body believed.
            if let key {
                let body = UnsafeMutableRawBufferPointer(rebasing: d[DatagramHeader.size...])
                guard let n = Sodium.open(key: key, counter: header.sequence,
                                          ad: UnsafeRawBufferPointer(rebasing: d[..<DatagramHeader.size]),
                                          ciphertext: UnsafeRawBufferPointer(body), into: body)
                else { return .failure(.unauthentic) }
                payload = UnsafeRawBufferPointer(rebasing: body[..<n])
            }
            return DatagramBody.parse(kind: header.kind, payload: payload)
        }
        if effects.proofOfLife != nil { receiver.counters.lastHeard.store(now, ordering: .relaxed) }
        if effects.latched { latched(receiver.route.link, receiver.route.remote) }
        switch verdict {
        case .drop(let why):
            counters.count(why)
        case .deliver(let peer):
            counters.add { $0.datagramsReceived += 1 }
            deliver(payload, peer)
        case .answerPing(let address, let token, _):
            let echo = UInt64(bigEndian: payload.loadUnaligned(as: UInt64.self))
            sendControl(.pong, token: token, counters: receiver.counters, key: receiver.keys?.send, timestamp: echo,
                        to: address)
        case .measured(_, _, let smoothed):
            receiver.counters.smoothedRTT.store(smoothed, ordering: .relaxed)
        case .ignoredPong:
            break
        }
    }

    /// Sends a ping or pong carrying `timestamp`, sealed under `key` on an encrypted link. Stack space only.
    func sendControl(_ kind: DatagramHeader.Kind, token: UInt64, counters lc: LinkCounters, key: SecretKey?,
                     timestamp: UInt64, to address: SocketAddress) {
        guard let sequence = lc.takeSequence() else { return }
        var stamp = timestamp.bigEndian
        withUnsafeBytes(of: &stamp) { payload in
            withUnsafeTemporaryAllocation(byteCount: DatagramHeader.size + 8 + Sodium.tagSize, alignment: 16) { buf in
                let n = SessionCore.seal(payload, kind: kind, token: token, sequence: sequence, key: key, into: buf)
                _ = udp.send(UnsafeRawBufferPointer(rebasing: buf[..<n]), to: address)
            }
        }
    }
}

/// Reads a session's datagrams on a thread of the app's own, instead of the session's I/O thread calling the
/// delegate: the way for a real-time thread to serve its network input and its device from one loop, waking once per
/// period (mesh-play's playback thread). Made by a session configured with `datagramDelivery: .reader`
/// (`Session.datagramReader`).
///
/// Wait for `descriptor` to become readable (`poll`, `POLLIN`), then call `read`: it reads what has arrived without
/// blocking, judges every datagram exactly as the session's own thread would (token, source address, authentication,
/// replay window), answers pings, notes liveness and round-trip times, counts drops in `Session.statistics`, and
/// hands each datagram from a connected peer to the closure. No lock, no allocation: real-time safe.
///
/// Datagrams from a peer reached only through a relay (`Session.isRelayed`) ride its connection and still go to the
/// delegate. One thread reads at a time; a call made while another is reading returns 0 at once.
public final class DatagramReader: @unchecked Sendable {  // `buffer` is used only by the thread holding the path's reading turn
    private let path: DatagramPath
    private let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 65_536, alignment: 16)
    /// Wakes the session's loop when a route latched (it republishes where datagrams are sent).
    private let latchWaker: Waker

    init(path: DatagramPath, latchWaker: Waker) {
        self.path = path
        self.latchWaker = latchWaker
    }

    deinit { buffer.deallocate() }

    /// The session's UDP socket: poll it for `POLLIN`. After the session shuts down it is closed (`POLLNVAL`).
    public var descriptor: Int32 { path.udp.fd }

    /// Reads up to `maximum` waiting datagrams (never blocks) and passes each one from a connected peer to `deliver`,
    /// its bytes valid only during the call. Returns how many datagrams were read from the socket (0: none waited,
    /// or another thread is reading). `deliver` may call the session, even what waits on the session's thread: that
    /// thread never waits for a reader (it publishes new route tables without waiting for this one to leave the old).
    @discardableResult
    public func read(maximum: Int = 64, _ deliver: (UnsafeRawBufferPointer, PeerID) -> Void) -> Int {
        let path = path, waker = latchWaker
        return path.read(into: buffer, maximum: maximum, deliver: deliver, latched: { link, address in
            // A full queue loses nothing: the loop then reads every route's address itself.
            if !path.latches.push((link, address)) { path.latchesLost.store(true, ordering: .releasing) }
            waker.wake()
        }) ?? 0
    }
}
