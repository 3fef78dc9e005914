import Foundation
import Synchronization
import Testing
import MeshPOSIX
import MeshTestSupport
@testable import PeerMesh

/// A thread of the app's that serves a session's `DatagramReader`, as mesh-play's playback thread does: it waits on
/// the reader's descriptor and reads what arrives.
private final class ReaderThread: Sendable {
    let received = Mutex<[(PeerID, Data)]>([])
    private let running = Atomic<Bool>(true)
    private let done = WakeSignal()

    init(_ reader: DatagramReader) {
        Thread { [self] in
            let polls = PollSet(capacity: 1)
            while running.load(ordering: .acquiring) {
                polls.removeAll()
                polls.appendReadable(reader.descriptor)
                _ = polls.wait(untilNanos: MonotonicClock.nowNanos() + 20_000_000)
                reader.read { bytes, peer in received.withLock { $0.append((peer, Data(bytes))) } }
            }
            done.signal()
        }.start()
    }

    var count: Int { received.withLock { $0.count } }

    func stop() {
        running.store(false, ordering: .releasing)
        done.wait()
    }
}

private func readerConfiguration(peerTimeout: Duration = .seconds(2)) -> Session.Configuration {
    var c = Session.Configuration(peerTimeout: peerTimeout)
    c.datagramDelivery = .reader
    return c
}

/// Datagrams read on the app's thread (`Session.Configuration.datagramDelivery = .reader`): the same judgement as the
/// session's own thread, over real sockets on 127.0.0.1.
@Suite("Datagram reader: a session's datagrams read on the app's thread", .serialized)
struct DatagramReaderTests {
    @Test("Datagrams reach the reader's thread, in full and counted, and never the delegate")
    func datagramsReachTheReader() throws {
        let pair = try Pair(guestConfig: readerConfiguration())
        let reader = try #require(pair.guest.datagramReader)
        #expect(pair.host.datagramReader == nil, "a session with delegate delivery has no reader")
        let thread = ReaderThread(reader)
        defer { thread.stop() }
        let n = 2_000
        for i in 0..<n {
            var d = Data(count: 600)
            d.withUnsafeMutableBytes { raw in
                raw.storeBytes(of: UInt32(i).bigEndian, as: UInt32.self)
                for j in 4..<raw.count { raw[j] = UInt8(truncatingIfNeeded: i &+ j) }
            }
            try pair.host.send(d, toPeers: [pair.guestPeer], with: .unreliable)
            if i % 100 == 99 { _ = eventually(2) { thread.count + 400 >= i + 1 } }
        }
        #expect(eventually(5) { thread.count >= n }, "read \(thread.count) of \(n)")
        let got = thread.received.withLock { $0 }
        #expect(got.allSatisfy { $0.0 == pair.hostPeer })
        let indices = got.map { $0.1.withUnsafeBytes { UInt32(bigEndian: $0.loadUnaligned(as: UInt32.self)) } }
        #expect(Set(indices).count == got.count, "no duplicates")
        #expect(got.allSatisfy { (_, d) in
            let i = d.withUnsafeBytes { Int(UInt32(bigEndian: $0.loadUnaligned(as: UInt32.self))) }
            return d.count == 600 && d.withUnsafeBytes { raw in (4..<raw.count).allSatisfy { raw[$0] == UInt8(truncatingIfNeeded: i &+ $0) } }
        }, "every byte as sent")
        #expect(pair.guest.statistics.datagramsReceived == UInt64(got.count))
        #expect(pair.guestLog.snapshot.datagrams.isEmpty, "the delegate hears no datagram")
        // The other direction still goes to the host's delegate.
        try pair.guest.send(Data("back".utf8), toPeers: [pair.hostPeer], with: .unreliable)
        #expect(pair.hostLog.wait(3) { $0.datagrams.contains { $0.1 == Data("back".utf8) } })
    }

    @Test("The reader answers pings and measures round trips: both sides learn their RTT")
    func pingsAndRoundTrips() throws {
        let pair = try Pair(hostConfig: .init(peerTimeout: .seconds(1)), guestConfig: readerConfiguration(peerTimeout: .seconds(1)))
        let thread = ReaderThread(try #require(pair.guest.datagramReader))
        defer { thread.stop() }
        // Pings go out every heartbeat (a quarter of the peer timeout); the guest's reader answers the host's and
        // reads the host's answers to its own.
        #expect(eventually(3) { pair.host.roundTripTime(to: pair.guestPeer) != nil && pair.guest.roundTripTime(to: pair.hostPeer) != nil })
        let rtt = try #require(pair.guest.roundTripTime(to: pair.hostPeer))
        #expect(rtt > .zero && rtt < .milliseconds(200))
        // Datagram proofs of life and heartbeats keep the link up past several peer timeouts.
        usleep(2_500_000)
        #expect(pair.guest.connectedPeers == [pair.hostPeer] && pair.host.connectedPeers == [pair.guestPeer])
    }

    @Test("Through the reader, replayed, forged and strangers' datagrams are dropped and counted; the stream goes on")
    func attacksThroughTheReader() throws {
        let pair = try Pair(guestConfig: readerConfiguration())
        let thread = ReaderThread(try #require(pair.guest.datagramReader))
        defer { thread.stop() }
        let capture = try LoopbackCapture(ports: [pair.guest.udpPort])
        defer { capture.stop() }
        for i in 0..<5 { try pair.host.send(Data("frame \(i)".utf8), toPeers: [pair.guestPeer], with: .unreliable) }
        #expect(eventually(3) { thread.count == 5 })
        #expect(eventually(3) { capture.datagrams.filter { $0.payload.count > DatagramHeader.size && $0.payload[3] == 1 }.count >= 5 })
        let real = capture.datagrams.filter { $0.payload[3] == 1 }.prefix(5).map(\.payload)
        let before = pair.guest.statistics
        let attacker = try FileDescriptor.udpSocket(SocketAddress(numericHost: "127.0.0.1", port: 0)!)
        let guestAddress = SocketAddress(numericHost: "127.0.0.1", port: pair.guest.udpPort)!
        func send(_ bytes: [UInt8]) { _ = bytes.withUnsafeBytes { attacker.send($0, to: guestAddress) } }
        for d in real { send(d) }                                   // replays
        var forged = real[0]
        forged[forged.count - 1] ^= 0x01                            // a flipped tag bit
        send(forged)
        var stranger = real[1]
        for i in 4..<12 { stranger[i] ^= 0x5a }                     // a token of nobody's
        send(stranger)
        send([0x50, 0x4d, 0x44])                                    // not a PeerMesh datagram
        #expect(eventually(3) {
            let s = pair.guest.statistics
            return s.duplicateDatagrams - before.duplicateDatagrams == 5 && s.unauthenticDatagrams - before.unauthenticDatagrams == 1
                && s.strangerDatagrams - before.strangerDatagrams == 1 && s.malformedDatagrams - before.malformedDatagrams == 1
        }, "\(pair.guest.statistics)")
        #expect(thread.count == 5, "nothing the attacker sent was read as the host's")
        try pair.host.send(Data("after".utf8), toPeers: [pair.guestPeer], with: .unreliable)
        #expect(eventually(3) { thread.received.withLock { $0.contains { $0.1 == Data("after".utf8) } } })
    }

    @Test("Two threads reading one reader take turns: every datagram is read exactly once")
    func twoThreadsTakeTurns() throws {
        let pair = try Pair(guestConfig: readerConfiguration())
        let reader = try #require(pair.guest.datagramReader)
        let first = ReaderThread(reader), second = ReaderThread(reader)
        let n = 3_000
        for i in 0..<n {
            try pair.host.send(Data(withUnsafeBytes(of: UInt32(i).bigEndian) { Array($0) }), toPeers: [pair.guestPeer], with: .unreliable)
            if i % 100 == 99 { _ = eventually(2) { first.count + second.count + 400 >= i + 1 } }
        }
        #expect(eventually(5) { first.count + second.count >= n })
        first.stop()
        second.stop()
        let all = first.received.withLock { $0 } + second.received.withLock { $0 }
        let indices = all.map { $0.1.withUnsafeBytes { UInt32(bigEndian: $0.loadUnaligned(as: UInt32.self)) } }
        #expect(Set(indices).count == all.count, "no datagram read twice")
        #expect(UInt64(all.count) == pair.guest.statistics.datagramsReceived)
    }

    /// The guest of `pair` (an inviter, which never latches) moving to new source ports, as a NAT rebinding would
    /// make it: each datagram is sealed as its session would seal it, and sent from a new socket of its own.
    struct MovingGuest {
        let route: LoopRoute
        let hostAddress: SocketAddress

        init(_ pair: Pair) throws {
            let core = pair.guest.core
            route = try #require(core.loop.submitAndWait { core.io.value.routes.values.first })
            hostAddress = SocketAddress(numericHost: "127.0.0.1", port: pair.host.udpPort)!
        }

        /// Sends `payload` to the host from a new port, and returns that port's socket.
        func send(_ payload: [UInt8]) throws -> FileDescriptor {
            let moved = try FileDescriptor.udpSocket(SocketAddress(numericHost: "127.0.0.1", port: 0)!)
            var datagram = [UInt8](repeating: 0, count: DatagramHeader.size + payload.count + Sodium.tagSize)
            let length = payload.withUnsafeBytes { p in
                datagram.withUnsafeMutableBytes { out in
                    SessionCore.seal(p, kind: .data, token: route.remoteToken, sequence: route.receiver.counters.takeSequence()!,
                                     key: route.receiver.keys?.send, into: out)
                }
            }
            _ = datagram.withUnsafeBytes { moved.send(UnsafeRawBufferPointer(rebasing: $0[..<length]), to: hostAddress) }
            return moved
        }

        /// A pair whose host (the invitee) reads through a reader on its own thread, with the guest's first datagram
        /// read, from the guest's own port. The caller stops the thread.
        fileprivate static func readingHost() throws -> (Pair, ReaderThread) {
            let pair = try Pair(hostConfig: readerConfiguration())
            let thread = ReaderThread(try #require(pair.host.datagramReader))
            try pair.guest.send(Data("first".utf8), toPeers: [pair.hostPeer], with: .unreliable)
            #expect(eventually(3) { thread.count == 1 })
            return (pair, thread)
        }

        /// Whether the host's datagrams reach `socket` (the host sends until one does, for a second at most).
        static func hostAnswers(_ pair: Pair, at socket: FileDescriptor) throws -> Bool {
            var buffer = [UInt8](repeating: 0, count: 2048)
            for _ in 0..<100 {
                try pair.host.send(Data("to the new port".utf8), toPeers: [pair.guestPeer], with: .unreliable)
                usleep(10_000)
                if buffer.withUnsafeMutableBytes({ socket.receive(into: $0) }) != nil { return true }
            }
            return false
        }
    }

    @Test("An invitee that reads on its own thread follows an authentic datagram's new source port (latching)")
    func latchingThroughTheReader() throws {
        // The host (the invitee) reads through a reader; the guest's datagrams start coming from another port (a NAT
        // rebinding). The first authentic one moves where the host answers, and the loop's send table follows.
        let (pair, thread) = try MovingGuest.readingHost()
        defer { thread.stop() }
        let payload: [UInt8] = Array("from the new port".utf8)
        let moved = try MovingGuest(pair).send(payload)
        #expect(eventually(3) { thread.received.withLock { $0.contains { $0.1 == Data(payload) } } })
        #expect(try MovingGuest.hostAnswers(pair, at: moved), "the host's datagrams follow the latched address")
    }

    @Test("Latches that overflow the reader's queue while the loop is busy are not lost: the host answers the newest port")
    func latchesBeyondTheQueueAreNotLost() throws {
        // As above, but the guest moves to a new port 80 times while the session's loop is busy (blocked here), more
        // than the reader's latch queue holds. Once the loop is free, the host must send to the last port.
        let (pair, thread) = try MovingGuest.readingHost()
        defer { thread.stop() }
        let guest = try MovingGuest(pair)
        let gate = WakeSignal()
        pair.guest.core.loop.execute { gate.wait() }  // the host's loop too: one loop per process
        var sockets: [FileDescriptor] = []
        for i in 0..<80 {
            sockets.append(try guest.send(Array("move \(i)".utf8)))
            _ = eventually(2) { thread.count == i + 2 }
        }
        #expect(thread.count == 81, "every move was read while the loop was blocked")
        let lost = pair.host.core.datagrams.latchesLost.load(ordering: .acquiring)
        #expect(lost, "the queue overflowed")
        gate.signal()
        #expect(try MovingGuest.hostAnswers(pair, at: sockets[sockets.count - 1]),
                "the host's datagrams follow the newest latched address")
        let stillLost = pair.host.core.datagrams.latchesLost.load(ordering: .acquiring)
        #expect(!stillLost, "the loop took the lost latches into account")
    }

    @Test("The reader's deliver may ask the session something while the loop replaces the route table: no deadlock")
    func deliverMayWaitOnTheLoopWhileRoutesChange() throws {
        // The host reads through a reader and has two guests. The reader holds the route table while it runs
        // `deliver`; there the app drops one guest (the loop removes its route and publishes a new table), then asks
        // the session about the other, which the loop answers. A loop that waited for the reader to leave the old
        // table before going on would never answer: each would wait for the other for ever.
        // The reader reads from the start, as an app's would: a link whose datagrams nobody reads times out.
        let pair = try Pair(hostConfig: readerConfiguration(peerTimeout: .seconds(10)))
        let reader = try #require(pair.host.datagramReader)
        let host = pair.host, guestPeer = pair.guestPeer
        let secondPeer = Mutex<PeerID?>(nil)
        let answered = Atomic<Int>(0)  // 0: not yet; 1: false; 2: true
        let delivered = Atomic<Bool>(false), stop = Atomic<Bool>(false), stopped = WakeSignal()
        Thread {
            let polls = PollSet(capacity: 1)
            while !stop.load(ordering: .acquiring) {
                polls.removeAll()
                polls.appendReadable(reader.descriptor)
                _ = polls.wait(untilNanos: MonotonicClock.nowNanos() + 20_000_000)
                reader.read(maximum: 1) { bytes, _ in
                    guard Data(bytes) == Data("hello".utf8), !delivered.exchange(true, ordering: .acquiringAndReleasing),
                          let second = secondPeer.withLock({ $0 }) else { return }
                    host.disconnect(second)
                    usleep(200_000)  // the loop has dropped the second guest and published the table without it
                    answered.store(host.isEncrypted(guestPeer) ? 2 : 1, ordering: .releasing)
                }
            }
            stopped.signal()
        }.start()
        defer {
            stop.store(true, ordering: .releasing)
            stopped.wait()
        }
        let second = try pair.join(as: "second")
        #expect(second.log.wait(5) { s in s.states.contains { $0.0 == pair.hostPeer && $0.1 == .connected } })
        #expect(eventually(5) { host.connectedPeers.count == 2 })
        secondPeer.withLock { $0 = second.peer }
        try pair.guest.send(Data("hello".utf8), toPeers: [pair.hostPeer], with: .unreliable)
        guard eventually(10, { answered.load(ordering: .acquiring) != 0 }) else {
            // The process's one event loop is stuck for good, and every later test would hang on it: end the run.
            fatalError("deadlock: the event loop waits for the reader's route table, the reader for the loop")
        }
        let history = "host saw \(pair.hostLog.snapshot.states.map { "\($0.0.displayName) \($0.1)" }); guest saw \(pair.guestLog.snapshot.states.map { "\($0.0.displayName) \($0.1)" }) \(pair.guestLog.snapshot.failures.map(\.2)); host stats \(host.statistics)"
        #expect(answered.load(ordering: .acquiring) == 2, "the first guest's link is encrypted: \(history)")
        #expect(host.statistics.datagramsReceived == 1)
        #expect(host.connectedPeers == [guestPeer])
        // The table the reader held is released on the loop once the reader has left it; the current one routes
        // the first guest only.
        let routes = host.core.datagrams.routes
        #expect(eventually(3) { host.core.loop.submitAndWait { routes.reclaim() } })
        #expect(routes.withCurrent { $0?.receivers.count } == 1)
    }

    @Test("After its session shuts down, a reader reads nothing and its descriptor is closed")
    func aShutSessionsReaderReadsNothing() throws {
        var guest: Session? = try Session(peer: try PeerID(displayName: "solo"), configuration: readerConfiguration())
        let reader = try #require(guest?.datagramReader)
        #expect(reader.descriptor >= 0)
        guest = nil
        #expect(reader.read { _, _ in Issue.record("nothing to read") } == 0)
        let polls = PollSet(capacity: 1)
        polls.appendReadable(reader.descriptor)
        _ = polls.wait(untilNanos: MonotonicClock.nowNanos() + 10_000_000)
        #expect(polls.readiness(at: 0) != .readable)
    }
}
