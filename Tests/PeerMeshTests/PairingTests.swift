import Testing
@testable import PeerMesh

@Suite("Pairing code PAKE (CPace over ristretto255, pure)")
struct PairingTests {
    let binding = Sodium.randomBytes(32)

    @Test func theRightCodePairsBothWays() throws {
        var a = Pairing.Initiator(code: "1234-5678", binding: binding)
        var b = Pairing.Responder(code: "12345678", binding: binding) // typed without the dash
        let m2 = try b.answer(a.firstMessage)
        let m3 = try a.answer(m2)
        try b.verify(m3)
        #expect(Pairing.result(Pairing.resultMessage(.paired)) == .paired)
    }

    @Test func aWrongCodeIsCaughtByBothSides() throws {
        var a = Pairing.Initiator(code: "1234-5679", binding: binding)
        var b = Pairing.Responder(code: "1234-5678", binding: binding)
        let m2 = try b.answer(a.firstMessage)
        #expect(throws: Pairing.Failure.wrongCode) { _ = try a.answer(m2) }
        // An initiator that sends a confirmation anyway (guessing) is refused too.
        #expect(throws: Pairing.Failure.wrongCode) { try b.verify(Pairing.magic + [3] + [UInt8](repeating: 1, count: 32)) }
    }

    @Test func aProofForAnotherChannelDoesNotCarryOver() throws {
        // A man in the middle relays messages between two channels with different bindings: the tags fail.
        var a = Pairing.Initiator(code: "1111-2222", binding: binding)
        var b = Pairing.Responder(code: "1111-2222", binding: Sodium.randomBytes(32))
        let m2 = try b.answer(a.firstMessage)
        #expect(throws: Pairing.Failure.wrongCode) { _ = try a.answer(m2) }
    }

    @Test func invalidElementsAndMalformedMessagesAreRefused() throws {
        var b = Pairing.Responder(code: "1111-2222", binding: binding)
        #expect(throws: Pairing.Failure.badElement) { _ = try b.answer(Pairing.magic + [1] + [UInt8](repeating: 0, count: 32)) }
        var b2 = Pairing.Responder(code: "1111-2222", binding: binding)
        #expect(throws: Pairing.Failure.badElement) { _ = try b2.answer(Pairing.magic + [1] + [UInt8](repeating: 0xff, count: 32)) }
        var b3 = Pairing.Responder(code: "1111-2222", binding: binding)
        #expect(throws: Pairing.Failure.malformed) { _ = try b3.answer([1, 2, 3]) }
        #expect(throws: Pairing.Failure.malformed) { _ = try b3.answer(Pairing.magic + [2] + [UInt8](repeating: 0, count: 32)) }
        #expect(throws: Pairing.Failure.malformed) { try b3.verify(Pairing.magic + [3] + [UInt8](repeating: 0, count: 32)) }
        var a = Pairing.Initiator(code: "1111-2222", binding: binding)
        #expect(throws: Pairing.Failure.malformed) { _ = try a.answer(Array(repeating: 0, count: 69)) }
    }

    @Test func codesAreEightUniformDigits() {
        var seen = [Int](repeating: 0, count: 10)
        for _ in 0..<500 {
            let c = Pairing.newCode()
            #expect(c.count == 9 && c.dropFirst(4).first == "-")
            for ch in Pairing.normalize(c) { seen[Int(String(ch))!] += 1 }
        }
        #expect(seen.allSatisfy { $0 > 280 && $0 < 520 }, "\(seen)")
        #expect(Pairing.normalize(" 4821 0937 ") == "48210937")
    }
}
