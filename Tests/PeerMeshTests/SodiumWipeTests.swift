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
