import Testing
@testable import PeerMesh

/// The resource path's SHA-256 (libcrypto) must be the SHA-256 peers already speak (libsodium's, and the standard).
@Suite("SHA-256 through OpenSSL, against libsodium and FIPS 180-2")
struct OpenSSLSHA256SodiumTests {
    private func hex(_ bytes: [UInt8]) -> String { bytes.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined() }

    @Test func knownVectors() throws {
        #expect(hex(try OpenSSL.SHA256.digest([])) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        #expect(hex(try OpenSSL.SHA256.digest([Array("abc".utf8)])) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(hex(try OpenSSL.SHA256.digest([Array("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq".utf8)]))
                == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
    }

    @Test func matchesLibsodiumFedInAnyPieces() throws {
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<20 {
            let data = (0..<Int.random(in: 0...300_000, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            var pieces: [[UInt8]] = []
            var i = 0
            while i < data.count {
                let n = min(data.count - i, Int.random(in: 0...70_000, using: &rng))
                pieces.append(Array(data[i..<(i + n)]))
                i += n
            }
            #expect(try OpenSSL.SHA256.digest(pieces) == Sodium.sha256([data]))
        }
    }

    @Test func emptyUpdatesChangeNothing() throws {
        let h = try OpenSSL.SHA256()
        try h.update([UInt8]())
        try h.update(UnsafeRawBufferPointer(start: nil, count: 0))
        try h.update(Array("abc".utf8))
        #expect(try h.finish() == Sodium.sha256([Array("abc".utf8)]))
    }
}
