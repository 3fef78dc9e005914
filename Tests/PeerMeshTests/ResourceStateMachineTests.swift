import Testing
@testable import PeerMesh

/// The resource-transfer protocol, with no sockets and no files: both sides' machines, and peers that lie.
@Suite("Resource transfer state machine")
struct ResourceStateMachineTests {
    let peer = try! PeerID(displayName: "peer")
    let link: LinkID = 7

    /// Runs one transfer of `size` bytes from `sender` to `receiver`, sending in `chunk`-byte pieces; returns every
    /// action each side produced.
    func transfer(size: UInt64, chunk: Int, hashMatches: Bool = true)
        -> (sent: [ResourceStateMachine.Action], received: [ResourceStateMachine.Action]) {
        var sender = ResourceStateMachine(), receiver = ResourceStateMachine()
        var sent: [ResourceStateMachine.Action] = [], received: [ResourceStateMachine.Action] = []
        func deliver(_ actions: [ResourceStateMachine.Action]) {
            for case .send(_, let frame) in actions {
                let answer = receiver.received(frame, on: link, from: peer)
                received += answer
                for case .verify(let key, _) in answer {
                    let verdict = receiver.verified(key, outcome: hashMatches ? .delivered : .hashMismatch, text: "")
                    received += verdict
                    for case .send(_, let reply) in verdict { sent += sender.received(reply, on: link, from: peer) }
                }
            }
        }
        let (key, first) = sender.begin(on: link, size: size, name: "song.wav")
        sent += first
        deliver(first)
        if first.contains(.sendEnd(key)) { deliver([.send(link, .end(id: key.id, sha256: [UInt8](repeating: 0, count: 32)))]) }
        while let left = sender.remaining(key), left > 0 {
            let n = Int(min(left, UInt64(chunk)))
            deliver([.send(link, .chunk(id: key.id, bytes: [UInt8](repeating: 1, count: n)))])
            let after = sender.sent(n, of: key)
            sent += after
            if after.contains(.sendEnd(key)) { deliver([.send(link, .end(id: key.id, sha256: [UInt8](repeating: 0, count: 32)))]) }
        }
        #expect(sender.counts == (0, 0) && receiver.counts == (0, 0), "nothing is left in flight")
        return (sent, received)
    }

    @Test func aTransferRunsStartChunksEndVerifiedAndCompletes() {
        let key = ResourceKey(link: link, id: 1)
        let (sent, received) = transfer(size: 200_000, chunk: 65_536)
        #expect(sent.first == .send(link, .start(id: 1, size: 200_000, name: "song.wav")))
        #expect(sent.contains(.pump(link)))
        #expect(sent.last == .complete(key, nil))
        #expect(received.first == .open(key, peer, name: "song.wav", size: 200_000))
        let writes = received.compactMap { if case .write(_, let b) = $0 { b.count } else { nil } }
        #expect(writes == [65_536, 65_536, 65_536, 3_392])
        #expect(received.suffix(2) == [.send(link, .result(id: 1, .delivered, "")), .deliver(key)])
    }

    @Test func anEmptyResourceStillStartsEndsAndIsVerified() {
        let (sent, received) = transfer(size: 0, chunk: 1)
        let key = ResourceKey(link: link, id: 1)
        #expect(sent.contains(.sendEnd(key)) && !sent.contains(.pump(link)))
        #expect(sent.last == .complete(key, nil))
        #expect(received.last == .deliver(key))
    }

    @Test func aHashMismatchIsDiscardedAndTheSenderTold() {
        let key = ResourceKey(link: link, id: 1)
        let (sent, received) = transfer(size: 1_000, chunk: 300, hashMatches: false)
        #expect(received.last == .discard(key, .resource("the received bytes do not match the sender's SHA-256")))
        guard case .complete(key, .resource(let text)?) = sent.last else { Issue.record("sender not told: \(sent)"); return }
        #expect(text.contains("SHA-256"))
    }

    @Test func morePiecesThanAnnouncedOrAnEarlyEndAreFaults() {
        var m = ResourceStateMachine()
        _ = m.received(.start(id: 3, size: 10, name: "x"), on: link, from: peer)
        #expect(m.received(.chunk(id: 3, bytes: [UInt8](repeating: 0, count: 6)), on: link, from: peer).count == 1)
        let over = m.received(.chunk(id: 3, bytes: [UInt8](repeating: 0, count: 5)), on: link, from: peer)
        guard case .fault(link, .unexpectedFrame(let why))? = over.first else { Issue.record("\(over)"); return }
        #expect(why.contains("more bytes than the 10"))

        var early = ResourceStateMachine()
        _ = early.received(.start(id: 3, size: 10, name: "x"), on: link, from: peer)
        _ = early.received(.chunk(id: 3, bytes: [1, 2, 3]), on: link, from: peer)
        #expect(early.received(.end(id: 3, sha256: [UInt8](repeating: 0, count: 32)), on: link, from: peer)
            == [.fault(link, .unexpectedFrame("RESOURCE_END after 3 of 10 bytes"))])
    }

    @Test func framesForTransfersThatNeverStartedAreFaultsButLateCancelsAreNot() {
        var m = ResourceStateMachine()
        #expect(m.received(.chunk(id: 9, bytes: [1]), on: link, from: peer).first.map { if case .fault = $0 { true } else { false } } == true)
        #expect(m.received(.end(id: 9, sha256: [UInt8](repeating: 0, count: 32)), on: link, from: peer).count == 1)
        #expect(m.received(.cancel(id: 9), on: link, from: peer).isEmpty, "a CANCEL may cross our RESULT")
        #expect(m.received(.result(id: 9, .delivered, ""), on: link, from: peer).isEmpty, "a RESULT may cross our CANCEL")
        _ = m.received(.start(id: 1, size: 5, name: "a"), on: link, from: peer)
        #expect(m.received(.start(id: 1, size: 5, name: "a"), on: link, from: peer)
            == [.fault(link, .unexpectedFrame("a second RESOURCE_START for transfer 1"))])
    }

    @Test func aFloodOfTransfersIsRefusedThenFaultedAndStaysBounded() {
        var m = ResourceStateMachine()
        for id in UInt32(1)...8 {
            #expect(m.received(.start(id: id, size: 100, name: "f\(id)"), on: link, from: peer).count == 1)
        }
        // The ninth is refused; its chunks are dropped until the sender closes the id.
        guard case .send(link, .result(9, .refused, _))? = m.received(.start(id: 9, size: 100, name: "f9"), on: link, from: peer).first
        else { Issue.record("ninth not refused"); return }
        #expect(m.received(.chunk(id: 9, bytes: [1, 2]), on: link, from: peer).isEmpty)
        #expect(m.received(.cancel(id: 9), on: link, from: peer).isEmpty)
        #expect(m.counts.incoming == 8, "the refused id is retired")
        // A peer that ignores the refusals is cut off once it has 64 of them open.
        var last: [ResourceStateMachine.Action] = []
        for id in UInt32(100)..<UInt32(100 + 65) { last = m.received(.start(id: id, size: 1, name: "z"), on: link, from: peer) }
        guard case .fault? = last.first else { Issue.record("no fault after 64 refusals: \(last)"); return }
        #expect(m.counts.incoming == 8 + 64)
        #expect(m.linkClosed(link).count == 8, "only the live transfers are reported when the link closes")
        #expect(m.counts == (0, 0))
    }

    @Test func transfersTheAppCancelsButTheSenderNeverClosesAreBounded() {
        // Our app cancels every transfer the moment it starts; the sender never closes those ids and keeps starting
        // new ones (each well within the in-progress limit): cut off at 64, the table no larger.
        var m = ResourceStateMachine()
        var faultedAt: UInt32?
        for id in UInt32(1)...500 {
            if case .fault? = m.received(.start(id: id, size: 100, name: "f"), on: link, from: peer).first {
                faultedAt = id
                break
            }
            _ = m.cancelIncoming(ResourceKey(link: link, id: id), outcome: .cancelled, text: "")
        }
        #expect(faultedAt == 65)
        #expect(m.counts.incoming == 64)
        #expect(m.linkClosed(link).isEmpty, "nothing live: every one was already discarded")
        #expect(m.counts == (0, 0))
    }

    @Test func tooLargeIsRefused() {
        var limits = ResourceStateMachine.Limits()
        limits.maximumSize = 1_000
        var m = ResourceStateMachine(limits: limits)
        guard case .send(_, .result(1, .refused, let why))? = m.received(.start(id: 1, size: 1_001, name: "big"), on: link, from: peer).first
        else { Issue.record("not refused"); return }
        #expect(why.contains("larger than the 1000 bytes"))
    }

    @Test("A limit of 0 takes no resource, an empty one included: refused, no file opened")
    func aLimitOfZeroTakesNone() {
        var limits = ResourceStateMachine.Limits()
        limits.maximumSize = 0
        var m = ResourceStateMachine(limits: limits)
        for (id, size) in [(UInt32(1), UInt64(0)), (2, 1)] {
            let actions = m.received(.start(id: id, size: size, name: "empty"), on: link, from: peer)
            #expect(actions == [.send(link, .result(id: id, .refused, "this peer takes no resources"))], "\(actions)")
            #expect(m.received(.end(id: id, sha256: [UInt8](repeating: 0, count: 32)), on: link, from: peer).isEmpty,
                    "its END opens and delivers nothing")
        }
        #expect(m.counts == (0, 0))
    }

    @Test("A name that hides something (a bidi override) is refused, not a fault: its chunks are dropped until the sender closes the id")
    func aNameThatHidesSomethingIsRefused() {
        var m = ResourceStateMachine()
        guard case .send(_, .result(1, .refused, let why))? = m.received(.start(id: 1, size: 10, name: "invoice\u{202e}fdp.exe"), on: link, from: peer).first
        else { Issue.record("not refused"); return }
        #expect(why == "its name holds control or invisible characters")
        #expect(m.received(.chunk(id: 1, bytes: [1, 2]), on: link, from: peer).isEmpty)
        #expect(m.received(.cancel(id: 1), on: link, from: peer).isEmpty)
        #expect(m.counts == (0, 0))
    }

    @Test func theReceiverCancellingMidwayMakesTheSenderCloseTheId() {
        var sender = ResourceStateMachine(), receiver = ResourceStateMachine()
        let (key, _) = sender.begin(on: link, size: 1_000, name: "a")
        _ = receiver.received(.start(id: key.id, size: 1_000, name: "a"), on: link, from: peer)
        _ = receiver.received(.chunk(id: key.id, bytes: [UInt8](repeating: 0, count: 100)), on: link, from: peer)
        _ = sender.sent(100, of: key)
        let cancel = receiver.cancelIncoming(key, outcome: .cancelled, text: "")
        #expect(cancel == [.send(link, .result(id: key.id, .cancelled, "")),
                           .discard(key, .cancelled("the resource transfer was cancelled"))])
        // Chunks already on the way are dropped, not faults.
        #expect(receiver.received(.chunk(id: key.id, bytes: [1]), on: link, from: peer).isEmpty)
        let answer = sender.received(.result(id: key.id, .cancelled, ""), on: link, from: peer)
        #expect(answer == [.send(link, .cancel(id: key.id)), .complete(key, .cancelled("the receiver cancelled the resource transfer"))])
        #expect(receiver.received(.cancel(id: key.id), on: link, from: peer).isEmpty)
        #expect(sender.counts == (0, 0) && receiver.counts == (0, 0))
    }

    @Test func theSenderCancellingMidwayDiscardsOnTheReceiver() {
        var sender = ResourceStateMachine(), receiver = ResourceStateMachine()
        let (key, _) = sender.begin(on: link, size: 1_000, name: "a")
        _ = receiver.received(.start(id: key.id, size: 1_000, name: "a"), on: link, from: peer)
        let actions = sender.cancelOutgoing(key, error: .cancelled("by app"))
        #expect(actions == [.send(link, .cancel(id: key.id)), .complete(key, .cancelled("by app"))])
        #expect(sender.cancelOutgoing(key, error: .cancelled("again")).isEmpty, "cancelling twice does nothing")
        #expect(receiver.received(.cancel(id: key.id), on: link, from: peer)
            == [.discard(key, .cancelled("the sender cancelled the resource transfer"))])
        #expect(sender.received(.result(id: key.id, .delivered, ""), on: link, from: peer).isEmpty)
    }

    @Test func aClosedLinkFailsEveryTransferOnItAndNoOther() {
        var m = ResourceStateMachine()
        let (a, _) = m.begin(on: 1, size: 10, name: "a")
        let (b, _) = m.begin(on: 2, size: 10, name: "b")
        _ = m.received(.start(id: 5, size: 10, name: "c"), on: 1, from: peer)
        let actions = m.linkClosed(1)
        #expect(actions == [.complete(a, .notConnected("the connection closed before the resource was delivered")),
                            .discard(ResourceKey(link: 1, id: 5), .notConnected("the connection closed before the resource arrived"))])
        #expect(m.remaining(b) == 10)
        #expect(m.sending(on: 2) == [b])
    }

    @Test func aDeliveredResultBeforeTheLastByteIsAFault() {
        var m = ResourceStateMachine()
        let (key, _) = m.begin(on: link, size: 10, name: "a")
        #expect(m.received(.result(id: key.id, .delivered, ""), on: link, from: peer)
            == [.fault(link, .unexpectedFrame("RESOURCE_RESULT delivered before every byte was sent"))])
    }
}
