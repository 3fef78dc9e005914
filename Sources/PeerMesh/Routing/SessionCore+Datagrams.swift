import FoundationEssentials
import MeshPOSIX
import Synchronization

// The datagram half of `SessionCore`: the types its senders and the loop share, the send path app threads
// (real-time ones included) call without a lock, and the loop's side of the route tables.

extension AtomicRecord where Value == SessionStatistics {
    /// Counts a datagram the session dropped, under its reason.
    func count(_ drop: DatagramDrop) {
        switch drop {
        case .malformed: add { $0.malformedDatagrams += 1 }
        case .stranger: add { $0.strangerDatagrams += 1 }
        case .unauthentic: add { $0.unauthenticDatagrams += 1 }
        case .duplicate: add { $0.duplicateDatagrams += 1 }
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

    /// Takes the next sequence number, or nil once `maximumDatagramSequence` is reached. The counter stops there
    /// (compare-and-swap, never an add that tries on regardless), so no number of refused tries wraps it round to
    /// a nonce already used under the link's key. Lock-free: the senders include the real-time capture thread.
    @inline(__always)
    func takeSequence() -> UInt64? {
        var current = nextSequence.load(ordering: .relaxed)
        while current < maximumDatagramSequence {
            let (exchanged, original) = nextSequence.compareExchange(expected: current, desired: current + 1, ordering: .relaxed)
            if exchanged { return current }
            current = original
        }
        return nil
    }
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

/// Sequence numbers never wrap: at this a link refuses to send (reconnect to get fresh keys).
let maximumDatagramSequence: UInt64 = 1 << 62

/// Runs `body` with room for one whole datagram — header, the largest payload, tag: 1,220 bytes — on the stack.
/// (`withUnsafeTemporaryAllocation` takes the heap above 1,024 bytes on Linux: a malloc and a free per packet on the
/// capture thread, for stereo or long periods.)
@inline(__always)
func withDatagramScratch<R>(_ body: (UnsafeMutableRawBufferPointer) -> R) -> R {
    var scratch = InlineArray<1220, UInt8>(repeating: 0)
    return withUnsafeMutableBytes(of: &scratch, body)
}

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

/// The senders' table: connected peers' send routes, published whole (`SnapshotCell`) whenever a route changes.
final class SendTable: Sendable {
    let routes: [PeerID: SendRoute]
    /// Peers reached only through a relay pipe, by link.
    let relayed: [PeerID: LinkID]
    /// Where their datagrams go to the loop (nil until the session's first relayed link, or if it could not be made).
    let relayedOutbox: RelayedDatagramOutbox?
    init(_ routes: [PeerID: SendRoute], relayed: [PeerID: LinkID], relayedOutbox: RelayedDatagramOutbox? = nil) {
        self.routes = routes
        self.relayed = relayed
        self.relayedOutbox = relayedOutbox
    }
}

/// Datagrams for peers reached only through a relay pipe, on their way from any sender thread (a real-time one
/// included) to the loop, which sends them as DATAGRAM frames on the pipe's connection: a preallocated queue and an
/// eventfd, so that a sender neither allocates nor takes a lock — it copies, and makes one non-blocking write when the
/// loop is not already woken.
final class RelayedDatagramOutbox: Sendable {
    /// Datagrams in flight to the loop, at most (a burst beyond it is dropped: datagrams are unreliable).
    static let capacity = 64
    private let queue = MPSCByteQueue(capacity: capacity, slotBytes: Session.maximumDatagramSize)
    /// Readable while datagrams wait: the loop watches it.
    let waker: Waker
    /// Whether the loop was woken and has not started draining since (saves a write per datagram in a burst).
    private let woken = Atomic<Bool>(false)

    init() throws(SyscallError) { waker = try Waker() }

    /// Any thread: queues `payload` for `link`; false when the outbox is full (the datagram is dropped).
    func post(_ payload: UnsafeRawBufferPointer, on link: LinkID) -> Bool {
        guard queue.push(tag: UInt64(truncatingIfNeeded: link), payload) else { return false }
        // The exchange pairs with the loop's: a sender that finds it woken knows the loop's next drain sees its datagram.
        if !woken.exchange(true, ordering: .acquiringAndReleasing) { waker.wake() }
        return true
    }

    /// The loop: hands every queued datagram to `body`, oldest first (its bytes are valid during the call).
    func drain(_ body: (LinkID, UnsafeRawBufferPointer) -> Void) {
        waker.drain()
        _ = woken.exchange(false, ordering: .acquiringAndReleasing)
        while queue.pop({ body(LinkID(truncatingIfNeeded: $0), $1) }) != nil {}
    }
}

extension SessionCore {
    // MARK: Sending (any thread, no lock)

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
    func sendDatagram(_ payload: UnsafeRawBufferPointer, to peers: [PeerID], table: SendTable,
                              noteMissing: (PeerID) -> Void) -> Int {
        var missing = 0
        var sent: UInt64 = 0, failed: UInt64 = 0
        // No heap allocation: each datagram is assembled (and sealed, on an encrypted link) in stack space.
        precondition(payload.count <= Session.maximumDatagramSize, "datagram payload over maximumDatagramSize")
        withDatagramScratch { buf in
            for p in peers {
                guard let r = table.routes[p] else {
                    if let link = table.relayed[p] {
                        // No UDP path: into the outbox, for the loop to send on the pipe's connection.
                        if table.relayedOutbox?.post(payload, on: link) == true { sent += 1 } else { failed += 1 }
                    } else {
                        missing += 1
                        noteMissing(p)
                    }
                    continue
                }
                guard let sequence = r.counters.takeSequence() else {
                    failed += 1  // the link's numbers are spent: not sent
                    continue
                }
                let n = Self.seal(payload, kind: .data, token: r.remoteToken, sequence: sequence, key: r.key, into: buf)
                if udp.send(UnsafeRawBufferPointer(rebasing: buf[..<n]), to: r.remote) >= 0 { sent += 1 } else { failed += 1 }
            }
        }
        counters.add { $0.datagramsSent += sent }
        if failed > 0 { counters.add { $0.datagramsNotSent += failed } }
        return missing
    }

    /// The loop: sends what the relayed datagrams' outbox holds, each as a DATAGRAM frame on its link's connection
    /// (sealed end to end by the link's records). Unreliable: a datagram whose link is gone, or whose connection's
    /// queue is full, is dropped rather than let the queue grow, and counted as not sent.
    func sendRelayedDatagrams() {
        var dropped: UInt64 = 0
        io.value.relayedOutbox?.drain { link, bytes in
            guard let c = io.value.connections[link], c.queuedBytes < configuration.maximumQueuedBytes else {
                dropped += 1
                return
            }
            c.send(.datagram(Array(bytes)))
        }
        if dropped > 0 { counters.add { $0.datagramsNotSent += dropped } }
    }

    /// The loop: makes the relayed datagrams' outbox, and watches it, the first time the session has a relayed link.
    /// Without it (out of descriptors), datagrams to relayed peers are counted as not sent; making it is tried again
    /// at the next change of routes, unless the loop refused to watch one.
    private func makeRelayedOutboxIfNeeded() {
        guard io.value.relayedOutbox == nil, !io.value.relayedOutboxRefused, !io.value.relayedLinks.isEmpty,
              let outbox = try? RelayedDatagramOutbox() else { return }
        io.value.relayedOutbox = outbox
        io.value.outboxRegistration = loop.register(fd: outbox.waker.fd, interest: .readable) { [unowned self] readiness in
            if readiness.contains(.failed) { relayedOutboxRefused() } else { sendRelayedDatagrams() }
        }
    }

    /// The loop could not watch the outbox (epoll refused it): its datagrams are counted as not sent, and so are later
    /// ones to relayed peers (the send table has no outbox from now on), rather than queue where nothing reads.
    private func relayedOutboxRefused() {
        guard let outbox = io.value.relayedOutbox else { return }
        if let r = io.value.outboxRegistration { loop.deregister(r) }
        io.value.outboxRegistration = nil
        io.value.relayedOutbox = nil
        io.value.relayedOutboxRefused = true
        var lost: UInt64 = 0
        outbox.drain { _, _ in lost += 1 }
        if lost > 0 { counters.add { $0.datagramsNotSent += lost } }
        publishSendTable()
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

    // MARK: Loop: route tables

    /// Rebuilds the senders' table from the links' routes: each peer's oldest connected link.
    func publishSendTable() {
        var table: [PeerID: SendRoute] = [:]
        for (link, route) in io.value.routes {
            if let existing = table[route.peer], existing.link < link { continue }
            table[route.peer] = SendRoute(link: link, remote: route.remote, remoteToken: route.remoteToken,
                                          counters: route.receiver.counters, key: route.receiver.keys?.send)
        }
        makeRelayedOutboxIfNeeded()
        sendTable.replace(with: SendTable(table, relayed: io.value.relayedLinks, relayedOutbox: io.value.relayedOutbox))
    }

    /// Publishes the table datagrams are judged against. The loop never waits for the reader here: a `DatagramReader`
    /// runs the app's code inside the table (its `deliver`), and that code may wait on this loop. The old table is
    /// released on the loop once no reader is in it: now, or on a retry a millisecond later.
    func publishRoutes() {
        var table: [UInt64: LinkReceiver] = [:]
        for route in io.value.routes.values { table[route.localToken] = route.receiver }
        if !datagrams.routes.publish(RouteTable(table)) { reclaimRoutesLater() }
    }

    /// Retries releasing replaced route tables every millisecond until no reader holds one. Loop thread only.
    private func reclaimRoutesLater() {
        guard !io.value.reclaimingRoutes else { return }
        io.value.reclaimingRoutes = true
        _ = loop.schedule(at: MonotonicClock.nowNanos() &+ 1_000_000) { [weak self] in
            guard let self else { return }
            io.value.reclaimingRoutes = false
            if !datagrams.routes.reclaim() { reclaimRoutesLater() }
        }
    }

    /// `link`'s peer now sends from `address` (an invitee follows the inviter's source port): answers go there.
    /// Returns whether the route moved (the caller republishes the send table).
    func latch(_ link: LinkID, to address: SocketAddress) -> Bool {
        guard io.value.routes[link] != nil, io.value.routes[link]?.remote != address else { return false }
        io.value.routes[link]?.remote = address
        return true
    }

    /// Some latches did not fit in the reader's queue: takes each route's address from its receiver, under the reading
    /// turn. When a reader holds the turn, tries again a millisecond later. Returns whether a route moved now.
    func followLostLatches() -> Bool {
        let current = datagrams.withReadingTurn { io.value.routes.mapValues { $0.receiver.route.remote } }
        guard let current else {
            datagrams.latchesLost.store(true, ordering: .releasing)
            _ = loop.schedule(at: MonotonicClock.nowNanos() &+ 1_000_000) { [weak self] in
                guard let self, datagrams.latchesLost.exchange(false, ordering: .acquiring) else { return }
                if followLostLatches() { publishSendTable() }
            }
            return false
        }
        var moved = false
        for (link, address) in current { moved = latch(link, to: address) || moved }
        return moved
    }

    // MARK: Loop: datagrams

    func sendPing(to address: SocketAddress, token: UInt64, counters lc: LinkCounters, key: SecretKey?, now: Nanos) {
        datagrams.sendControl(.ping, token: token, counters: lc, key: key, timestamp: now, to: address)
    }

    /// The loop's turn at the UDP socket (`.delegate` delivery): datagrams go to the delegate.
    func readDatagrams() {
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
