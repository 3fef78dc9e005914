import Foundation
import Synchronization
import Testing
import MeshPOSIX
import MeshTestSupport
@testable import PeerMesh

/// A host session with an advertiser on 127.0.0.1 (no DNS-SD) that accepts every invitation into it.
private final class OpenHost {
    let session: Session
    let log = MeshEventLog()
    let advertiser: NearbyServiceAdvertiser
    var port: UInt16 { advertiser.port! }

    init(service: String, configuration: Session.Configuration = .init(bindHost: "127.0.0.1")) throws {
        session = try Session(peer: try PeerID(displayName: "host"), configuration: configuration)
        session.delegate = log
        advertiser = try NearbyServiceAdvertiser(peer: session.myPeerID, discoveryInfo: nil, serviceType: service,
                                                 discovery: InProcessDiscovery(), bindHost: "127.0.0.1")
        advertiser.delegate = log
        log.acceptInto.withLock { $0 = session }
        try advertiser.startAdvertisingPeer()
    }

    /// A raw guest named `name` that invites itself in (a real handshake, a well-formed INVITE) and is connected.
    func admit(_ name: String) throws -> RawGuest {
        let guest = try RawGuest(port: port, name: name)
        guest.send([RawGuest.invite()])
        guard eventually(3, { session.connectedPeers.contains { $0.displayName == name } }) else {
            throw PeerMeshError.transport("\(name) was not admitted")
        }
        return guest
    }

    /// The last state the host's delegate heard for `name` (nil: never heard of it).
    func lastState(of name: String) -> SessionState? {
        log.snapshot.states.last { $0.0.displayName == name }?.1
    }

    /// A well-behaved guest joins and a message gets through: the host is unharmed.
    func aRealGuestJoins() throws -> Bool {
        let guest = try Session(peer: try PeerID(displayName: "real"), configuration: .init(bindHost: "127.0.0.1"))
        let guestLog = MeshEventLog()
        guest.delegate = guestLog
        try guest.connect(to: PeerEndpoint(host: "127.0.0.1", port: port), timeout: .seconds(5))
        guard guestLog.wait(5, { s in s.states.contains { $0.1 == .connected } }) else { return false }
        try guest.send(Data("hello".utf8), toPeers: guest.connectedPeers, with: .reliable)
        return log.wait(5) { s in s.reliable.contains { $0.0.displayName == "real" && $0.1 == Data("hello".utf8) } }
    }
}

/// Peers that speak the protocol correctly enough to get in, and then lie: each test asserts what the host's app
/// sees (no ghost peers, nothing unbounded) and that a real guest still gets through.
@Suite("Lying peers (real sockets)", .serialized)
struct LyingPeerTests {
    @Test("A message over the receiver's maximumMessageSize (but within a frame's length) closes the sender's link; one at the limit is delivered")
    func aMessageOverTheReceiversLimitIsAFault() throws {
        let pair = try Pair(hostConfig: Session.Configuration(maximumMessageSize: 1_024))
        try pair.guest.send(Data(repeating: 7, count: 1_024), toPeers: [pair.hostPeer], with: .reliable)
        #expect(pair.hostLog.wait(5) { $0.reliable.count == 1 })
        // The guest's own limit is 1 MiB, so its session sends it; the host's frame length lets 64 KiB through.
        try pair.guest.send(Data(repeating: 7, count: 2_000), toPeers: [pair.hostPeer], with: .reliable)
        #expect(eventually(5) { pair.host.statistics.peerFaults == 1 })
        #expect(eventually(5) { pair.host.state(of: pair.guestPeer) == .notConnected })
        #expect(pair.hostLog.snapshot.reliable.map(\.1.count) == [1_024], "the oversized message was not delivered")
    }

    @Test("INVITE and GOODBYE in one write: the host's app never keeps a peer that has gone")
    func inviteAndGoodbyeTogether() throws {
        let host = try OpenHost(service: "pm-ghost")
        for i in 0..<5 {
            let guest = try RawGuest(port: host.port, name: "ghost\(i)")
            guest.send([RawGuest.invite(token: UInt64(i) + 1), .goodbye])
            usleep(200_000)
            withExtendedLifetime(guest) {}
        }
        #expect(eventually(3) { host.session.connectedPeers.isEmpty })
        for i in 0..<5 {
            let last = host.lastState(of: "ghost\(i)")
            #expect(last == nil || last == .notConnected, "ghost\(i)'s last state at the host: \(String(describing: last))")
        }
        #expect(host.session.connectedPeers.isEmpty)
        #expect(try host.aRealGuestJoins())
    }

    @Test("Stream after stream, each closed by the app, none closed by the writer: the link is cut at 64, the host unharmed")
    func streamsNeverClosed() throws {
        /// An app that takes the default for streams (it closes each one as it arrives).
        final class StreamRefusingApp: SessionDelegate, Sendable {
            let log: MeshEventLog
            init(log: MeshEventLog) { self.log = log }
            func session(_ session: Session, peer: PeerID, didChange state: SessionState) {
                log.session(session, peer: peer, didChange: state)
            }
            func session(_ session: Session, didReceive data: Data, fromPeer peer: PeerID) {
                log.session(session, didReceive: data, fromPeer: peer)
            }
        }
        let host = try OpenHost(service: "pm-streamflood")
        let app = StreamRefusingApp(log: host.log)
        host.session.delegate = app
        let guest = try host.admit("flooder")
        // Four at a time, each batch closed by the app (its four CLOSEs back) before the next is sent: never more than
        // the 16 open at once that are refused anyway, so only the bound on streams closed but not acknowledged can
        // stop this. Paced by the host's answers, not by the clock: a loaded machine cuts at the same stream.
        var id: UInt32 = 0
        while id < 300 {
            guest.send((1...4).map { k in .stream(.open(id: id + k, name: "s")) })
            id += 4
            guard guest.receiveFrames(4, within: 5) else { break }
        }
        #expect(eventually(3) { host.session.connectedPeers.isEmpty })
        #expect(id == 68, "cut off in the batch of the 65th stream, not past 80 as by the refusal bound (after \(id) opened)")
        #expect(host.session.statistics.peerFaults == 1)
        #expect(host.lastState(of: "flooder") == .notConnected)
        #expect(try host.aRealGuestJoins())
        withExtendedLifetime((guest, app)) {}
    }

    @Test("A peer that keeps the host's socket full of tiny records cannot starve the loop: another peer's messages flow")
    func tinyRecordFloodDoesNotStarveOthers() throws {
        let host = try OpenHost(service: "pm-tinyflood")
        let real = try Session(peer: try PeerID(displayName: "real"), configuration: .init(bindHost: "127.0.0.1"))
        let realLog = MeshEventLog()
        real.delegate = realLog
        try real.connect(to: PeerEndpoint(host: "127.0.0.1", port: host.port), timeout: .seconds(5))
        #expect(realLog.wait(5) { s in s.states.contains { $0.1 == .connected } })
        let flooder = try host.admit("flooder")
        #expect(host.session.connectedPeers.count == 2)

        // Three seconds and more of HEARTBEATs, each its own 23-byte record (a decryption each), as fast as they go.
        let floodStart = Date()
        let flooding = Atomic<Bool>(true)
        let sentBytes = Atomic<Int>(0)
        let unfinishedWrites = Atomic<Int>(0)
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            while flooding.load(ordering: .acquiring) {
                var burst: [UInt8] = []
                for _ in 0..<2_000 { burst += flooder.seal(.heartbeat) }
                // A write the host did not take in time would cut a record and end the flood as a fault.
                if !sendAll(flooder.fd, burst, seconds: 10) { unfinishedWrites.add(1, ordering: .relaxed) }
                sentBytes.add(burst.count, ordering: .relaxed)
            }
            done.signal()
        }
        usleep(300_000)
        for i in 0..<20 {
            try real.send(Data("m\(i)".utf8), toPeers: real.connectedPeers, with: .reliable)
            usleep(150_000)
        }
        let allArrived = host.log.wait(3) { s in s.reliable.filter { $0.0.displayName == "real" }.count == 20 }
        flooding.store(false, ordering: .releasing)
        done.wait()
        #expect(allArrived, "the host received \(host.log.snapshot.reliable.count) of 20 messages during the flood")
        #expect(!realLog.snapshot.states.contains { $0.1 == .notConnected }, "the real peer was never dropped")
        #expect(unfinishedWrites.load(ordering: .relaxed) == 0, "the flood went on to the end")
        #expect(host.session.connectedPeers.map(\.displayName).contains("flooder"), "the flooder broke no rule: still connected")
        #expect(host.session.connectedPeers.map(\.displayName).contains("real"))
        let arrived = host.log.snapshot.reliable.filter { $0.0.displayName == "real" }.count
        print("tiny-record flood: \(sentBytes.load(ordering: .relaxed) / 1_000_000) MB of 23-byte records in \(String(format: "%.1f", Date().timeIntervalSince(floodStart))) s; \(arrived) of 20 messages from the real peer arrived")
        withExtendedLifetime(real) {}
    }

    @Test("A receiver that resets the connection mid-transfer: the 8 GiB send fails at once, the host's loop stays free")
    func resetMidTransfer() throws {
        let host = try OpenHost(service: "pm-reset")
        let receiver = try host.admit("resetter")
        let peer = try #require(host.session.connectedPeers.first)
        // A sparse 8 GiB file: reading it costs nothing, but hashing and sealing all of it takes many seconds.
        let path = NSTemporaryDirectory() + "pm-reset-\(getpid()).bin"
        #expect(FileManager.default.createFile(atPath: path, contents: nil))
        defer { try? FileManager.default.removeItem(atPath: path) }
        #expect(truncate(path, 8 << 30) == 0)
        let outcome = Mutex<PeerMeshError??>(nil)
        _ = try host.session.sendResource(at: URL(fileURLWithPath: path), withName: "big", toPeer: peer) { error in
            outcome.withLock { $0 = .some(error) }
        }
        // The receiver reads nothing (the sender's queue fills and waits), then resets the connection.
        usleep(300_000)
        var hard = linger(l_onoff: 1, l_linger: 0)
        _ = setsockopt(receiver.fd.fd, SOL_SOCKET, SO_LINGER, &hard, socklen_t(MemoryLayout<linger>.size))
        receiver.fd.close()
        let reset = Date()
        #expect(eventually(3) { outcome.withLock { $0 } != nil }, "the transfer has not ended 3 s after the reset")
        if case .some(.some) = outcome.withLock({ $0 }) {} else { Issue.record("the transfer did not fail: \(String(describing: outcome.withLock { $0 }))") }
        let failedAfter = Date().timeIntervalSince(reset)
        let joined = try host.aRealGuestJoins()
        #expect(joined)
        print("reset mid-transfer: the 8 GiB transfer failed \(String(format: "%.2f", failedAfter)) s after the reset; a real guest joined: \(joined)")
    }

    @Test("A RESOURCE_START of 2⁶⁴ − 1 bytes to an app that set no size limit (.max): refused, no trap")
    func resourceSizeBeyondWhatProgressCounts() throws {
        let host = try OpenHost(service: "pm-hugeresource",
                                configuration: .init(bindHost: "127.0.0.1", maximumResourceSize: .max))
        let guest = try host.admit("huge")
        guest.send([.resource(.start(id: 1, size: .max, name: "huge"))])
        usleep(300_000)
        #expect(host.log.snapshot.resourcesStarted.isEmpty)
        #expect(host.session.statistics.peerFaults == 0, "a refusal, not a fault")
        #expect(host.session.connectedPeers.map(\.displayName) == ["huge"])
        #expect(try host.aRealGuestJoins())
        withExtendedLifetime(guest) {}
    }

    @Test("DATAGRAM frames on a direct link (they belong on relayed links only): a fault, nothing delivered")
    func datagramFramesOnADirectLink() throws {
        let host = try OpenHost(service: "pm-dgframe")
        let guest = try host.admit("tcpdatagrams")
        guest.send([.datagram([1, 2, 3])])
        #expect(eventually(3) { host.session.connectedPeers.isEmpty })
        #expect(host.session.statistics.peerFaults == 1)
        #expect(host.log.snapshot.datagrams.isEmpty)
        #expect(try host.aRealGuestJoins())
        withExtendedLifetime(guest) {}
    }

    @Test("A peer that asks for introductions and never reads the answers: cut off at twice the queue limit, the host unharmed")
    func askerThatNeverReads() throws {
        let limit = 1 << 20
        let host = try OpenHost(service: "pm-noread", configuration: .init(bindHost: "127.0.0.1", maximumQueuedBytes: limit))
        let asker = try host.admit("asker")
        // From here on the asker reads nothing: once its receive buffer is full, the host's answers pile up on its
        // side. (Its buffer is not shrunk now: a window shrunk under a connection in flight can stall the asker's own
        // sending on loopback, and a peer that sends nothing more is only timed out.)
        let loop = try EventLoop.shared()
        let core = host.session.core
        /// The most bytes the host holds queued towards any peer now.
        func queued() -> Int { loop.submitAndWait { core.io.value.connections.values.map(\.queuedBytes).max() ?? 0 } }
        // Each request names a newcomer and is answered (MESH_INTRO_DATA): with connection data for the first ones,
        // then, past the asker's pace, with empty data; legal either way.
        let requests = try (0..<16).flatMap { _ in ControlFrame.mesh(.introRequest(peer: try PeerID(displayName: "n"))).encoded() }
        var sent = 0, most = 0
        while sent < 64 * limit, host.session.statistics.peerFaults == 0 {
            var batch: [UInt8] = []
            for _ in 0..<100 { batch += requests }
            guard sendAll(asker.fd, asker.seal(frames: batch), seconds: 5) else { break }  // the host hung up
            sent += batch.count
            most = max(most, queued())
        }
        print("never-reading asker: \(sent) bytes of MESH_INTRO_REQUEST; at most \(most) bytes queued towards it (limit \(2 * limit))")
        #expect(eventually(5) { host.lastState(of: "asker") == .notConnected }, "the asker's link was cut")
        #expect(most <= 2 * limit + 64 << 10, "the host's queue stayed near twice the limit: \(most) bytes")
        #expect(queued() == 0)
        let stats = host.session.statistics
        #expect(stats.peerFaults == 1, "counted as this peer's fault")
        #expect(stats.garbageConnections == 0, "it sent nothing malformed")
        #expect(host.session.connectedPeers.isEmpty)
        #expect(try host.aRealGuestJoins())
        withExtendedLifetime(asker) {}
    }

    /// A host with an honest member and a lying one (raw), and a newcomer the liar names to the host
    /// (MESH_INTRO_REQUEST) though it has joined no one: the host has made connection data for it.
    private struct NamedNewcomer {
        let host: OpenHost
        let member: Session
        let liar: RawGuest
        let newcomer: Session

        init(service: String) throws {
            // The raw liar sends no heartbeats: a long peer timeout keeps it a member for the whole test.
            let host = try OpenHost(service: service, configuration: .init(peerTimeout: .seconds(30), bindHost: "127.0.0.1"))
            let config = Session.Configuration(bindHost: "127.0.0.1")
            let member = try Session(peer: try PeerID(displayName: "member"), configuration: config)
            try member.connect(to: PeerEndpoint(host: "127.0.0.1", port: host.port), timeout: .seconds(5))
            #expect(eventually(5) { host.session.connectedPeers.map(\.displayName) == ["member"] })
            let liar = try host.admit("liar")
            // The host asked the member about the liar, as about any newcomer.
            #expect(eventually(5) { host.session.statistics.introductionsAsked == 1 })
            let newcomer = try Session(peer: try PeerID(displayName: "newcomer"), configuration: config)
            #expect(liar.send([.mesh(.introRequest(peer: newcomer.myPeerID))]))
            (self.host, self.member, self.liar, self.newcomer) = (host, member, liar, newcomer)
        }

        /// Whether the newcomer ends up connected to the host and the member, and the host asked both members about
        /// it (and the member about the liar before), with no peer at fault.
        func newcomerMeetsTheMember() -> Bool {
            let met = eventually(10) { Set(newcomer.connectedPeers.map(\.displayName)) == ["host", "member"] }
                && eventually(5) { member.connectedPeers.contains(newcomer.myPeerID) }
            let stats = host.session.statistics
            return met && stats.introductionsAsked == 3 && stats.peerFaults == 0
        }
    }

    @Test("A member that names a newcomer before it comes cannot keep it out of the mesh: when it joins by an invitation of its own, it is introduced to the other members and connects to them")
    func aNamedNewcomerThatJoinsByItsOwnInvitationIsIntroduced() throws {
        let w = try NamedNewcomer(service: "pm-named")
        #expect(eventually(5) { w.host.session.direct.withLock { $0 }?.hasTicket(for: w.newcomer.myPeerID) == true },
                "the host made connection data for the named newcomer")
        // The newcomer joins the host by an invitation of its own: the host asks both members about it
        // (MESH_INTRO_REQUEST), the member makes it data, and it connects to the member directly.
        try w.newcomer.connect(to: PeerEndpoint(host: "127.0.0.1", port: w.host.port), timeout: .seconds(5))
        #expect(w.newcomerMeetsTheMember(), "the newcomer's view: \(w.newcomer.connectedPeers.map(\.displayName))")
        #expect(w.member.statistics.introductionsAsked == 0 && w.newcomer.statistics.introductionsAsked == 0,
                "their links came by introductions (the host's): they introduce no one")
    }

    @Test("Connection data a member had made for its 'introduction' and hands a peer out of band makes a newcomer's link: the peer is introduced to the others")
    func dataPassedOnOutOfBandMakesANewcomer() throws {
        let w = try NamedNewcomer(service: "pm-handed")
        // The liar gives the data the host made to the newcomer's app.
        let id = w.newcomer.myPeerID.identity
        let answer = w.liar.receive(within: 5) { if case .mesh(.introData(id, _)) = $0 { true } else { false } }
        guard case .mesh(.introData(_, let data))? = answer, !data.isEmpty else {
            Issue.record("no connection data for the newcomer: \(String(describing: answer))")
            return
        }
        try w.newcomer.connectPeer(w.host.session.myPeerID, withNearbyConnectionData: Data(data))
        // The host lets it in with the ticket, as a newcomer (it followed no introduction): the member is asked about
        // it, and the newcomer meets the member.
        #expect(w.newcomerMeetsTheMember(), "the newcomer's view: \(w.newcomer.connectedPeers.map(\.displayName))")
    }

    @Test("Tens of thousands of frames packed into a few records: every one is taken, in order, and the link stays up")
    func thousandsOfFramesInOneRead() throws {
        let host = try OpenHost(service: "pm-packed")
        let packer = try host.admit("packer")
        let heartbeat = ControlFrame.heartbeat.encoded()
        let perRecord = SecureChannel.maximumRecordPlaintext / heartbeat.count
        var bytes: [UInt8] = []
        for record in 0..<6 {
            var frames: [UInt8] = []
            for _ in 0..<perRecord { frames += heartbeat }
            // Reliable messages among the heartbeats: they must come out in the order they went in.
            frames.replaceSubrange(0..<heartbeat.count * 2, with: ControlFrame.data(Array("m\(record)".utf8)).encoded())
            bytes += packer.seal(frames: frames)
        }
        bytes += packer.seal(.data(Array("end".utf8)))
        let start = Date()
        #expect(packer.sendRaw(bytes))
        #expect(host.log.wait(20) { s in s.reliable.contains { $0.1 == Data("end".utf8) } })
        print("packed frames: \(6 * perRecord) frames in \(bytes.count) bytes taken in \(String(format: "%.2f", Date().timeIntervalSince(start))) s")
        let messages = host.log.snapshot.reliable.filter { $0.0.displayName == "packer" }.map { String(decoding: $0.1, as: UTF8.self) }
        #expect(messages == ["m0", "m1", "m2", "m3", "m4", "m5", "end"])
        #expect(host.session.connectedPeers.map(\.displayName) == ["packer"])
        #expect(host.session.statistics.peerFaults == 0)
        withExtendedLifetime(packer) {}
    }
}
