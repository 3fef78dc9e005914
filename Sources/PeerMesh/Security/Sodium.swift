// The one file that calls libsodium. Everything PeerMesh does with keys goes through here: randomness, X25519,
// ChaCha20-Poly1305 (IETF), SHA-256 and HMAC-SHA-256, BLAKE2b, ristretto255, constant-time comparison and wiping, and
// the base64 of a key (written where nothing leaves a copy of it).
import CSodium

/// 32 secret bytes (a private key or a symmetric key), wiped when released. Immutable once made.
final class SecretKey: @unchecked Sendable { // the bytes are written once in init, only read afterwards, wiped in deinit
    /// The key size every primitive here uses.
    static let size = 32
    private let storage: UnsafeMutableRawBufferPointer

    /// A fresh random key.
    init() {
        storage = .allocate(byteCount: Self.size, alignment: 16)
        Sodium.fillRandom(storage)
    }

    /// A copy of `bytes` (exactly 32).
    init(copying bytes: some Collection<UInt8>) {
        precondition(bytes.count == Self.size, "a key is 32 bytes")
        storage = .allocate(byteCount: Self.size, alignment: 16)
        storage.copyBytes(from: bytes)
    }

    /// Takes the first 32 bytes of `raw`.
    init(_ raw: UnsafeRawBufferPointer) {
        precondition(raw.count >= Self.size, "a key is 32 bytes")
        storage = .allocate(byteCount: Self.size, alignment: 16)
        storage.copyMemory(from: UnsafeRawBufferPointer(rebasing: raw[0..<Self.size]))
    }

    /// A key that `body` writes in place (32 bytes, zeros until written): what derives a key makes it here, so it
    /// never passes through a buffer that is not wiped.
    fileprivate init(initializingWith body: (UnsafeMutablePointer<UInt8>) -> Void) {
        storage = .allocate(byteCount: Self.size, alignment: 16)
        body(storage.initializeMemory(as: UInt8.self, repeating: 0).baseAddress!)
    }

    deinit {
        sodium_memzero(storage.baseAddress, storage.count)
        storage.deallocate()
    }

    func withBytes<R>(_ body: (UnsafePointer<UInt8>) throws -> R) rethrows -> R {
        try body(storage.baseAddress!.assumingMemoryBound(to: UInt8.self))
    }

    /// The 32 bytes, to feed to a hash or a MAC without copying them.
    func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try body(UnsafeRawBufferPointer(storage))
    }

    /// A copy of the bytes in an array, which nothing wipes unless its holder does (`Sodium.wipe`): for tests that
    /// compare keys. Code that needs the bytes uses `withBytes` or `withUnsafeBytes`.
    var bytes: [UInt8] { Array(storage) }
}

/// Calls into libsodium: the error funnel is the return code (libsodium has no error text; each wrapper says
/// what failed), and a failure to initialise the library traps (nothing secure can run without it).
enum Sodium {
    private static let initialised: Bool = sodium_init() >= 0
    /// A valid address to pass with a length of 0 (libsodium's pointers are non-null).
    nonisolated(unsafe) private static let nonEmpty = UnsafePointer<UInt8>(UnsafeMutablePointer<UInt8>.allocate(capacity: 1))

    @inline(__always)
    static func ready() { precondition(initialised, "libsodium failed to initialise (sodium_init)") }

    // MARK: Randomness

    static func fillRandom(_ p: UnsafeMutableRawBufferPointer) {
        ready()
        guard let base = p.baseAddress else { return }
        randombytes_buf(base, p.count)
    }

    static func randomBytes(_ n: Int) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: n)
        out.withUnsafeMutableBytes { fillRandom($0) }
        return out
    }

    static func randomUInt64() -> UInt64 {
        var v: UInt64 = 0
        withUnsafeMutableBytes(of: &v) { fillRandom($0) }
        return v
    }

    // MARK: X25519

    /// The public key of `secret`.
    static func x25519PublicKey(of secret: SecretKey) -> [UInt8] {
        ready()
        var out = [UInt8](repeating: 0, count: 32)
        _ = secret.withBytes { s in out.withUnsafeMutableBufferPointer { crypto_scalarmult_curve25519_base($0.baseAddress!, s) } }
        return out
    }

    /// X25519(secret, public), or nil when the peer's key is of low order (the result would be all zeros): such a
    /// key is an attack, not a key.
    static func x25519(_ secret: SecretKey, _ publicKey: some Collection<UInt8>) -> SecretKey? {
        ready()
        guard publicKey.count == 32 else { return nil }
        let pub = Array(publicKey)
        var rc: Int32 = -1
        let shared = SecretKey { out in
            rc = secret.withBytes { s in pub.withUnsafeBufferPointer { crypto_scalarmult_curve25519(out, s, $0.baseAddress!) } }
        }
        return rc == 0 ? shared : nil
    }

    // MARK: ChaCha20-Poly1305 (IETF)

    /// Bytes the tag adds.
    static let tagSize = Int(crypto_aead_chacha20poly1305_ietf_ABYTES)

    /// The 96-bit nonce for a 64-bit counter: four zero bytes, then the counter little-endian (Noise's ChaChaPoly).
    @inline(__always)
    private static func withNonce<R>(_ counter: UInt64, _ body: (UnsafePointer<UInt8>) -> R) -> R {
        withUnsafeTemporaryAllocation(byteCount: 12, alignment: 4) { n in
            n.storeBytes(of: UInt32(0), toByteOffset: 0, as: UInt32.self)
            n.storeBytes(of: counter.littleEndian, toByteOffset: 4, as: UInt64.self)
            return body(n.baseAddress!.assumingMemoryBound(to: UInt8.self))
        }
    }

    /// Encrypts `plaintext` under `key` and `counter` with `ad` authenticated, into `out` (which may be the same
    /// memory as `plaintext`; it needs `plaintext.count + tagSize` bytes). Returns the ciphertext length.
    @discardableResult
    static func seal(key: SecretKey, counter: UInt64, ad: UnsafeRawBufferPointer, plaintext: UnsafeRawBufferPointer,
                     into out: UnsafeMutableRawBufferPointer) -> Int {
        ready()
        precondition(out.count >= plaintext.count + tagSize, "no room for the tag")
        var written: UInt64 = 0
        _ = withNonce(counter) { nonce in
            key.withBytes { k in
                crypto_aead_chacha20poly1305_ietf_encrypt(
                    out.baseAddress!.assumingMemoryBound(to: UInt8.self), &written,
                    plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(plaintext.count),
                    ad.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(ad.count), nil, nonce, k)
            }
        }
        return Int(written)
    }

    /// Decrypts and verifies `ciphertext` into `out` (may be the same memory; needs `ciphertext.count − tagSize`
    /// bytes). Returns the plaintext length, or nil when it does not authenticate (then `out` holds nothing useful).
    static func open(key: SecretKey, counter: UInt64, ad: UnsafeRawBufferPointer, ciphertext: UnsafeRawBufferPointer,
                     into out: UnsafeMutableRawBufferPointer) -> Int? {
        ready()
        guard ciphertext.count >= tagSize, out.count >= ciphertext.count - tagSize else { return nil }
        var written: UInt64 = 0
        let rc = withNonce(counter) { nonce in
            key.withBytes { k in
                crypto_aead_chacha20poly1305_ietf_decrypt(
                    out.baseAddress?.assumingMemoryBound(to: UInt8.self), &written, nil,
                    ciphertext.baseAddress!.assumingMemoryBound(to: UInt8.self), UInt64(ciphertext.count),
                    ad.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(ad.count), nonce, k)
            }
        }
        return rc == 0 ? Int(written) : nil
    }

    // MARK: Hashes

    /// SHA-256 of the concatenation of `parts`.
    static func sha256(_ parts: [[UInt8]]) -> [UInt8] {
        var hasher = SHA256()
        for p in parts { p.withUnsafeBytes { hasher.update($0) } }
        return hasher.finish()
    }

    /// SHA-256 fed in pieces (behind `sha256`; resource transfers hash with `OpenSSL.SHA256`, which is faster).
    struct SHA256: Sendable {
        private var state = crypto_hash_sha256_state()

        init() {
            Sodium.ready()
            crypto_hash_sha256_init(&state)
        }

        mutating func update(_ bytes: UnsafeRawBufferPointer) {
            guard let base = bytes.baseAddress, !bytes.isEmpty else { return }
            crypto_hash_sha256_update(&state, base.assumingMemoryBound(to: UInt8.self), UInt64(bytes.count))
        }

        /// The digest (32 bytes). The hasher is spent afterwards.
        mutating func finish() -> [UInt8] {
            var out = [UInt8](repeating: 0, count: 32)
            crypto_hash_sha256_final(&state, &out)
            return out
        }
    }

    /// SHA-512 of the concatenation of `parts`.
    static func sha512(_ parts: [[UInt8]]) -> [UInt8] {
        ready()
        var state = crypto_hash_sha512_state()
        crypto_hash_sha512_init(&state)
        for p in parts { p.withUnsafeBufferPointer { _ = crypto_hash_sha512_update(&state, $0.baseAddress ?? nonEmpty, UInt64($0.count)) } }
        var out = [UInt8](repeating: 0, count: 64)
        crypto_hash_sha512_final(&state, &out)
        return out
    }

    /// HMAC-SHA-256 with `key` (any length) over the concatenation of `parts`.
    static func hmacSHA256(key: [UInt8], _ parts: [[UInt8]]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 32)
        out.withUnsafeMutableBufferPointer { o in
            key.withUnsafeBytes { k in
                hmacSHA256(key: k, into: o.baseAddress!) { update in for p in parts { p.withUnsafeBytes(update) } }
            }
        }
        return out
    }

    /// HMAC-SHA-256 keyed with a secret key over the concatenation of `parts`, as a secret key: for key derivation,
    /// where neither the key nor the output may pass through a buffer that is not wiped.
    static func hmacSHA256(key: SecretKey, _ parts: UnsafeRawBufferPointer...) -> SecretKey {
        SecretKey { out in
            key.withUnsafeBytes { k in hmacSHA256(key: k, into: out) { update in parts.forEach(update) } }
        }
    }

    /// HMAC-SHA-256 with `key` over what `feed` hands to the update it is given, written to `out` (32 bytes). The
    /// state, derived from the key, lives in one allocation that never moves and is never copied, and libsodium's
    /// final wipes it (both of its SHA-256 states); a struct holding it could leave copies of it nothing wipes.
    private static func hmacSHA256(key: UnsafeRawBufferPointer, into out: UnsafeMutablePointer<UInt8>,
                                   _ feed: ((UnsafeRawBufferPointer) -> Void) -> Void) {
        ready()
        withUnsafeTemporaryAllocation(of: crypto_auth_hmacsha256_state.self, capacity: 1) { buffer in
            let state = buffer.baseAddress!
            crypto_auth_hmacsha256_init(state, key.baseAddress?.assumingMemoryBound(to: UInt8.self) ?? nonEmpty, key.count)
            feed { bytes in
                crypto_auth_hmacsha256_update(state, bytes.baseAddress?.assumingMemoryBound(to: UInt8.self) ?? nonEmpty,
                                              UInt64(bytes.count))
            }
            crypto_auth_hmacsha256_final(state, out)
        }
    }

    /// BLAKE2b of `data` with an output of `length` bytes (16…64), optionally keyed.
    static func blake2b(_ data: [UInt8], length: Int = 32, key: [UInt8] = []) -> [UInt8] {
        ready()
        var out = [UInt8](repeating: 0, count: length)
        data.withUnsafeBufferPointer { d in
            key.withUnsafeBufferPointer { k in
                _ = crypto_generichash(&out, length, d.baseAddress, UInt64(d.count), k.isEmpty ? nil : k.baseAddress, k.count)
            }
        }
        return out
    }

    // MARK: Comparison and wiping

    /// Equality in time independent of where the inputs differ.
    static func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        return a.withUnsafeBufferPointer { x in b.withUnsafeBufferPointer { y in sodium_memcmp(x.baseAddress, y.baseAddress, a.count) == 0 } }
    }

    /// Overwrites `bytes` with zeros: the buffer this array owns (made unique first, so a buffer it shares with a
    /// copy is not the one wiped — wipe before copies are made, or make none).
    static func wipe(_ bytes: inout [UInt8]) { sodium_memzero(&bytes, bytes.count) }

    /// Overwrites the memory `bytes` points at with zeros.
    static func wipe(_ bytes: UnsafeMutableRawBufferPointer) {
        guard let base = bytes.baseAddress else { return }
        sodium_memzero(base, bytes.count)
    }

    // MARK: Base64

    /// `key` in standard base64 (RFC 4648 §4, padded: what `Data.base64EncodedString()` writes), encoded straight
    /// into the array returned, which the caller wipes.
    static func base64(_ key: SecretKey) -> [UInt8] {
        ready()
        let length = 4 * ((SecretKey.size + 2) / 3)
        var out = [UInt8](repeating: 0, count: length + 1)   // and libsodium's NUL
        out.withUnsafeMutableBufferPointer { o in
            key.withBytes { k in
                _ = o.baseAddress!.withMemoryRebound(to: CChar.self, capacity: o.count) {
                    sodium_bin2base64($0, o.count, k, SecretKey.size, sodium_base64_VARIANT_ORIGINAL)
                }
            }
        }
        out.removeLast()
        return out
    }

    // MARK: ristretto255 (for the pairing PAKE)

    /// The group element for a 64-byte uniform hash (`crypto_core_ristretto255_from_hash`).
    static func ristrettoFromHash(_ hash64: [UInt8]) -> [UInt8] {
        ready()
        precondition(hash64.count == 64)
        var out = [UInt8](repeating: 0, count: 32)
        _ = crypto_core_ristretto255_from_hash(&out, hash64)
        return out
    }

    /// A random non-zero scalar.
    static func ristrettoRandomScalar() -> SecretKey {
        ready()
        return SecretKey { crypto_core_ristretto255_scalar_random($0) }
    }

    /// scalar · point, or nil when the point is invalid or the result is the identity. With a secret scalar and
    /// the peer's point the result is a shared secret: its holder wipes it.
    static func ristrettoMultiply(_ scalar: SecretKey, _ point: [UInt8]) -> [UInt8]? {
        ready()
        guard point.count == 32, crypto_core_ristretto255_is_valid_point(point) == 1 else { return nil }
        var out = [UInt8](repeating: 0, count: 32)
        let rc = scalar.withBytes { crypto_scalarmult_ristretto255(&out, $0, point) }
        return rc == 0 ? out : nil
    }
}
