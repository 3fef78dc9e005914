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
    /// Every write of the initiator's, in order, delivered or not (what a recording attacker holds).
    var initiatorWrote: [[UInt8]] = []
    var initiatorSaw: [SecureChannel.Event] = []
    var responderSaw: [SecureChannel.Event] = []

    init(_ i: EncryptionPreference = .required, _ r: EncryptionPreference = .required) {
        initiator = SecureChannel(configuration: .init(role: .initiator, preference: i, localPeer: alice))
        responder = SecureChannel(configuration: .init(role: .responder, preference: r, localPeer: bob))
    }

    mutating func collect(_ events: [SecureChannel.Event], fromInitiator: Bool) {
        for e in events {
            if case .write(let b) = e {
                if fromInitiator {
                    toResponder.append(b)
                    initiatorWrote.append(b)
                } else {
                    toInitiator.append(b)
                }
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

    mutating func sendFromInitiator(_ f: ControlFrame) {
        let bytes = initiator.send(f)
        toResponder.append(bytes)
        initiatorWrote.append(bytes)
    }
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
        // The initiator has the digits once the responder opens its nonce (its owner does so when it asks its app).
        #expect(w.initiator.shortAuthenticationString == nil)
        w.toInitiator.append(w.responder.revealNonce())
        w.pump()
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
        // An attacker records everything an initiator sent one responder (preamble, message 1, message 3, a first
        // record) and replays it, byte for byte, to a fresh responder.
        var w = Wire()
        w.start()
        w.pump()
        w.sendFromInitiator(.data(Array("after the handshake".utf8)))
        w.pump()
        #expect(w.responderSaw.contains { if case .frame(.data) = $0 { true } else { false } }, "the recorded run worked")
        let recorded = w.initiatorWrote
        #expect(recorded.count >= 3)
        var replay = SecureChannel(configuration: .init(role: .responder, preference: .required, localPeer: bob))
        var events: [SecureChannel.Event] = []
        for b in recorded { events += b.withUnsafeBytes { replay.received($0) } }
        // The fresh responder answered message 1 with a new ephemeral key; the recorded message 3 was made for the
        // old one, so it does not authenticate, and nothing after it is read.
        #expect(faults(events).first == .handshake(Noise.Failure.decryptFailed.description), "\(faults(events))")
        #expect(!replay.isEncrypted && !replay.isOpen)
        #expect(frames(events).isEmpty)
    }

    /// What a responder made of a hand-driven initiator.
    private struct HandDriven {
        var responder: SecureChannel
        var events: [SecureChannel.Event]
        /// The handshake hash after message 2, as the initiator computed it (nil if message 2 never came).
        var hashAfterMessage2: [UInt8]?
        /// The responder's commitment, from message 2's payload.
        var responderCommitment: [UInt8]?
        /// The initiator's transport keys, once message 3 is written.
        var keys: Noise.Result?
        /// What the responder made of message 3 alone.
        var message3Events: [SecureChannel.Event] = []
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
        let (_, payload2) = try hs.readMessage2(Array(answer.dropFirst(SecureChannel.preambleSize + 2)))
        out.hashAfterMessage2 = hs.hash
        out.responderCommitment = Array(payload2.prefix(SecureChannel.nonceSize))
        #expect(r.shortAuthenticationString == nil, "the responder has no digits before the nonce is opened")
        let hello = withHello ? Array(ControlFrame.hello(peer: alice).encoded().dropFirst(4)) : []
        let (m3, keys) = try hs.writeMessage3(payload: payload3Prefix + hello)
        out.keys = keys
        out.message3Events = ([UInt8(m3.count >> 8), UInt8(m3.count & 0xff)] + m3).withUnsafeBytes { r.received($0) }
        out.events += out.message3Events
        out.responder = r
        return out
    }

    /// Opens one sealed record under `keys` (the hand-driven initiator's) and decodes the frame in it.
    private func openRecord(_ bytes: [UInt8], with cipher: inout Noise.CipherState) throws -> ControlFrame? {
        guard bytes.count > 2 else { return nil }
        let plain = try cipher.decrypt(ad: [], Array(bytes.dropFirst(2)))
        return try plain.dropFirst(4).withUnsafeBytes { ControlFrame.decode(body: $0) }.get()
    }

    @Test func anInitiatorThatOpensTheNonceItCommittedToIsAdmittedAndTheResponderOpensItsOwnOnlyWhenAsked() throws {
        let nonce = [UInt8](repeating: 0x5a, count: SecureChannel.nonceSize)
        var d = try handDrivenInitiator(payload1: SecureChannel.commitment(to: nonce, by: .initiator), payload3Prefix: nonce)
        #expect(faults(d.events).isEmpty)
        #expect(frames(d.events) == [.hello(peer: alice)] && d.responder.isEncrypted)
        // Message 3 gets no answer by itself: the responder's nonce waits for its owner (the app being asked).
        #expect(d.message3Events == [.frame(.hello(peer: alice))], "nothing written in answer to message 3")
        // The responder's nonce opens the commitment message 2 carried, and the digits are over the hash after
        // message 2 and both nonces: not over a commitment (which anyone on the path sees), not over the final hash.
        var cipher = try #require(d.keys).receive
        guard case .sasNonce(let responderNonce)? = try openRecord(d.responder.revealNonce(), with: &cipher) else {
            Issue.record("revealNonce did not send a SAS-NONCE"); return
        }
        #expect(SecureChannel.commitment(to: responderNonce, by: .responder) == d.responderCommitment)
        let h2 = try #require(d.hashAfterMessage2)
        #expect(d.responder.shortAuthenticationString
                == SecureChannel.sas(hashAfterMessage2: h2, initiatorNonce: nonce, responderNonce: responderNonce))
        #expect(d.responder.revealNonce().isEmpty, "the nonce is sent once")
    }

    @Test func eachResponderHandshakeDrawsItsOwnNonce() throws {
        // Two handshakes with the same responder key, the same initiator and the same initiator nonce: the responder's
        // commitments differ, and so do the nonces it opens (a fixed nonce would let a searcher predict the digits).
        let nonce = [UInt8](repeating: 0x5a, count: SecureChannel.nonceSize)
        var opened: [[UInt8]] = []
        var commitments: [[UInt8]] = []
        for _ in 0..<2 {
            var d = try handDrivenInitiator(payload1: SecureChannel.commitment(to: nonce, by: .initiator), payload3Prefix: nonce)
            commitments.append(try #require(d.responderCommitment))
            var cipher = try #require(d.keys).receive
            if case .sasNonce(let n)? = try openRecord(d.responder.revealNonce(), with: &cipher) { opened.append(n) }
        }
        #expect(commitments.count == 2 && commitments[0] != commitments[1])
        #expect(opened.count == 2 && opened[0] != opened[1])
    }

    @Test func anInitiatorThatOpensAnotherNonceIsRefused() throws {
        // What a man in the middle would need: commit to one nonce, then open whichever makes the digits match.
        let committed = [UInt8](repeating: 0x5a, count: SecureChannel.nonceSize)
        var other = committed
        other[31] ^= 1
        var d = try handDrivenInitiator(payload1: SecureChannel.commitment(to: committed, by: .initiator), payload3Prefix: other)
        #expect(faults(d.events) == [.handshake("message 3's nonce does not open message 1's commitment")])
        #expect(frames(d.events).isEmpty && !d.responder.isEncrypted && !d.responder.isOpen)
        #expect(d.responder.shortAuthenticationString == nil, "no digits to show for a refused handshake")
        #expect(d.responder.revealNonce().isEmpty, "and no nonce to give away")
    }

    @Test func aCommitmentReplayedAsTheOtherSidesDoesNotOpen() throws {
        // A man in the middle that sends an initiator's commitment back as its own cannot open it with the nonce it
        // is later shown: the role is part of what is committed to.
        let nonce = [UInt8](repeating: 0x5a, count: SecureChannel.nonceSize)
        #expect(SecureChannel.commitment(to: nonce, by: .initiator) != SecureChannel.commitment(to: nonce, by: .responder))
        let d = try handDrivenInitiator(payload1: SecureChannel.commitment(to: nonce, by: .responder), payload3Prefix: nonce)
        #expect(faults(d.events) == [.handshake("message 3's nonce does not open message 1's commitment")])
    }

    @Test(arguments: [0, 31, 33, 64])
    func aMessage1WithoutA32ByteCommitmentIsRefused(_ size: Int) throws {
        // 0 bytes: a version-2 style message 1 behind a current preamble.
        let d = try handDrivenInitiator(payload1: [UInt8](repeating: 1, count: size), payload3Prefix: [])
        #expect(faults(d.events) == [.handshake("message 1 carries \(size) bytes, not a 32-byte commitment")])
        #expect(d.hashAfterMessage2 == nil, "no message 2 was written")
        #expect(!d.responder.isOpen && d.responder.shortAuthenticationString == nil)
    }

    @Test func aMessage3WithoutTheNonceAndAHelloIsRefused() throws {
        let nonce = [UInt8](repeating: 0x5a, count: SecureChannel.nonceSize)
        let commitment = SecureChannel.commitment(to: nonce, by: .initiator)
        // The nonce alone (no HELLO after it), then a short nonce with a HELLO that does not fit behind it.
        let alone = try handDrivenInitiator(payload1: commitment, payload3Prefix: nonce, withHello: false)
        #expect(faults(alone.events) == [.handshake("message 3 carries 32 bytes, not a 32-byte nonce and a HELLO")])
        let short = try handDrivenInitiator(payload1: commitment, payload3Prefix: Array(nonce.prefix(31)))
        #expect(faults(short.events).count == 1 && !short.responder.isOpen && frames(short.events).isEmpty)
    }

    /// A real initiator, and a responder played by hand up to message 3: what the initiator sent, and what the
    /// hand-driven side needs to answer it.
    private struct HandDrivenResponder {
        var initiator: SecureChannel
        var noise: Noise.XXHandshake
        var initiatorCommitment: [UInt8]
        var hashAfterMessage2: [UInt8]
        var eventsAtMessage2: [SecureChannel.Event]
    }

    /// Plays the responder by hand: reads the real initiator's message 1, and answers with a message 2 whose
    /// payload is `payload2` (an honest one: a commitment, then bob's HELLO).
    private func handDrivenResponder(payload2: (_ helloBody: [UInt8]) -> [UInt8]) throws -> HandDrivenResponder {
        var i = SecureChannel(configuration: .init(role: .initiator, preference: .required, localPeer: alice))
        let start: [UInt8] = i.start().flatMap { e -> [UInt8] in if case .write(let b) = e { b } else { [] } }
        let pre = Array(start.prefix(SecureChannel.preambleSize))
        var hs = Noise.XXHandshake(role: .responder, localStatic: bob.keys!, prologue: pre)
        let commitment = try hs.readMessage1(Array(start.dropFirst(SecureChannel.preambleSize + 2)))
        let m2 = try hs.writeMessage2(payload: payload2(Array(ControlFrame.hello(peer: bob).encoded().dropFirst(4))))
        let h2 = hs.hash
        let events = (pre + [UInt8(m2.count >> 8), UInt8(m2.count & 0xff)] + m2).withUnsafeBytes { i.received($0) }
        return HandDrivenResponder(initiator: i, noise: hs, initiatorCommitment: commitment, hashAfterMessage2: h2,
                                   eventsAtMessage2: events)
    }

    /// Seals `frame` as the hand-driven responder's next record under `cipher`.
    private func sealRecord(_ frame: ControlFrame, with cipher: inout Noise.CipherState) -> [UInt8] {
        let c = cipher.encrypt(ad: [], frame.encoded())
        return [UInt8(c.count >> 8), UInt8(c.count & 0xff)] + c
    }

    @Test func aRealInitiatorLearnsTheDigitsOnlyFromTheRespondersOpenedNonce() throws {
        let responderNonce = [UInt8](repeating: 0x77, count: SecureChannel.nonceSize)
        var d = try handDrivenResponder { SecureChannel.commitment(to: responderNonce, by: .responder) + $0 }
        #expect(d.initiatorCommitment.count == 32)
        #expect(d.eventsAtMessage2.contains(.needsApproval(bob)))
        #expect(d.initiator.shortAuthenticationString == nil, "no digits before the responder opens its nonce")
        let m3: [UInt8] = d.initiator.approve().flatMap { e -> [UInt8] in if case .write(let b) = e { b } else { [] } }
        let (payload, keys) = try d.noise.readMessage3(Array(m3.dropFirst(2)))
        var cipher = keys.send
        let initiatorNonce = Array(payload.prefix(32))
        #expect(SecureChannel.commitment(to: initiatorNonce, by: .initiator) == d.initiatorCommitment,
                "message 3 opens message 1's commitment")
        #expect(d.initiator.shortAuthenticationString == nil, "approval gives no digits either")
        let events = sealRecord(.sasNonce(responderNonce), with: &cipher).withUnsafeBytes { d.initiator.received($0) }
        let expected = SecureChannel.sas(hashAfterMessage2: d.hashAfterMessage2, initiatorNonce: initiatorNonce,
                                         responderNonce: responderNonce)
        #expect(events == [.shortAuthenticationString(expected)], "the owner is told, and sees no frame")
        #expect(d.initiator.shortAuthenticationString == expected)
        // A second one is out of turn.
        let again = sealRecord(.sasNonce(responderNonce), with: &cipher).withUnsafeBytes { d.initiator.received($0) }
        #expect(faults(again) == [.unexpectedFrame("SAS-NONCE")])
        // Each handshake draws its own nonce.
        let other = try handDrivenResponder { SecureChannel.commitment(to: responderNonce, by: .responder) + $0 }
        #expect(other.initiatorCommitment != d.initiatorCommitment, "another handshake, another commitment")
    }

    @Test func aResponderWhoseNonceDoesNotOpenItsCommitmentIsRefused() throws {
        // What a man in the middle facing the inviter would need: commit in message 2, then open whichever nonce
        // makes the inviter's digits match the ones it found elsewhere.
        let committed = [UInt8](repeating: 0x77, count: SecureChannel.nonceSize)
        var d = try handDrivenResponder { SecureChannel.commitment(to: committed, by: .responder) + $0 }
        let m3: [UInt8] = d.initiator.approve().flatMap { e -> [UInt8] in if case .write(let b) = e { b } else { [] } }
        var cipher = try d.noise.readMessage3(Array(m3.dropFirst(2))).1.send
        var other = committed
        other[0] ^= 0x80
        let events = sealRecord(.sasNonce(other), with: &cipher).withUnsafeBytes { d.initiator.received($0) }
        #expect(faults(events) == [.handshake("SAS-NONCE does not open message 2's commitment")])
        #expect(d.initiator.shortAuthenticationString == nil && !d.initiator.isOpen)
    }

    @Test func aMessage2WithoutACommitmentAndAHelloIsRefused() throws {
        // A version-3 message 2 (the HELLO alone) behind a current preamble.
        var helloSize = 0
        let d = try handDrivenResponder { hello in
            helloSize = hello.count
            return hello
        }
        #expect(faults(d.eventsAtMessage2)
                == [.handshake("message 2 carries \(helloSize) bytes, not a 32-byte commitment and a HELLO")])
        #expect(!d.eventsAtMessage2.contains(.needsApproval(bob)) && !d.initiator.isOpen)
    }

    @Test func aSASNonceOutOfTurnIsAFault() {
        // Through the whole exchange: the responder reveals once, the initiator learns the same digits.
        var w = Wire()
        w.start()
        w.pump()
        #expect(w.initiator.shortAuthenticationString == nil && w.responder.shortAuthenticationString != nil)
        w.toInitiator.append(w.responder.revealNonce())
        w.pump()
        #expect(w.initiatorSaw.contains(.shortAuthenticationString(w.responder.shortAuthenticationString!)))
        #expect(w.initiator.shortAuthenticationString == w.responder.shortAuthenticationString)
        #expect(faults(w.initiatorSaw + w.responderSaw).isEmpty)
        // An initiator that sends one, to a responder: out of turn.
        let nonce = [UInt8](repeating: 1, count: SecureChannel.nonceSize)
        w.toResponder.append(w.initiator.sendRawFrameForTests(.sasNonce(nonce)))
        w.pump()
        #expect(faults(w.responderSaw) == [.unexpectedFrame("SAS-NONCE")])
        // In plaintext there is nothing to open.
        var p = Wire(.none, .none)
        p.start()
        p.pump()
        #expect(p.responder.revealNonce().isEmpty, "a plaintext responder has no nonce to send")
        p.toInitiator.append(ControlFrame.sasNonce(nonce).encoded())
        p.pump()
        #expect(faults(p.initiatorSaw) == [.unexpectedFrame("SAS-NONCE")])
    }

    @Test func anAcceptBeforeTheRespondersNonceIsAFaultAfterItAFrame() {
        // A responder that accepts without opening its nonce: the link would come up with no digits to show.
        var w = Wire()
        w.start()
        w.pump()
        w.sendFromResponder(.accept(udpPort: 7, token: 9))
        w.pump()
        #expect(faults(w.initiatorSaw) == [.unexpectedFrame("ACCEPT before SAS-NONCE")])
        #expect(!frames(w.initiatorSaw).contains(.accept(udpPort: 7, token: 9)))
        // The order a real responder sends them in (one write): the digits, then ACCEPT.
        var ok = Wire()
        ok.start()
        ok.pump()
        ok.toInitiator.append(ok.responder.revealNonce() + ok.responder.send(.accept(udpPort: 7, token: 9)))
        ok.pump()
        #expect(faults(ok.initiatorSaw).isEmpty)
        #expect(ok.initiatorSaw.suffix(2) == [.shortAuthenticationString(ok.responder.shortAuthenticationString!),
                                             .frame(.accept(udpPort: 7, token: 9))])
        // In plaintext there are no digits: ACCEPT is just a frame.
        var p = Wire(.none, .none)
        p.start()
        p.pump()
        p.sendFromResponder(.accept(udpPort: 7, token: 9))
        p.pump()
        #expect(faults(p.initiatorSaw).isEmpty && frames(p.initiatorSaw).contains(.accept(udpPort: 7, token: 9)))
    }

    @Test func theDigitsTakeTheHandshakeAndBothNonces() {
        let h = [UInt8](repeating: 1, count: 32)
        let n1 = [UInt8](repeating: 2, count: 32), n2 = [UInt8](repeating: 3, count: 32), nr = [UInt8](repeating: 4, count: 32)
        // Known answers, computed with Python's hashlib: SHA-256(label ‖ h ‖ nᵢ ‖ nᵣ)[0..<4] big-endian mod 10⁶, and
        // SHA-256(label ‖ role ‖ n).
        #expect(SecureChannel.sas(hashAfterMessage2: h, initiatorNonce: n1, responderNonce: nr) == "360 432")
        #expect(hex(SecureChannel.commitment(to: n1, by: .initiator))
                == "24b6bf438da73ca7d1afb6ab6ee0b148cdb6003f53a9391ae6453cd05a0dcfc4")
        #expect(hex(SecureChannel.commitment(to: n1, by: .responder))
                == "ac0574120278384d069aa42603ed3f146f9f24c05857215c74489c3467d04d1c")
        #expect(SecureChannel.sas(hashAfterMessage2: h, initiatorNonce: n2, responderNonce: nr) != "360 432",
                "the initiator's nonce, unknown at message 2, moves them")
        #expect(SecureChannel.sas(hashAfterMessage2: h, initiatorNonce: n1, responderNonce: n2) != "360 432",
                "so does the responder's, unknown until its app is asked")
        #expect(SecureChannel.sas(hashAfterMessage2: n2, initiatorNonce: n1, responderNonce: nr) != "360 432")
        #expect(SecureChannel.commitment(to: n1, by: .initiator) != SecureChannel.commitment(to: n2, by: .initiator))
    }

    private func hex(_ bytes: [UInt8]) -> String { bytes.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined() }

    @Test func aPeerOfAnotherVersionIsToldThisBuildsVersion() {
        var r = SecureChannel(configuration: .init(role: .responder, preference: .required, localPeer: bob))
        let previous = SecureChannel.magic + [peerMeshProtocolVersion - 1, 1, 0, 0]
        let events = previous.withUnsafeBytes { r.received($0) }
        #expect(faults(events) == [.malformedFrame("protocol version \(peerMeshProtocolVersion - 1); this build speaks \(peerMeshProtocolVersion)")])
        // It answers with its own preamble (refused, reason 3) first, so that the other side can say which met.
        #expect(events.first == .write(SecureChannel.magic + [peerMeshProtocolVersion, 255, 3, 0]))
        #expect(!r.isOpen)
        // An initiator that meets a responder of another version says so.
        var i = SecureChannel(configuration: .init(role: .initiator, preference: .required, localPeer: alice))
        _ = i.start()
        let answer = SecureChannel.magic + [peerMeshProtocolVersion + 1, 255, 3, 0]
        #expect(faults(answer.withUnsafeBytes { i.received($0) })
                == [.malformedFrame("protocol version \(peerMeshProtocolVersion + 1); this build speaks \(peerMeshProtocolVersion)")])
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
