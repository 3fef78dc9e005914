import Foundation
import Testing
import Synchronization
import MeshPOSIX
import MeshTestSupport
@testable import PeerMesh

@Suite("Byte stream state machine")
struct StreamStateMachineTests {
    let peer = try! PeerID(displayName: "peer")
    let link: LinkID = 3
    let window = StreamFrame.window

    @Test func creditFlowsBackAsTheReaderConsumes() {
        var writer = StreamStateMachine(), reader = StreamStateMachine()
        let (key, opened) = writer.open(on: link, name: "mic")
        #expect(opened == [.send(link, .open(id: 1, name: "mic")), .credit(key, window)])
        #expect(reader.received(.open(id: 1, name: "mic"), on: link, from: peer) == [.opened(key, peer, name: "mic")])
        // The writer spends its whole window; the reader takes it all in.
        for _ in 0..<4 {
            #expect(writer.write(65_536, on: key).isEmpty)
            #expect(reader.received(.data(id: 1, bytes: [UInt8](repeating: 7, count: 65_536)), on: link, from: peer).count == 1)
        }
        // One byte more than the window is a fault.
        #expect(reader.received(.data(id: 1, bytes: [1]), on: link, from: peer) == [.fault(link, .unexpectedFrame("stream 1 sent past its window"))])
        // Consuming less than half a window credits nothing yet; reaching half sends it all.
        var reader2 = StreamStateMachine()
        _ = reader2.received(.open(id: 1, name: "mic"), on: link, from: peer)
        #expect(reader2.consumed(100_000, of: key).isEmpty)
        #expect(reader2.consumed(31_072, of: key) == [.send(link, .credit(id: 1, bytes: 131_072))])
        #expect(writer.received(.credit(id: 1, bytes: 131_072), on: link, from: peer) == [.credit(key, 131_072)])
        #expect(writer.received(.credit(id: 1, bytes: 131_073), on: link, from: peer)
            == [.fault(link, .unexpectedFrame("stream 1 credited past its window"))])
    }

    @Test func theWriterClosingEndsTheReaderCleanly() {
        var writer = StreamStateMachine(), reader = StreamStateMachine()
        let (key, _) = writer.open(on: link, name: "s")
        _ = reader.received(.open(id: key.id, name: "s"), on: link, from: peer)
        let close = writer.closeWriter(key, .finished)
        #expect(close == [.send(link, .close(id: key.id, byWriter: true, .finished))])
        #expect(reader.received(.close(id: key.id, byWriter: true, .finished), on: link, from: peer) == [.readerEnded(key, nil)])
        #expect(writer.counts == (0, 0) && reader.counts == (0, 0))
        #expect(writer.received(.credit(id: key.id, bytes: 10), on: link, from: peer).isEmpty, "a CREDIT may cross our CLOSE")
    }

    @Test func theReaderClosingStopsTheWriterAndTheIdIsRetired() {
        var writer = StreamStateMachine(), reader = StreamStateMachine()
        let (key, _) = writer.open(on: link, name: "s")
        _ = reader.received(.open(id: key.id, name: "s"), on: link, from: peer)
        let close = reader.closeReader(key)
        #expect(close.first == .send(link, .close(id: key.id, byWriter: false, .cancelled)))
        #expect(reader.received(.data(id: key.id, bytes: [1, 2]), on: link, from: peer).isEmpty, "data in flight is dropped")
        let ack = writer.received(.close(id: key.id, byWriter: false, .cancelled), on: link, from: peer)
        #expect(ack == [.send(link, .close(id: key.id, byWriter: true, .cancelled)), .writerEnded(key, .cancelled("the reader closed the stream"))])
        #expect(reader.received(.close(id: key.id, byWriter: true, .cancelled), on: link, from: peer).isEmpty)
        #expect(writer.counts == (0, 0) && reader.counts == (0, 0))
    }

    @Test func framesForStreamsThatAreNotOpenAreFaults() {
        var m = StreamStateMachine()
        guard case .fault? = m.received(.data(id: 4, bytes: [1]), on: link, from: peer).first else { Issue.record("no fault"); return }
        _ = m.received(.open(id: 4, name: "a"), on: link, from: peer)
        #expect(m.received(.open(id: 4, name: "a"), on: link, from: peer) == [.fault(link, .unexpectedFrame("a second STREAM_OPEN for stream 4"))])
        #expect(m.received(.close(id: 99, byWriter: true, .finished), on: link, from: peer).isEmpty)
    }

    @Test func streamsTheAppClosesButTheWriterNeverClosesAreBounded() {
        // Our app closes every stream the moment it opens (as the default delegate does); the writer never answers
        // those CLOSEs and keeps opening new ones, never more than one open at a time: cut off at 64, the table no larger.
        var m = StreamStateMachine()
        var faultedAt: UInt32?
        for id in UInt32(1)...500 {
            if case .fault? = m.received(.open(id: id, name: "s"), on: link, from: peer).first {
                faultedAt = id
                break
            }
            _ = m.closeReader(StreamKey(link: link, id: id))
        }
        #expect(faultedAt == 65)
        #expect(m.counts.incoming == 64)
        #expect(m.linkClosed(link).isEmpty, "nothing live: every one was already closed")
        #expect(m.counts == (0, 0))
    }

    @Test func aFloodOfStreamsIsRefusedThenFaulted() {
        var m = StreamStateMachine()
        for id in UInt32(1)...16 { #expect(m.received(.open(id: id, name: "s"), on: link, from: peer).count == 1) }
        #expect(m.received(.open(id: 17, name: "s"), on: link, from: peer) == [.send(link, .close(id: 17, byWriter: false, .refused))])
        var last: [StreamStateMachine.Action] = []
        for id in UInt32(18)..<UInt32(18 + 64) { last = m.received(.open(id: id, name: "s"), on: link, from: peer) }
        guard case .fault? = last.first else { Issue.record("no fault: \(last)"); return }
        #expect(m.counts.incoming == 16 + 64)
        #expect(m.linkClosed(link).count == 16)
        #expect(m.counts == (0, 0))
    }
}

@Suite("Byte streams over real sockets on 127.0.0.1, encrypted", .serialized)
struct StreamIntegrationTests {
    /// Opens a stream named `name` from the pair's guest to its host; both ends.
    private func open(_ pair: Pair, _ name: String) throws -> (OutputByteStream, InputByteStream) {
        let out = try pair.guest.startStream(withName: name, toPeer: pair.hostPeer)
        #expect(pair.hostLog.wait(5) { $0.streams.count == 1 })
        return (out, try #require(pair.hostLog.snapshot.streams.first?.2))
    }

    /// Reads `stream` to its end on this thread, `chunk` bytes at most per read.
    private func readAll(_ stream: InputByteStream, chunk: Int) throws -> [UInt8] {
        var out: [UInt8] = []
        while let d = try stream.read(maxLength: chunk, timeout: .seconds(10)) { out += d }
        return out
    }

    @Test("100 MB through a stream arrive in order, exactly once, then the end of the stream")
    func bytesArriveInOrder() throws {
        let pair = try Pair()
        let out = try pair.guest.startStream(withName: "mic", toPeer: pair.hostPeer)
        #expect(pair.hostLog.wait(5) { $0.streams.count == 1 })
        let (peer, name, input) = pair.hostLog.snapshot.streams[0]
        #expect(peer == pair.guestPeer && name == "mic" && input.name == "mic")
        var rng = SeededRandom(seed: 5)
        var bytes = [UInt8](repeating: 0, count: 100_000_000)
        bytes.withUnsafeMutableBytes { raw in
            let words = raw.bindMemory(to: UInt64.self)
            for i in words.indices { words[i] = rng.next() }
        }
        let sent = bytes
        let writer = Thread {
            var at = 0
            var sizes = SeededRandom(seed: 9)
            while at < sent.count {
                let n = min(sent.count - at, Int(sizes.next() % 200_000) + 1)
                try? out.write(Data(sent[at..<(at + n)]))
                at += n
            }
            out.close()
        }
        writer.start()
        let received = try readAll(input, chunk: 10_007)
        #expect(received.count == sent.count)
        #expect(received == sent)
        #expect(try input.read() == nil, "the end stays the end")
        #expect(pair.host.statistics.peerFaults == 0)
    }

    @Test("A reader that does not read holds the writer back to one window; reading lets it finish")
    func backpressureHolds() throws {
        let pair = try Pair()
        let (out, input) = try open(pair, "slow")
        let written = Mutex(0)
        let finished = Mutex(false)
        let writer = Thread {
            for _ in 0..<32 {
                do { try out.write(Data(repeating: 1, count: 65_536), timeout: .seconds(20)) } catch { return }
                written.withLock { $0 += 65_536 }
            }
            out.close()
            finished.withLock { $0 = true }
        }
        writer.start()
        usleep(500_000)
        let ahead = written.withLock { $0 }
        #expect(ahead <= StreamFrame.window, "the writer ran \(ahead) bytes ahead")
        #expect(!finished.withLock { $0 })
        let received = try readAll(input, chunk: 65_536)
        #expect(received.count == 32 * 65_536)
        #expect(eventually(5) { finished.withLock { $0 } })
    }

    @Test("The reader closing makes the writer's next write fail; the link stays up")
    func readerCloses() throws {
        let pair = try Pair()
        let (out, input) = try open(pair, "s")
        try out.write(Data("hello".utf8))
        #expect(try input.read() == Data("hello".utf8))
        input.close()
        #expect(throws: PeerMeshError.self) { try input.read() }
        var failure: PeerMeshError?
        #expect(eventually(5) {
            do throws(PeerMeshError) { try out.write(Data([1]), timeout: .seconds(1)); return false } catch { failure = error; return true }
        })
        guard case .cancelled? = failure else { Issue.record("writer saw \(String(describing: failure))"); return }
        #expect(out.isClosed)
        try pair.host.send(Data("still here".utf8), toPeers: [pair.guestPeer], with: .reliable)
        #expect(pair.guestLog.wait(5) { $0.reliable.contains { $0.1 == Data("still here".utf8) } })
    }

    @Test("A link that goes ends both ends with notConnected; a stream nobody takes is closed for the writer")
    func linkLossAndUnhandled() throws {
        let pair = try Pair()
        let (out, input) = try open(pair, "s")
        pair.guest.disconnect()
        #expect { _ = try input.read(timeout: .seconds(5)) } throws: { e in
            if case PeerMeshError.notConnected = e { true } else { false }
        }
        #expect(eventually(5) { out.isClosed })
        #expect(throws: PeerMeshError.self) { try out.write(Data([1])) }
        #expect(throws: PeerMeshError.self) { _ = try pair.guest.startStream(withName: "s", toPeer: pair.hostPeer) }
        #expect(throws: PeerMeshError.self) { _ = try pair.guest.startStream(withName: "", toPeer: pair.hostPeer) }

        // A delegate that does not implement didReceive stream: the default closes it, and the writer learns.
        final class Plain: SessionDelegate, Sendable {
            func session(_ session: Session, peer: PeerID, didChange state: SessionState) {}
        }
        let other = try Pair()
        let plain = Plain()
        other.host.delegate = plain
        let unwanted = try other.guest.startStream(withName: "x", toPeer: other.hostPeer)
        #expect(eventually(5) { unwanted.isClosed })
        withExtendedLifetime(plain) {}
    }
}
