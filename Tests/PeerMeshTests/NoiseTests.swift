import Testing
@testable import PeerMesh

private func hex(_ s: String) -> [UInt8] {
    var out: [UInt8] = []
    var i = s.startIndex
    while i < s.endIndex {
        let j = s.index(i, offsetBy: 2)
        out.append(UInt8(s[i..<j], radix: 16)!)
        i = j
    }
    return out
}

private func key(_ range: ClosedRange<UInt8>) -> Noise.KeyPair { Noise.KeyPair(secret: SecretKey(copying: Array(range))) }

@Suite("Noise XX handshake (pure)")
struct NoiseTests {
    /// Vectors from an independent implementation: the Python `noiseprotocol` package (0.3.1), with fixed keys.
    @Test func matchesAnIndependentImplementationByteForByte() throws {
        let prologue = Array("PeerMesh test prologue".utf8)
        var i = Noise.XXHandshake(role: .initiator, localStatic: key(1...32), localEphemeral: key(33...64), prologue: prologue)
        var r = Noise.XXHandshake(role: .responder, localStatic: key(65...96), localEphemeral: key(97...128), prologue: prologue)
        let m1 = try i.writeMessage1(payload: Array("hello".utf8))
        #expect(m1 == hex("5869aff450549732cbaaed5e5df9b30a6da31cb0e5742bad5ad4a1a768f1a67b68656c6c6f"))
        #expect(try r.readMessage1(m1) == Array("hello".utf8))
        let m2 = try r.writeMessage2(payload: Array("responder payload".utf8))
        #expect(m2 == hex("244fe3b963e899dd295baffce248d3530f3a9a7479ba063002680ebfe7adad49f197d6be61b51372854b4947bb7968e90c719fe79550e48ecf696cc4e7b51e168ccf555d44e1630f8d805527bea12a7e28b4732b1df93982e103155870c9b54103bde3efa2e7ebab121b090886ca962f29"))
        let (rs, p2) = try i.readMessage2(m2)
        #expect(rs == key(65...96).publicKey && p2 == Array("responder payload".utf8))
        let (m3, ri) = try i.writeMessage3(payload: Array("initiator payload".utf8))
        #expect(m3 == hex("bb393122a9dd7e3e19dd4433a6c6743ff2454a8d4e165786a5f1235a87aaf27e68fff5650fa3267622e29ebdeeb958a4fc1e6a882e08ebebf07df2683fb03eb2ced807ae36c2872c48eed58a96a47c7210"))
        let (p3, rr) = try r.readMessage3(m3)
        #expect(p3 == Array("initiator payload".utf8) && rr.remoteStatic == key(1...32).publicKey)
        #expect(ri.handshakeHash == hex("3a108387461dce247d09c2560d2b1491d1eba7fe79386e9995b166f63f4914e7"))
        #expect(rr.handshakeHash == ri.handshakeHash)
        var iSend = ri.send, rSend = rr.send, iRecv = ri.receive, rRecv = rr.receive
        let t1 = iSend.encrypt(ad: [], Array("transport one".utf8))
        #expect(t1 == hex("fdf5669175e34531b1bf020426360eaaade21ca7fb10ddfe0fc6cd404f"))
        let t2 = rSend.encrypt(ad: [], Array("transport two".utf8))
        #expect(t2 == hex("7b90534a7cdc5ed5cd10099ce8d80fe44486f694b24e9a2144f22cf97d"))
        #expect(try rRecv.decrypt(ad: [], t1) == Array("transport one".utf8))
        #expect(try iRecv.decrypt(ad: [], t2) == Array("transport two".utf8))
        // Datagram keys pair up too, and differ from the transport keys.
        #expect(ri.datagramSend.bytes == rr.datagramReceive.bytes && ri.datagramReceive.bytes == rr.datagramSend.bytes)
        #expect(ri.datagramSend.bytes != ri.datagramReceive.bytes)
    }

    @Test func aDifferentPrologueFailsTheHandshake() throws {
        var i = Noise.XXHandshake(role: .initiator, localStatic: .generate(), prologue: [1])
        var r = Noise.XXHandshake(role: .responder, localStatic: .generate(), prologue: [2])
        _ = try r.readMessage1(try i.writeMessage1())
        let m2 = try r.writeMessage2(payload: [])
        #expect(throws: Noise.Failure.decryptFailed) { _ = try i.readMessage2(m2) }
    }

    @Test func everyFlippedBitOfMessages2And3IsCaught() throws {
        for which in [2, 3] {
            var i0 = Noise.XXHandshake(role: .initiator, localStatic: key(1...32), localEphemeral: key(33...64), prologue: [])
            var r0 = Noise.XXHandshake(role: .responder, localStatic: key(65...96), localEphemeral: key(97...128), prologue: [])
            _ = try r0.readMessage1(try i0.writeMessage1())
            let m2 = try r0.writeMessage2(payload: [7, 7, 7])
            if which == 2 {
                for pos in 0..<m2.count {
                    var i = i0
                    var bad = m2
                    bad[pos] ^= 0x01
                    #expect(throws: Noise.Failure.self, "byte \(pos) of message 2") { _ = try i.readMessage2(bad) }
                }
                #expect(throws: Noise.Failure.self) { var i = i0; _ = try i.readMessage2(Array(m2.dropLast())) }
            } else {
                _ = try i0.readMessage2(m2)
                let (m3, _) = try i0.writeMessage3(payload: [9])
                for pos in 0..<m3.count {
                    var r = r0
                    var bad = m3
                    bad[pos] ^= 0x80
                    #expect(throws: Noise.Failure.self, "byte \(pos) of message 3") { _ = try r.readMessage3(bad) }
                }
            }
        }
    }

    @Test func messagesOutOfTurnAreRefused() throws {
        var i = Noise.XXHandshake(role: .initiator, localStatic: .generate(), prologue: [])
        #expect(throws: Noise.Failure.outOfTurn) { _ = try i.readMessage2(Array(repeating: 0, count: 96)) }
        #expect(throws: Noise.Failure.outOfTurn) { _ = try i.writeMessage3(payload: []) }
        #expect(throws: Noise.Failure.outOfTurn) { _ = try i.readMessage1([]) }
        _ = try i.writeMessage1()
        #expect(throws: Noise.Failure.outOfTurn) { _ = try i.writeMessage1() }
        var r = Noise.XXHandshake(role: .responder, localStatic: .generate(), prologue: [])
        #expect(throws: Noise.Failure.outOfTurn) { _ = try r.writeMessage2(payload: []) }
        #expect(throws: Noise.Failure.outOfTurn) { _ = try r.readMessage3(Array(repeating: 0, count: 64)) }
    }

    @Test func aLowOrderEphemeralKeyIsRefused() throws {
        var r = Noise.XXHandshake(role: .responder, localStatic: .generate(), prologue: [])
        _ = try r.readMessage1(Array(repeating: 0, count: 32))   // the all-zero point
        #expect(throws: Noise.Failure.badPublicKey) { _ = try r.writeMessage2(payload: []) }
    }
}
