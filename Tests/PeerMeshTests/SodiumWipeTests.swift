import Foundation
import Testing
@testable import PeerMesh

/// What can be checked of the wiping: a live buffer reads back zero, and the derivations that now write straight into
/// `SecretKey`s give the bytes they gave before. (That a released buffer was zeroed cannot be observed honestly.)
@Suite("Sodium wiping and key derivation into SecretKey")
struct SodiumWipeTests {
    @Test func wipeZeroesTheBufferItIsGiven() {
        var array = Sodium.randomBytes(100)
        array[0] = 1
        Sodium.wipe(&array)
        #expect(array == [UInt8](repeating: 0, count: 100))
        var data = Data(Sodium.randomBytes(40)) + [1]
        data.withUnsafeMutableBytes { Sodium.wipe($0) }
        #expect(data == Data(count: 41))
        Sodium.wipe(UnsafeMutableRawBufferPointer(start: nil, count: 0))   // nothing to wipe is not a crash
    }

    @Test("HMAC-SHA-256 gives RFC 4231's test vectors, whole or fed in pieces")
    func hmacMatchesRFC4231() {
        func hex(_ s: String) -> [UInt8] {
            stride(from: 0, to: s.count, by: 2).map { UInt8(s.dropFirst($0).prefix(2), radix: 16)! }
        }
        let case1 = hex("b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7")
        let case2 = hex("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        #expect(Sodium.hmacSHA256(key: [UInt8](repeating: 0x0b, count: 20), [Array("Hi There".utf8)]) == case1)
        #expect(Sodium.hmacSHA256(key: Array("Jefe".utf8), [Array("what do ya want for nothing?".utf8)]) == case2)
        #expect(Sodium.hmacSHA256(key: Array("Jefe".utf8), [Array("what do ya ".utf8), [], Array("want for nothing?".utf8)]) == case2)
    }

    @Test("HKDF into SecretKeys gives Noise's HMAC-SHA-256 HKDF, byte for byte")
    func hkdfMatchesItsDefinition() {
        for ikm in [[], Noise.datagramLabel, Sodium.randomBytes(32)] {
            let ck = Sodium.randomBytes(32)
            let (o1, o2) = ikm.withUnsafeBytes { Noise.hkdf2(SecretKey(copying: ck), $0) }
            let temp = Sodium.hmacSHA256(key: ck, [ikm])
            let e1 = Sodium.hmacSHA256(key: temp, [[0x01]])
            #expect(o1.bytes == e1 && o2.bytes == Sodium.hmacSHA256(key: temp, [e1, [0x02]]))
        }
    }

    @Test func aSharedSecretOrAScalarIsWrittenInPlaceAsBefore() {
        let a = Noise.KeyPair.generate(), b = Noise.KeyPair.generate()
        let ab = Sodium.x25519(a.secret, b.publicKey)!, ba = Sodium.x25519(b.secret, a.publicKey)!
        #expect(ab.bytes == ba.bytes && ab.bytes != [UInt8](repeating: 0, count: 32))
        #expect(Sodium.x25519(a.secret, [UInt8](repeating: 0, count: 32)) == nil, "a low-order key is still refused")
        #expect(Sodium.ristrettoRandomScalar().bytes != Sodium.ristrettoRandomScalar().bytes)
    }

    @Test("A key's base64 is Foundation's, padded and with the standard alphabet")
    func base64IsFoundations() {
        let keys = [[UInt8](repeating: 0xff, count: 32), [UInt8](repeating: 0xfb, count: 32), [UInt8](repeating: 0, count: 32)]
            + (0..<20).map { _ in Sodium.randomBytes(32) }
        for key in keys {
            #expect(Sodium.base64(SecretKey(copying: key)) == Array(Data(key).base64EncodedString().utf8))
        }
    }
}
