import Testing
import MeshTestSupport
@testable import PeerMesh

private let alice = try! PeerID(displayName: "alice")
private let bob = try! PeerID(displayName: "bob")

/// Two channels joined back to back, with the bytes each writes handed to the other.
private struct Wire {
    var initiator: SecureChannel
    var responder: SecureChannel
    var toResponder: [[UInt8]] = []
    var toInitiator: [[UInt8]] = []
    var initiatorSaw: [SecureChannel.Event] = []
    var responderSaw: [SecureChannel.Event] = []

    init(_ i: EncryptionPreference = .required, _ r: EncryptionPreference = .required) {
        initiator = SecureChannel(configuration: .init(role: .initiator, preference: i, localPeer: alice))
        responder = SecureChannel(configuration: .init(role: .responder, preference: r, localPeer: bob))
    }

    mutating func collect(_ events: [SecureChannel.Event], fromInitiator: Bool) {
        for e in events {
            if case .write(let b) = e {
                if fromInitiator { toResponder.append(b) } else { toInitiator.append(b) }
            } else if fromInitiator {
                initiatorSaw.append(e)
            } else {
                responderSaw.append(e)
            }
        }
    }

    /// Delivers everything written so far, both ways, until quiet.
    mutating func pump(approve: Bool = true) {
        var rounds = 0
        while (!toResponder.isEmpty || !toInitiator.isEmpty) && rounds < 20 {
            rounds += 1
            for b in toResponder { collect(b.withUnsafeBytes { responder.received($0) }, fromInitiator: false) }
            toResponder = []
            for b in toInitiator { collect(b.withUnsafeBytes { initiator.received($0) }, fromInitiator: true) }
            toInitiator = []
            if approve, initiatorSaw.contains(where: { if case .needsApproval = $0 { true } else { false } }),
               !initiator.isOpen {
                collect(initiator.approve(), fromInitiator: true)
            }
        }
    }

    mutating func start() { collect(initiator.start(), fromInitiator: true) }

    mutating func sendFromInitiator(_ f: ControlFrame) { toResponder.append(initiator.send(f)) }
    mutating func sendFromResponder(_ f: ControlFrame) { toInitiator.append(responder.send(f)) }
}

private func frames(_ events: [SecureChannel.Event]) -> [ControlFrame] {
    events.compactMap { if case .frame(let f) = $0 { f } else { nil } }
}

private func faults(_ events: [SecureChannel.Event]) -> [PeerFault] {
    events.compactMap { if case .fault(let f) = $0 { f } else { nil } }
}

private let invite = ControlFrame.invite(.init(context: Array("ctx".utf8), timeoutMillis: 5_000, udpPort: 7, token: 9))

@Suite("SecureChannel: preamble, Noise XX, records (pure)")
struct SecureChannelTests {
    @Test func encryptedBothWaysWithProvenNames() throws {
        var w = Wire()
        w.sendFromResponder(.hello(peer: bob))   // swallowed: the handshake carries it
        w.start()
        w.sendFromInitiator(.hello(peer: alice))
        w.sendFromInitiator(invite)               // held until the handshake ends
        w.pump()
        // Each side learned the other's name and proven key from the handshake.
        guard case .hello(let seenBob)? = frames(w.initiatorSaw).first,
              case .hello(let seenAlice)? = frames(w.responderSaw).first else {
            Issue.record("no HELLO: \(w.initiatorSaw) \(w.responderSaw)"); return
        }
        #expect(seenBob == bob && seenBob.publicKey == bob.publicKey && seenBob.displayName == "bob")
        #expect(seenAlice == alice && seenAlice.publicKey == alice.publicKey)
        #expect(frames(w.responderSaw) == [.hello(peer: alice), invite])
        #expect(w.initiator.isEncrypted && w.responder.isEncrypted)
        #expect(w.initiator.shortAuthenticationString == w.responder.shortAuthenticationString)
        #expect(w.initiator.shortAuthenticationString?.count == 7)
        // A message bigger than one record crosses as several.
        let big = ControlFrame.data((0..<200_000).map { UInt8(truncatingIfNeeded: $0) })
        w.sendFromResponder(big)
        w.sendFromResponder(.heartbeat)
        w.pump()
        #expect(frames(w.initiatorSaw).suffix(2) == [big, .heartbeat])
        #expect(faults(w.initiatorSaw + w.responderSaw).isEmpty)
    }

    @Test func datagramKeysPairUp() {
        var w = Wire()
        w.start()
        w.pump()
        let i = w.initiator.datagramKeys!, r = w.responder.datagramKeys!
        #expect(i.send.bytes == r.receive.bytes && i.receive.bytes == r.send.bytes && i.send.bytes != i.receive.bytes)
    }

    @Test(arguments: [EncryptionPreference.required, .optional])
    func aPlaintextInitiatorIsRefusedByARequiredResponder(_ responder: EncryptionPreference) {
        var w = Wire(.none, responder)
        w.start()
        w.sendFromInitiator(.hello(peer: alice))
        w.pump()
        if responder == .required {
            #expect(faults(w.responderSaw) == [.downgrade], "the responder refuses and closes")
            #expect(w.initiatorSaw.contains(.refused(SecureChannel.Refusal.encryptionRequired.description)))
            #expect(frames(w.responderSaw).isEmpty, "nothing the initiator sent was taken as a frame")
        } else {
            #expect(frames(w.responderSaw) == [.hello(peer: alice)], "an optional responder takes plaintext")
            #expect(!w.responder.isEncrypted)
        }
    }

    @Test func anEncryptingInitiatorIsRefusedByAPlaintextOnlyResponder() {
        var w = Wire(.required, .none)
        w.start()
        w.pump()
        #expect(w.initiatorSaw.contains(.refused(SecureChannel.Refusal.encryptionUnsupported.description)))
    }

    @Test func aResponderThatAnswersInPlaintextIsADowngrade() {
        // A man in the middle (or a broken peer) answers an encrypted offer with a plaintext preamble.
        var i = SecureChannel(configuration: .init(role: .initiator, preference: .required, localPeer: alice))
        _ = i.start()
        let events = SecureChannel.preamble(0).withUnsafeBytes { i.received($0) }
        #expect(faults(events) == [.downgrade])
        #expect(!i.isOpen)
    }

    @Test func aTamperedOrTruncatedRecordIsCaughtAtEveryBytePosition() {
        var w = Wire()
        w.start()
        w.pump()
        let record = w.initiator.send(.data(Array("secret audio control".utf8)))
        for pos in 0..<record.count {
            var r = w.responder
            var bad = record
            bad[pos] ^= 0x20
            let events = bad.withUnsafeBytes { r.received($0) }
            #expect(frames(events).isEmpty, "byte \(pos)")
            if pos >= 2 { #expect(faults(events) == [.unauthentic], "byte \(pos)") }
        }
        // Truncated: never a frame; the rest of the record simply has not come yet.
        for n in 0..<record.count {
            var r = w.responder
            #expect(frames(Array(record.prefix(n)).withUnsafeBytes { r.received($0) }).isEmpty)
        }
        // The genuine record still opens.
        var r = w.responder
        #expect(frames(record.withUnsafeBytes { r.received($0) }) == [.data(Array("secret audio control".utf8))])
    }

    @Test func aReplayedRecordIsRefused() {
        var w = Wire()
        w.start()
        w.pump()
        let first = w.initiator.send(.data([1]))
        var r = w.responder
        #expect(frames(first.withUnsafeBytes { r.received($0) }) == [.data([1])])
        #expect(faults(first.withUnsafeBytes { r.received($0) }) == [.unauthentic], "the nonce moved on")
    }

    @Test func aReplayedHandshakeFromAnotherSessionFails() {
        // Record an initiator's messages 1 and 3 against one responder; replay them to a fresh responder.
        var w = Wire()
        w.start()
        let m1 = w.toResponder
        w.pump()
        var replay = SecureChannel(configuration: .init(role: .responder, preference: .required, localPeer: bob))
        var events: [SecureChannel.Event] = []
        for b in m1 { events += b.withUnsafeBytes { replay.received($0) } }
        // The fresh responder answered with a new ephemeral key; the old message 3 cannot match it.
        let oldThird = w.initiator.send(.heartbeat) // any later initiator bytes stand in for "what came next"
        events += oldThird.withUnsafeBytes { replay.received($0) }
        #expect(!faults(events).isEmpty)
        #expect(!replay.isEncrypted)
        #expect(frames(events).isEmpty)
    }

    /// What a responder made of a hand-driven initiator.
    private struct HandDriven {
        var responder: SecureChannel
        var events: [SecureChannel.Event]
        /// The handshake hash after message 2, as the initiator computed it (nil if message 2 never came).
        var hashAfterMessage2: [UInt8]?
    }

    /// Plays the initiator by hand, with the Noise handshake itself: message 1 carries `payload1` (an honest one
    /// carries the commitment), message 3 carries `payload3Prefix` and then alice's HELLO — as a man in the middle
    /// that searched for matching digits would have to. Returns what the responder made of it.
    private func handDrivenInitiator(payload1: [UInt8], payload3Prefix: [UInt8], withHello: Bool = true) throws -> HandDriven {
        var r = SecureChannel(configuration: .init(role: .responder, preference: .required, localPeer: bob))
        let pre = SecureChannel.preamble(SecureChannel.Mode.noiseXX.rawValue)
        var hs = Noise.XXHandshake(role: .initiator, localStatic: alice.keys!, prologue: pre)
        let m1 = try hs.writeMessage1(payload: payload1)
        var out = HandDriven(responder: r, events: [])
        out.events = (pre + [UInt8(m1.count >> 8), UInt8(m1.count & 0xff)] + m1).withUnsafeBytes { r.received($0) }
        let answer: [UInt8] = out.events.flatMap { e -> [UInt8] in if case .write(let b) = e { b } else { [] } }
        guard answer.count > SecureChannel.preambleSize + 2, faults(out.events).isEmpty else {
            out.responder = r
            return out
        }
        _ = try hs.readMessage2(Array(answer.dropFirst(SecureChannel.preambleSize + 2)))
        out.hashAfterMessage2 = hs.hash
        #expect(r.shortAuthenticationString == nil, "the responder has no digits before the nonce is opened")
        let hello = withHello ? Array(ControlFrame.hello(peer: alice).encoded().dropFirst(4)) : []
        let (m3, _) = try hs.writeMessage3(payload: payload3Prefix + hello)
        out.events += ([UInt8(m3.count >> 8), UInt8(m3.count & 0xff)] + m3).withUnsafeBytes { r.received($0) }
        out.responder = r
        return out
    }

    @Test func anInitiatorThatOpensTheNonceItCommittedToIsAdmitted() throws {
        let nonce = [UInt8](repeating: 0x5a, count: SecureChannel.nonceSize)
        let d = try handDrivenInitiator(payload1: SecureChannel.commitment(to: nonce), payload3Prefix: nonce)
        #expect(faults(d.events).isEmpty)
        #expect(frames(d.events) == [.hello(peer: alice)] && d.responder.isEncrypted)
        // The responder's digits are over the hash after message 2 and the opened nonce: not over the commitment
        // (which an eavesdropper and a man in the middle see in message 1), not over the final hash.
        let h2 = try #require(d.hashAfterMessage2)
        #expect(d.responder.shortAuthenticationString == SecureChannel.sas(hashAfterMessage2: h2, nonce: nonce))
    }

    @Test func anInitiatorThatOpensAnotherNonceIsRefused() throws {
        // What a man in the middle would need: commit to one nonce, then open whichever makes the digits match.
        let committed = [UInt8](repeating: 0x5a, count: SecureChannel.nonceSize)
        var other = committed
        other[31] ^= 1
        let d = try handDrivenInitiator(payload1: SecureChannel.commitment(to: committed), payload3Prefix: other)
        #expect(faults(d.events) == [.handshake("message 3's nonce does not open message 1's commitment")])
        #expect(frames(d.events).isEmpty && !d.responder.isEncrypted && !d.responder.isOpen)
        #expect(d.responder.shortAuthenticationString == nil, "no digits to show for a refused handshake")
    }

    @Test(arguments: [0, 31, 33, 64])
    func aMessage1WithoutA32ByteCommitmentIsRefused(_ size: Int) throws {
        // 0 bytes: a version-2 style message 1 behind a version-3 preamble.
        let d = try handDrivenInitiator(payload1: [UInt8](repeating: 1, count: size), payload3Prefix: [])
        #expect(faults(d.events) == [.handshake("message 1 carries \(size) bytes, not a 32-byte commitment")])
        #expect(d.hashAfterMessage2 == nil, "no message 2 was written")
        #expect(!d.responder.isOpen && d.responder.shortAuthenticationString == nil)
    }

    @Test func aMessage3WithoutTheNonceAndAHelloIsRefused() throws {
        let nonce = [UInt8](repeating: 0x5a, count: SecureChannel.nonceSize)
        // The nonce alone (no HELLO after it), then a short nonce with a HELLO that does not fit behind it.
        let alone = try handDrivenInitiator(payload1: SecureChannel.commitment(to: nonce), payload3Prefix: nonce, withHello: false)
        #expect(faults(alone.events) == [.handshake("message 3 carries 32 bytes, not a 32-byte nonce and a HELLO")])
        let short = try handDrivenInitiator(payload1: SecureChannel.commitment(to: nonce), payload3Prefix: Array(nonce.prefix(31)))
        #expect(faults(short.events).count == 1 && !short.responder.isOpen && frames(short.events).isEmpty)
    }

    @Test func aRealInitiatorCommitsInMessage1AndOpensInMessage3() throws {
        // Plays the responder by hand against a real initiator, and reads what it sends.
        var i = SecureChannel(configuration: .init(role: .initiator, preference: .required, localPeer: alice))
        let start: [UInt8] = i.start().flatMap { e -> [UInt8] in if case .write(let b) = e { b } else { [] } }
        let pre = Array(start.prefix(SecureChannel.preambleSize))
        var hs = Noise.XXHandshake(role: .responder, localStatic: bob.keys!, prologue: pre)
        let commitment = try hs.readMessage1(Array(start.dropFirst(SecureChannel.preambleSize + 2)))
        #expect(commitment.count == 32)
        let m2 = try hs.writeMessage2(payload: Array(ControlFrame.hello(peer: bob).encoded().dropFirst(4)))
        let h2 = hs.hash
        let events = (pre + [UInt8(m2.count >> 8), UInt8(m2.count & 0xff)] + m2).withUnsafeBytes { i.received($0) }
        #expect(events.contains(.needsApproval(bob)))
        let digitsBeforeApproval = try #require(i.shortAuthenticationString, "the inviter has its digits at message 2")
        let m3: [UInt8] = i.approve().flatMap { e -> [UInt8] in if case .write(let b) = e { b } else { [] } }
        let (payload, _) = try hs.readMessage3(Array(m3.dropFirst(2)))
        let nonce = Array(payload.prefix(32))
        #expect(SecureChannel.commitment(to: nonce) == commitment, "message 3 opens message 1's commitment")
        #expect(digitsBeforeApproval == SecureChannel.sas(hashAfterMessage2: h2, nonce: nonce))
        #expect(i.shortAuthenticationString == digitsBeforeApproval, "approval does not change them")
        // Each handshake draws its own nonce.
        var again = SecureChannel(configuration: .init(role: .initiator, preference: .required, localPeer: alice))
        let second: [UInt8] = again.start().flatMap { e -> [UInt8] in if case .write(let b) = e { b } else { [] } }
        #expect(second.suffix(32) != start.suffix(32), "another handshake, another commitment")
    }

    @Test func theDigitsTakeTheHandshakeAndTheNonce() {
        let h = [UInt8](repeating: 1, count: 32)
        let n1 = [UInt8](repeating: 2, count: 32), n2 = [UInt8](repeating: 3, count: 32)
        // Known answers, computed with Python's hashlib: SHA-256(label ‖ h ‖ n)[0..<4] big-endian mod 10⁶.
        #expect(SecureChannel.sas(hashAfterMessage2: h, nonce: n1) == "740 239")
        #expect(SecureChannel.commitment(to: n1).map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
                == "ae2944736bff7d84f19970ad7bcbfe6cfc1a82c1b16edc9f6e366095cfd514aa")
        #expect(SecureChannel.sas(hashAfterMessage2: h, nonce: n2) != "740 239", "the nonce, unknown at message 2, moves them")
        #expect(SecureChannel.sas(hashAfterMessage2: n2, nonce: n1) != "740 239")
        #expect(SecureChannel.commitment(to: n1) != SecureChannel.commitment(to: n2))
    }

    @Test func aPeerOfAnotherVersionIsToldThisBuildsVersion() {
        var r = SecureChannel(configuration: .init(role: .responder, preference: .required, localPeer: bob))
        let v2 = SecureChannel.magic + [2, 1, 0, 0]
        let events = v2.withUnsafeBytes { r.received($0) }
        #expect(faults(events) == [.malformedFrame("protocol version 2; this build speaks \(peerMeshProtocolVersion)")])
        // It answers with its own preamble (refused, reason 3) first, so that the other side can say which met.
        #expect(events.first == .write(SecureChannel.magic + [peerMeshProtocolVersion, 255, 3, 0]))
        #expect(!r.isOpen)
        // An initiator that meets a responder of another version says so.
        var i = SecureChannel(configuration: .init(role: .initiator, preference: .required, localPeer: alice))
        _ = i.start()
        let answer = SecureChannel.magic + [4, 255, 3, 0]
        #expect(faults(answer.withUnsafeBytes { i.received($0) })
                == [.malformedFrame("protocol version 4; this build speaks \(peerMeshProtocolVersion)")])
    }

    @Test func anUnknownPeerOrV1BytesAreFaultsNotFrames() {
        var r = SecureChannel(configuration: .init(role: .responder, preference: .required, localPeer: bob))
        // A v1 HELLO frame: its length prefix is not the preamble's magic.
        let v1 = ControlFrame.hello(peer: alice).encoded()
        #expect(faults(v1.withUnsafeBytes { r.received($0) }).count == 1)
        var r2 = SecureChannel(configuration: .init(role: .responder, preference: .required, localPeer: bob))
        let wrongVersion = SecureChannel.magic + [1, 1, 0, 0]
        #expect(faults(wrongVersion.withUnsafeBytes { r2.received($0) }).count == 1)
    }

    @Test func anOversizeHandshakeMessageIsRefusedBeforeItArrives() {
        var r = SecureChannel(configuration: .init(role: .responder, preference: .required, localPeer: bob))
        let events = (SecureChannel.preamble(1) + [0x04, 0x01]).withUnsafeBytes { r.received($0) } // 1025 bytes announced
        #expect(faults(events).count == 1, "\(events)")
    }

    @Test func noFrameBeforeTheHandshakeEndsAndNoHelloInsideIt() {
        var w = Wire()
        w.start()
        w.pump(approve: false)
        // The initiator waits for approval: its invitation is held, nothing reached the responder as a frame.
        w.sendFromInitiator(invite)
        w.pump(approve: false)
        #expect(frames(w.responderSaw).isEmpty)
        w.collect(w.initiator.approve(), fromInitiator: true)
        w.pump(approve: false)
        #expect(frames(w.responderSaw) == [.hello(peer: alice), invite])
        // A HELLO frame smuggled inside the encrypted stream is a fault.
        var raw = w.initiator
        let smuggled = raw.sendRawFrameForTests(.hello(peer: alice))
        var r = w.responder
        #expect(faults(smuggled.withUnsafeBytes { r.received($0) }) == [.unexpectedFrame("HELLO inside the encrypted channel")])
    }

    @Test func aResponderThatFloodsWhileItsKeyIsJudgedIsCutOff() {
        var w = Wire()
        w.start()
        w.pump(approve: false)
        #expect(w.initiatorSaw.contains { if case .needsApproval = $0 { true } else { false } })
        // Our app takes its time over the responder's key; the responder, which should send nothing until message 3,
        // sends 64 KiB at a time. The channel keeps no more than a handshake's worth and faults.
        var cut: [PeerFault] = []
        for _ in 0..<100 where cut.isEmpty {
            let chunk = [UInt8](repeating: 0x5a, count: 65_536)
            cut = faults(chunk.withUnsafeBytes { w.initiator.received($0) })
        }
        #expect(cut.count == 1)
        if case .handshake(let why)? = cut.first { #expect(why.contains("before the handshake finished")) } else {
            Issue.record("not a handshake fault: \(cut)")
        }
        #expect(w.initiator.approve().isEmpty, "nothing to approve on a closed channel")
        // A well-behaved responder's bytes never come near the limit: a whole handshake and records right behind it.
        var ok = Wire()
        ok.start()
        ok.pump()
        ok.sendFromResponder(.data([1]))
        ok.pump()
        #expect(faults(ok.initiatorSaw).isEmpty && frames(ok.initiatorSaw).contains(.data([1])))
    }

    @Test func aReadFullOfTinyRecordsDeliversEachFrameInOrder() {
        var w = Wire()
        w.start()
        w.pump()
        // 5,000 one-byte DATA frames, each its own record, arriving in one read.
        var burst: [UInt8] = []
        for i in 0..<5_000 { burst += w.responder.send(.data([UInt8(truncatingIfNeeded: i)])) }
        let events = burst.withUnsafeBytes { w.initiator.received($0) }
        #expect(faults(events).isEmpty)
        #expect(frames(events) == (0..<5_000).map { .data([UInt8(truncatingIfNeeded: $0)]) })
        // And a record split across reads is still put together.
        let split = w.responder.send(.data([7, 7]))
        #expect(frames(split.prefix(3).withUnsafeBytes { w.initiator.received($0) }).isEmpty)
        #expect(frames(split.dropFirst(3).withUnsafeBytes { w.initiator.received($0) }) == [.data([7, 7])])
    }

    @Test func randomBytesNeverTrapAndNeverMakeFrames() {
        var rng = SeededRandom(seed: 42)
        for _ in 0..<2_000 {
            var r = SecureChannel(configuration: .init(role: .responder, preference: .required, localPeer: bob))
            let n = Int(rng.next() % 200)
            var bytes = (0..<n).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
            if rng.next() % 2 == 0 { bytes = SecureChannel.preamble(1) + bytes }
            #expect(frames(bytes.withUnsafeBytes { r.received($0) }).isEmpty)
        }
    }
}

extension SecureChannel {
    /// Seals any frame, HELLO included, as a broken or malicious peer would.
    mutating func sendRawFrameForTests(_ f: ControlFrame) -> [UInt8] { seal(f.encoded()) }
}
