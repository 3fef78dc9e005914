import Foundation
import Testing
import Synchronization
import MeshPOSIX
import MeshTestSupport
@testable import PeerMesh
import PeerMeshFoundation

/// A directory of this test's own, removed at the end.
private final class Scratch {
    let path: String
    init(_ tag: String) throws {
        path = try TemporaryDirectory.make(in: TemporaryDirectory.system, prefix: "pm-res-\(tag)-")
    }
    /// What is in `sub` (default: the directory itself).
    func contents(_ sub: String? = nil) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: sub.map { "\(path)/\($0)" } ?? path)) ?? []).sorted()
    }
    deinit { try? FileManager.default.removeItem(atPath: path) }
}

/// `count` seeded pseudo-random bytes written to `path`.
@discardableResult
private func writeRandomFile(_ path: String, count: Int, seed: UInt64) throws -> [UInt8] {
    var rng = SeededRandom(seed: seed)
    var bytes = [UInt8](repeating: 0, count: count)
    bytes.withUnsafeMutableBytes { raw in
        let words = raw.bindMemory(to: UInt64.self)
        for i in words.indices { words[i] = rng.next() }
    }
    try Data(bytes).write(to: URL(fileURLWithPath: path))
    return bytes
}

/// What a completion handler was called with, and how often.
private final class Completion: Sendable {
    let calls = Mutex<[PeerMeshError?]>([])
    var handler: @Sendable (PeerMeshError?) -> Void { { e in self.calls.withLock { $0.append(e) } } }
    /// The one call's error (`.some(nil)`: success), or `.none` until exactly one call was made.
    var only: PeerMeshError?? { calls.withLock { c -> PeerMeshError?? in c.count == 1 ? .some(c[0]) : .none } }
}

@Suite("Resources over real sockets on 127.0.0.1, encrypted", .serialized)
struct ResourceTransferTests {
    /// A pair whose host writes incoming resources under `scratch/inbox` and keeps them in `scratch/kept`.
    private func pair(_ scratch: Scratch) throws -> Pair {
        try FileManager.default.createDirectory(atPath: "\(scratch.path)/inbox", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: "\(scratch.path)/kept", withIntermediateDirectories: true)
        var config = Session.Configuration()
        config.resourceDirectory = "\(scratch.path)/inbox"
        let pair = try Pair(hostConfig: config)
        pair.hostLog.keepResourcesIn.withLock { $0 = "\(scratch.path)/kept" }
        #expect(pair.host.isEncrypted(pair.guestPeer))
        return pair
    }

    @Test("A 24 MB file arrives with an equal SHA-256 while messages on the same link keep arriving")
    func aResourceArrivesWholeWhileMessagesFlow() throws {
        let scratch = try Scratch("whole")
        let pair = try pair(scratch)
        let size = 24 << 20
        let bytes = try writeRandomFile("\(scratch.path)/song.raw", count: size, seed: 42)
        let done = Completion()
        let progress = try pair.guest.sendResource(at: URL(fileURLWithPath: "\(scratch.path)/song.raw"), withName: "song.raw",
                                                   toPeer: pair.hostPeer, withCompletionHandler: done.handler)
        #expect(progress.totalUnitCount == Int64(size))
        // Messages sent after the transfer started do not wait for it: each one lands before the resource does.
        for i in 0..<50 { try pair.guest.send(Data("line \(i)".utf8), toPeers: [pair.hostPeer], with: .reliable) }
        #expect(pair.hostLog.wait(30) { $0.resourcesFinished.count == 1 })
        #expect(eventually(5) { done.only != nil })

        let log = pair.hostLog.snapshot
        #expect(log.reliable.map { String(decoding: $0.1, as: UTF8.self) } == (0..<50).map { "line \($0)" })
        #expect(log.order.firstIndex(of: "resource") == 50, "all 50 messages arrived before the 24 MB resource: \(log.order.count)")
        #expect(log.resourcesStarted.count == 1 && log.resourcesStarted.first?.1 == "song.raw")
        #expect(log.resourcesStarted.first?.2.totalUnitCount == Int64(size))
        let finished = try #require(log.resourcesFinished.first)
        #expect(finished.0 == pair.guestPeer && finished.1 == "song.raw" && finished.3 == nil)
        let received = try Data(contentsOf: URL(fileURLWithPath: try #require(finished.2)))
        #expect(Sodium.sha256([Array(received)]) == Sodium.sha256([bytes]))
        #expect(received.count == size && Array(received) == bytes)

        #expect(done.only == .some(nil), "the sender is told the peer has it")
        #expect(progress.isFinished && !progress.isCancelled && progress.fractionCompleted == 1 && progress.error == nil)
        #expect(log.resourcesStarted.first?.2.completedUnitCount == Int64(size))
        #expect(scratch.contents("inbox").isEmpty, "nothing left behind in the inbox")
        #expect(pair.host.statistics.peerFaults == 0)
    }

    @Test("MC's Foundation Progress (PeerMeshFoundation) follows a transfer on both sides, and cancelling it cancels the transfer")
    func foundationProgress() throws {
        let scratch = try Scratch("foundation")
        let pair = try pair(scratch)
        let size = 3 << 20
        try writeRandomFile("\(scratch.path)/a.raw", count: size, seed: 3)
        let sent = try pair.guest.sendResource(at: URL(fileURLWithPath: "\(scratch.path)/a.raw"), withName: "a.raw",
                                               toPeer: pair.hostPeer).foundationProgress()
        #expect(sent.totalUnitCount == Int64(size) && sent.isCancellable)
        #expect(pair.hostLog.wait(10) { !$0.resourcesStarted.isEmpty })
        let received = try #require(pair.hostLog.snapshot.resourcesStarted.first?.2).foundationProgress()
        #expect(pair.hostLog.wait(20) { $0.resourcesFinished.count == 1 })
        #expect(eventually(5) { sent.completedUnitCount == Int64(size) && sent.fractionCompleted == 1 })
        #expect(received.completedUnitCount == Int64(size) && !received.isCancelled)

        // Cancelling the Foundation Progress cancels the transfer on both sides.
        try writeRandomFile("\(scratch.path)/b.raw", count: 48 << 20, seed: 4)
        let done = Completion()
        let transfer = try pair.guest.sendResource(at: URL(fileURLWithPath: "\(scratch.path)/b.raw"), withName: "b.raw",
                                                   toPeer: pair.hostPeer, withCompletionHandler: done.handler)
        let progress = transfer.foundationProgress()
        // Cancelled midway, from the transfer's own progress reports. Foundation runs a Progress's cancellation handler
        // later, on a queue of its own, and 48 MB over loopback can be all through by then: the report waits until the
        // handler has run, as a busy machine might make it.
        let cancelling = DispatchSemaphore(value: 0)
        let adapter = progress.cancellationHandler
        progress.cancellationHandler = { adapter?(); cancelling.signal() }
        transfer.setUpdateHandler { p in
            guard p.completedUnitCount >= 2 << 20, !progress.isCancelled else { return }
            progress.cancel()
            _ = cancelling.wait(timeout: .now() + 10)
        }
        #expect(pair.hostLog.wait(10) { $0.resourcesStarted.count == 2 })
        #expect(pair.hostLog.wait(20) { $0.resourcesFinished.count == 2 })
        #expect(eventually(5) { transfer.isCancelled && transfer.isFinished })
        guard case .cancelled? = pair.hostLog.snapshot.resourcesFinished.last?.3 else {
            Issue.record("receiver saw \(String(describing: pair.hostLog.snapshot.resourcesFinished.last?.3))"); return
        }
        #expect(eventually(5) { if case .some(.cancelled?) = done.only { true } else { false } })
        #expect(eventually(5) { scratch.contents("inbox").isEmpty }, "no partial file")
    }

    @Test("A resource the receiver's disk has no room for (with its reserve) is refused at its start: the sender hears why, the app hears nothing, nothing is written")
    func noRoomOnTheDiskIsRefusedAtTheStart() throws {
        let scratch = try Scratch("noroom")
        var config = Session.Configuration()
        config.resourceDirectory = scratch.path
        config.maximumResourceSize = .max
        let pair = try Pair(hostConfig: config)
        // A sparse file a quarter larger than what the disk has free: it takes no room here, and the margin holds
        // whatever else the machine writes or deletes meanwhile.
        let available = try FileSystem.availableBytes(at: scratch.path)
        let path = "\(scratch.path)/huge.sparse"
        #expect(FileManager.default.createFile(atPath: path, contents: nil))
        let handle = try #require(FileHandle(forWritingAtPath: path))
        try handle.truncate(atOffset: available + available / 4)
        try handle.close()
        let done = Completion()
        let progress = try pair.guest.sendResource(at: URL(fileURLWithPath: path), withName: "huge", toPeer: pair.hostPeer,
                                                   withCompletionHandler: done.handler)
        #expect(eventually(10) { done.only != nil })
        let said = String(describing: done.only.flatMap { $0 } as Any)
        #expect(said.contains("not enough free space on the receiver"), "\(said)")
        #expect(progress.isFinished && progress.error != nil)
        #expect(pair.hostLog.snapshot.resourcesStarted.isEmpty && pair.hostLog.snapshot.resourcesFinished.isEmpty,
                "the receiving app never heard of it")
        #expect(scratch.contents() == ["huge.sparse"], "no directory was made for it")
        #expect(pair.host.statistics.peerFaults == 0 && pair.host.state(of: pair.guestPeer) == .connected)
    }

    enum Canceller: String, CaseIterable { case sender, receiver, disconnect }

    @Test("Cancelling midway, from either side or by leaving, leaves no partial file and tells both apps", arguments: Canceller.allCases)
    func cancellingMidwayLeavesNothing(_ who: Canceller) throws {
        let scratch = try Scratch("cancel-\(who)")
        let pair = try pair(scratch)
        try writeRandomFile("\(scratch.path)/big.raw", count: 48 << 20, seed: 7)
        let done = Completion()
        let cutAt: Int64 = 2 << 20
        let progress = try pair.guest.sendResource(at: URL(fileURLWithPath: "\(scratch.path)/big.raw"), withName: "big.raw",
                                                   toPeer: pair.hostPeer, withCompletionHandler: done.handler)
        switch who {
        case .sender:
            progress.setUpdateHandler { p in if p.completedUnitCount >= cutAt { p.cancel() } }
        case .receiver:
            #expect(pair.hostLog.wait(10) { !$0.resourcesStarted.isEmpty })
            pair.hostLog.snapshot.resourcesStarted.first?.2.setUpdateHandler { p in if p.completedUnitCount >= cutAt { p.cancel() } }
        case .disconnect:
            let guest = pair.guest
            progress.setUpdateHandler { p in if p.completedUnitCount >= cutAt { guest.disconnect() } }
        }
        #expect(pair.hostLog.wait(30) { $0.resourcesFinished.count == 1 })
        #expect(eventually(10) { done.only != nil })

        let finished = try #require(pair.hostLog.snapshot.resourcesFinished.first)
        #expect(finished.2 == nil, "no file handed over")
        switch (who, finished.3, done.only) {
        case (.sender, .cancelled?, .some(.cancelled?)), (.receiver, .cancelled?, .some(.cancelled?)),
             (.disconnect, .notConnected?, .some(.notConnected?)):
            break
        default:
            Issue.record("\(who): receiver saw \(String(describing: finished.3)), sender \(String(describing: done.only))")
        }
        #expect(progress.isFinished && progress.fractionCompleted < 1)
        #expect(eventually(5) { scratch.contents("inbox").isEmpty }, "no partial file: \(scratch.contents("inbox"))")
        #expect(scratch.contents("kept").isEmpty)
        #expect(pair.host.statistics.peerFaults == 0 && pair.guest.statistics.peerFaults == 0)
        if who != .disconnect {
            // The link is unharmed: messages still flow both ways.
            try pair.host.send(Data("still here".utf8), toPeers: [pair.guestPeer], with: .reliable)
            #expect(pair.guestLog.wait(5) { $0.reliable.contains { $0.1 == Data("still here".utf8) } })
            #expect(pair.host.connectedPeers == [pair.guestPeer])
        }
    }

    @Test("Several resources at once, both ways, each arrives whole")
    func severalAtOnceBothWays() throws {
        let scratch = try Scratch("several")
        let pair = try pair(scratch)
        var expected: [String: [UInt8]] = [:]
        let done = Completion()
        for i in 0..<4 {
            let name = "part\(i).bin"
            expected[name] = try writeRandomFile("\(scratch.path)/\(name)", count: 300_000 * (i + 1) + i, seed: UInt64(i))
            try pair.guest.sendResource(at: URL(fileURLWithPath: "\(scratch.path)/\(name)"), withName: name, toPeer: pair.hostPeer,
                                        withCompletionHandler: done.handler)
        }
        // The other way at the same time; the guest's log does not keep files, so it is only told.
        try writeRandomFile("\(scratch.path)/back.bin", count: 1_000_000, seed: 99)
        let back = try pair.host.sendResource(at: URL(fileURLWithPath: "\(scratch.path)/back.bin"), withName: "back.bin",
                                              toPeer: pair.guestPeer)
        #expect(pair.hostLog.wait(30) { $0.resourcesFinished.count == 4 })
        #expect(pair.guestLog.wait(30) { $0.resourcesFinished.count == 1 })
        #expect(eventually(5) { done.calls.withLock { $0.count } == 4 && back.isFinished })
        #expect(done.calls.withLock { $0.allSatisfy { $0 == nil } })
        #expect(back.error == nil && pair.guestLog.snapshot.resourcesFinished.first?.3 == nil)
        for (_, name, path, error) in pair.hostLog.snapshot.resourcesFinished {
            #expect(error == nil)
            let got = try Data(contentsOf: URL(fileURLWithPath: try #require(path)))
            #expect(Array(got) == expected[name], "\(name) arrived whole")
        }
    }

    @Test("Bad calls throw and send nothing")
    func badCallsThrow() throws {
        let scratch = try Scratch("bad")
        let pair = try pair(scratch)
        try writeRandomFile("\(scratch.path)/f", count: 10, seed: 1)
        let url = URL(fileURLWithPath: "\(scratch.path)/f")
        for name in ["", "..", "a/b", String(repeating: "x", count: 256)] {
            #expect(throws: PeerMeshError.self) { try pair.guest.sendResource(at: url, withName: name, toPeer: pair.hostPeer) }
        }
        let stranger = try PeerID(displayName: "stranger")
        #expect { try pair.guest.sendResource(at: url, withName: "f", toPeer: stranger) } throws: { e in
            if case PeerMeshError.notConnected = e { true } else { false }
        }
        #expect { try pair.guest.sendResource(at: URL(fileURLWithPath: "\(scratch.path)/missing"), withName: "f", toPeer: pair.hostPeer) } throws: { e in
            guard case PeerMeshError.resource(let text) = e else { return false }
            return text.contains("No such file")
        }
        #expect(throws: PeerMeshError.self) {
            try pair.guest.sendResource(at: URL(fileURLWithPath: scratch.path), withName: "dir", toPeer: pair.hostPeer)
        }
        #expect(throws: PeerMeshError.self) {
            try pair.guest.sendResource(at: URL(string: "https://example.invalid/x")!, withName: "x", toPeer: pair.hostPeer)
        }
        usleep(200_000)
        #expect(pair.hostLog.snapshot.resourcesStarted.isEmpty)
    }
}

/// Peers that lie about resources, streams and introductions, over the real encrypted link: the guest's own
/// session is made to send frames its driver never would.
@Suite("Resource, stream and mesh attacks", .serialized)
struct ResourceAttackOverTheLinkTests {
    private func inject(_ frames: [ResourceFrame], from session: Session, to peer: PeerID) {
        inject(frames.map { .resource($0) }, from: session, to: peer)
    }

    private func inject(_ frames: [ControlFrame], from session: Session, to peer: PeerID) {
        injectFrames(frames, from: session, to: peer)
    }

    @Test("One peer's transfers that each fit the receiver's disk but not together: its second is refused at its start while its first still owes its bytes; another peer's is not")
    func transfersThatTogetherWouldFillTheDisk() throws {
        let scratch = try Scratch("owed")
        let available = try FileSystem.availableBytes(at: scratch.path)
        var config = Session.Configuration(resourceDirectory: scratch.path, maximumResourceSize: .max)
        // A reserve an eighth of the free space, and two announced sizes that each leave room for it with a margin
        // of nearly a fifth of the disk, and together overrun it by a quarter: whatever else the machine writes or
        // deletes meanwhile, the first fits and the second does not. (Nothing is sent: the sizes are only announced.)
        config.resourceFreeSpaceReserve = available / 8
        let size = (available - available / 8) / 2 + available / 8
        let pair = try Pair(hostConfig: config)
        inject([.start(id: 1, size: size, name: "first")], from: pair.guest, to: pair.hostPeer)
        #expect(pair.hostLog.wait(5) { $0.resourcesStarted.count == 1 })
        inject([.start(id: 2, size: size, name: "second")], from: pair.guest, to: pair.hostPeer)
        usleep(300_000)
        #expect(pair.hostLog.snapshot.resourcesStarted.map(\.1) == ["first"], "the second was refused before the app heard of it")
        #expect(scratch.contents().count == 1, "one directory: the first's")
        // Once the first is over, its bytes are no longer owed: the same size starts again.
        inject([.cancel(id: 1)], from: pair.guest, to: pair.hostPeer)
        #expect(pair.hostLog.wait(5) { $0.resourcesFinished.count == 1 })
        inject([.cancel(id: 2), .start(id: 3, size: size, name: "third")], from: pair.guest, to: pair.hostPeer)
        #expect(pair.hostLog.wait(5) { $0.resourcesStarted.count == 2 })
        #expect(pair.hostLog.snapshot.resourcesStarted.map(\.1) == ["first", "third"])
        // What one peer announces reserves nothing against another: a second member's transfer of the same size
        // starts while the guest's third still owes all of its bytes (their bytes are checked as they are written).
        let second = try pair.join(as: "second")
        #expect(second.log.wait(5) { $0.states.contains { $0.0 == pair.hostPeer && $0.1 == .connected } })
        inject([.start(id: 1, size: size, name: "theirs")], from: second.session, to: pair.hostPeer)
        #expect(pair.hostLog.wait(5) { $0.resourcesStarted.count == 3 })
        #expect(pair.hostLog.snapshot.resourcesStarted.map(\.1) == ["first", "third", "theirs"])
        inject([.cancel(id: 3)], from: pair.guest, to: pair.hostPeer)
        inject([.cancel(id: 1)], from: second.session, to: pair.hostPeer)
        #expect(pair.hostLog.wait(5) { $0.resourcesFinished.count == 3 })
        #expect(eventually(5) { scratch.contents().isEmpty })
        #expect(pair.host.statistics.peerFaults == 0)
    }

    @Test("A transfer being written when the disk's free space falls under the reserve fails within 4 MiB, and its file is deleted")
    func aDiskThatFillsMidwayFailsTheTransfer() throws {
        let scratch = try Scratch("filling")
        final class Disk: Sendable { let free = Atomic<UInt64>(10 << 30) }
        let disk = Disk()
        var config = Session.Configuration(resourceDirectory: scratch.path)
        config.freeSpace = { _ in disk.free.load(ordering: .relaxed) }
        let pair = try Pair(hostConfig: config)
        inject([.start(id: 1, size: 64 << 20, name: "big")], from: pair.guest, to: pair.hostPeer)
        #expect(pair.hostLog.wait(5) { $0.resourcesStarted.count == 1 })
        let chunk = [UInt8](repeating: 3, count: ResourceFrame.maximumChunk)
        inject(Array(repeating: .chunk(id: 1, bytes: chunk), count: 80), from: pair.guest, to: pair.hostPeer)  // 5 MiB
        #expect(eventually(5) { pair.hostLog.snapshot.resourcesStarted.first?.2.completedUnitCount == 5 << 20 })
        #expect(pair.hostLog.snapshot.resourcesFinished.isEmpty, "room enough at the check after 4 MiB: it goes on")
        // Other programs (or peers) filled the disk: 100 MiB left, under the 256 MiB kept free.
        disk.free.store(100 << 20, ordering: .relaxed)
        inject(Array(repeating: .chunk(id: 1, bytes: chunk), count: 64), from: pair.guest, to: pair.hostPeer)  // 4 MiB
        #expect(pair.hostLog.wait(5) { $0.resourcesFinished.count == 1 })
        let failure = String(describing: pair.hostLog.snapshot.resourcesFinished.first?.3 as Any)
        #expect(failure.contains("the receiver's disk is full"), "\(failure)")
        #expect(eventually(5) { scratch.contents().isEmpty }, "the partial file is gone")
        #expect(pair.host.statistics.peerFaults == 0 && pair.host.state(of: pair.guestPeer) == .connected)
    }

    @Test("A stream writer that sends past the reader's window is cut off; the reader sees the stream fail")
    func streamPastTheWindow() throws {
        let pair = try Pair()
        let chunk = [UInt8](repeating: 1, count: StreamFrame.maximumData)
        inject([.stream(.open(id: 1, name: "flood"))] + (0..<5).map { _ in .stream(.data(id: 1, bytes: chunk)) },
               from: pair.guest, to: pair.hostPeer)
        #expect(pair.hostLog.wait(5) { $0.streams.count == 1 })
        #expect(eventually(5) { pair.host.statistics.peerFaults == 1 })
        #expect(eventually(5) { pair.host.state(of: pair.guestPeer) == .notConnected })
        let input = try #require(pair.hostLog.snapshot.streams.first?.2)
        var got = 0
        var failure: PeerMeshError?
        do throws(PeerMeshError) {
            while let d = try input.read(timeout: .seconds(5)) { got += d.count }
        } catch { failure = error }
        #expect(got <= StreamFrame.window, "no more than one window was ever buffered (\(got) bytes)")
        guard case .notConnected? = failure else { Issue.record("reader saw \(String(describing: failure))"); return }
    }

    @Test("A member that pushes introductions nobody asked for is cut off, and nobody connects anywhere")
    func unsolicitedIntroductionData() throws {
        let pair = try Pair()
        inject([.mesh(.introData(forIdentity: 42, data: [1, 2, 3]))], from: pair.guest, to: pair.hostPeer)
        #expect(eventually(5) { pair.host.statistics.peerFaults == 1 })
        #expect(eventually(5) { pair.host.connectedPeers.isEmpty })
    }

    /// Listeners at 16 loopback addresses on one port that take connections and never answer, and introductions to
    /// them: what an introducing member can have a host connect to.
    private final class SilentAddresses {
        let port = freePort()
        let addresses = (3...18).map { "127.0.0.\($0)" }
        private let listeners: [FileDescriptor]
        private var accepted: [FileDescriptor] = []  // kept open: a close would answer the connection

        init() throws {
            let port = self.port
            listeners = try addresses.map { try FileDescriptor.tcpListener(try #require(SocketAddress(numericHost: $0, port: port))) }
        }

        deinit { for fd in listeners + accepted { fd.close() } }

        /// Connections made to any of them so far.
        func connectionsMade() -> Int {
            for l in listeners { while let (c, _) = try? l.accept() { accepted.append(c) } }
            return accepted.count
        }

        /// MESH_INTRODUCEs of `strangers` to `host`, each listing the 16 addresses.
        func introduce(_ strangers: [PeerID], to host: PeerID) -> [ControlFrame] {
            strangers.enumerated().map { i, stranger in
                let data = NearbyConnectionData(peer: stranger, forIdentity: host.identity,
                                                ticket: [UInt8](repeating: UInt8(i & 0xff), count: 16), port: port, addresses: addresses)
                return .mesh(.introduce(peer: stranger, data: data.encoded()))
            }
        }
    }

    @Test("Three members that introduce one stranger without end: 16 connections each, 32 in all, each to its first address, and none further once they left")
    func introductionFlood() throws {
        let pair = try Pair()
        let (second, third) = (try pair.join(as: "second"), try pair.join(as: "third"))
        for j in [second, third] { #expect(j.log.wait(5) { $0.states.contains { $0.0 == pair.hostPeer && $0.1 == .connected } }) }
        let silent = try SilentAddresses()
        let inFlight = { pair.host.core.loop.submitAndWait { pair.host.core.io.value.attempts.count } }
        // One stranger, 100 times from each: one place of the peer limit; a member may have us follow 16 of them.
        let stranger = try PeerIdentity.generate(displayName: "stranger").peerID
        let flood = silent.introduce(Array(repeating: stranger, count: 100), to: pair.hostPeer)
        injectFrames(flood, from: pair.guest, to: pair.hostPeer)
        #expect(eventually(5) { silent.connectionsMade() >= 16 })
        usleep(300_000)
        #expect(silent.connectionsMade() == 16, "16 connections, each to an introduction's first address")
        // A second member's share is its own; past two shares in all, the third's are not followed.
        injectFrames(flood, from: second.session, to: pair.hostPeer)
        #expect(eventually(5) { silent.connectionsMade() >= 32 })
        injectFrames(flood, from: third.session, to: pair.hostPeer)
        usleep(500_000)
        #expect(silent.connectionsMade() == 32, "32 in all")
        #expect(inFlight() == 32)
        // What was not followed takes none of the third member's share: each member counts only what it started.
        let shares = pair.host.core.loop.submitAndWait { pair.host.core.io.value.membership.expectedIntroductions.introducedBy }
        #expect(shares == [pair.guestPeer.identity: 16, second.peer.identity: 16], "\(shares)")
        // Each one not followed is counted: 84 past each of the first two shares, and all 100 of the third's.
        #expect(eventually(5) { pair.host.statistics.introductionsNotFollowed >= 268 })
        #expect(pair.host.statistics.introductionsNotFollowed == 268)
        // They leave before those time out (in 5 s): no introduction goes on to its second address.
        for s in [pair.guest, second.session, third.session] { s.disconnect() }
        #expect(eventually(10) { inFlight() == 0 })
        usleep(300_000)
        #expect(silent.connectionsMade() == 32, "no second address was tried")
        #expect(pair.host.connectedPeers.isEmpty)
        #expect(pair.host.statistics.peerFaults == 0, "introducing is no fault: following introductions is what is bounded")
    }

    @Test("Introduced strangers past the peer limit cost no connection")
    func introductionsPastThePeerLimit() throws {
        let pair = try Pair()
        let second = try pair.join(as: "second")
        #expect(second.log.wait(5) { $0.states.contains { $0.0 == pair.hostPeer && $0.1 == .connected } })
        let silent = try SilentAddresses()
        // The limit is 8 peers: the host, two members, and room for 5 strangers connecting.
        let strangers = try (0..<50).map { try PeerIdentity.generate(displayName: "s\($0)").peerID }
        injectFrames(silent.introduce(strangers, to: pair.hostPeer), from: second.session, to: pair.hostPeer)
        #expect(eventually(5) { silent.connectionsMade() >= 5 })
        usleep(500_000)
        #expect(silent.connectionsMade() == 5, "one connection per place")
        #expect(pair.host.core.loop.submitAndWait { pair.host.core.io.value.attempts.count } == 5)
        #expect(pair.hostLog.snapshot.failures.isEmpty, "those without room were not tried, so nothing failed")
        #expect(pair.host.statistics.introductionsNotFollowed == 45, "but each was counted")
        withExtendedLifetime(silent) {}
    }

    @Test("A peer that sends more bytes than it announced is cut off, and nothing of it stays on disk")
    func moreBytesThanAnnounced() throws {
        let scratch = try Scratch("liar")
        let pair = try Pair(hostConfig: Session.Configuration(resourceDirectory: scratch.path))
        inject([.start(id: 1, size: 10, name: "x"), .chunk(id: 1, bytes: [UInt8](repeating: 1, count: 8)),
                .chunk(id: 1, bytes: [UInt8](repeating: 1, count: 8))], from: pair.guest, to: pair.hostPeer)
        #expect(pair.hostLog.wait(5) { $0.resourcesFinished.count == 1 })
        #expect(eventually(5) { pair.host.statistics.peerFaults == 1 })
        #expect(eventually(5) { pair.host.state(of: pair.guestPeer) == .notConnected })
        #expect(pair.hostLog.snapshot.resourcesFinished.first?.2 == nil)
        #expect(scratch.contents().isEmpty)
    }

    @Test("A flood of transfer starts is refused and then cut off; the host's memory and disk stay bounded")
    func floodOfStarts() throws {
        let scratch = try Scratch("flood")
        var config = Session.Configuration(resourceDirectory: scratch.path)
        config.freeSpace = { _ in 1 << 40 }  // whatever the disk here has free
        let pair = try Pair(hostConfig: config)
        inject((1...2_000).map { .start(id: UInt32($0), size: 1 << 20, name: "f\($0)") }, from: pair.guest, to: pair.hostPeer)
        #expect(eventually(5) { pair.host.statistics.peerFaults == 1 })
        #expect(eventually(5) { pair.host.state(of: pair.guestPeer) == .notConnected })
        // Eight were accepted (and told to the app), then failed when the link was cut; none left a directory.
        #expect(pair.hostLog.wait(5) { $0.resourcesFinished.count == 8 })
        #expect(pair.hostLog.snapshot.resourcesStarted.count == 8)
        #expect(eventually(5) { scratch.contents().isEmpty })
        let counts = pair.host.core.loop.submitAndWait { pair.host.core.io.value.resources.counts }
        #expect(counts == (0, 0))
    }
}
