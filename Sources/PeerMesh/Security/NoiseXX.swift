/// The Noise Protocol Framework's `Noise_XX_25519_ChaChaPoly_SHA256` handshake (noiseprotocol.org, revision 34),
/// built on libsodium primitives. Pure: no I/O, no clock; the ephemeral key is passed in, so tests replay exactly.
///
/// ```
/// XX:
///   -> e
///   <- e, ee, s, es
///   -> s, se
/// ```
///
/// Both sides end authenticated to each other (each proves its static key with a DH), with forward secrecy (the
/// session keys depend on the ephemeral keys), and the initiator's identity is hidden from passive observers.
enum Noise {
    /// The protocol name hashed into the transcript; 32 bytes, so it is used as is (Noise §5.2).
    static let protocolName = Array("Noise_XX_25519_ChaChaPoly_SHA256".utf8)
    static let hashLength = 32
    static let keyLength = 32

    /// Why a handshake message was refused. Each is a peer fault: the connection is closed.
    enum Failure: Error, Equatable, Sendable, CustomStringConvertible {
        /// The message has the wrong length for its place in the pattern.
        case badLength(Int)
        /// A tag did not verify: tampered, truncated, replayed from another handshake, or the wrong key.
        case decryptFailed
        /// The peer's public key is of low order (the DH is all zeros).
        case badPublicKey
        /// A message out of turn.
        case outOfTurn

        var description: String {
            switch self {
            case .badLength(let n): "handshake message of \(n) bytes has the wrong length"
            case .decryptFailed: "handshake message did not authenticate"
            case .badPublicKey: "the peer's public key is not a valid X25519 key"
            case .outOfTurn: "handshake message out of turn"
            }
        }
    }

    /// Noise's CipherState: a key and a 64-bit counter nonce.
    struct CipherState: Sendable {
        private(set) var key: SecretKey?
        private(set) var nonce: UInt64 = 0

        init(key: SecretKey? = nil) { self.key = key }

        /// The nonce is exhausted (2^64 − 1 is reserved by Noise): the caller must rekey or reconnect.
        var isExhausted: Bool { nonce == .max }

        mutating func encrypt(ad: [UInt8], _ plaintext: [UInt8]) -> [UInt8] {
            guard let key else { return plaintext }
            precondition(!isExhausted, "Noise nonce exhausted; the channel must be closed before this")
            var out = [UInt8](repeating: 0, count: plaintext.count + Sodium.tagSize)
            plaintext.withUnsafeBytes { p in
                ad.withUnsafeBytes { a in
                    out.withUnsafeMutableBytes { o in _ = Sodium.seal(key: key, counter: nonce, ad: a, plaintext: p, into: o) }
                }
            }
            nonce += 1
            return out
        }

        mutating func decrypt(ad: [UInt8], _ ciphertext: [UInt8]) throws(Failure) -> [UInt8] {
            guard let key else { return ciphertext }
            guard !isExhausted, ciphertext.count >= Sodium.tagSize else { throw .decryptFailed }
            var out = [UInt8](repeating: 0, count: ciphertext.count - Sodium.tagSize)
            let n = ciphertext.withUnsafeBytes { c in
                ad.withUnsafeBytes { a in
                    out.withUnsafeMutableBytes { o in Sodium.open(key: key, counter: nonce, ad: a, ciphertext: c, into: o) }
                }
            }
            guard n != nil else { throw .decryptFailed }
            nonce += 1
            return out
        }
    }

    /// Noise's SymmetricState: the chaining key, the handshake hash and the current cipher.
    struct SymmetricState: Sendable {
        /// Secret from the first DH on, so held as a key (each one is wiped when replaced).
        private var chainingKey: SecretKey
        private(set) var hash: [UInt8]
        private var cipher = CipherState()

        init(prologue: [UInt8]) {
            hash = Noise.protocolName   // exactly HASHLEN bytes
            chainingKey = SecretKey(copying: hash)
            mixHash(prologue)
        }

        mutating func mixHash(_ data: [UInt8]) { hash = Sodium.sha256([hash, data]) }

        mutating func mixKey(_ ikm: SecretKey) {
            let (ck, k) = ikm.withUnsafeBytes { Noise.hkdf2(chainingKey, $0) }
            chainingKey = ck
            cipher = CipherState(key: k)
        }

        mutating func encryptAndHash(_ plaintext: [UInt8]) -> [UInt8] {
            let c = cipher.encrypt(ad: hash, plaintext)
            mixHash(c)
            return c
        }

        mutating func decryptAndHash(_ ciphertext: [UInt8]) throws(Failure) -> [UInt8] {
            let p = try cipher.decrypt(ad: hash, ciphertext)
            mixHash(ciphertext)
            return p
        }

        /// The two transport ciphers (initiator→responder, responder→initiator).
        func split() -> (CipherState, CipherState) {
            let (k1, k2) = Noise.hkdf2(chainingKey, UnsafeRawBufferPointer(start: nil, count: 0))
            return (CipherState(key: k1), CipherState(key: k2))
        }

        /// Two more keys from the final chaining key, for another channel (PeerMesh's datagrams), separated by `label`.
        func derive(label: [UInt8]) -> (SecretKey, SecretKey) {
            label.withUnsafeBytes { Noise.hkdf2(chainingKey, $0) }
        }
    }

    /// Noise's HKDF with two outputs (HMAC-SHA-256). The temporary key and both outputs are `SecretKey`s, so nothing
    /// derived here outlives its use unwiped.
    static func hkdf2(_ chainingKey: SecretKey, _ ikm: UnsafeRawBufferPointer) -> (SecretKey, SecretKey) {
        let temp = Sodium.hmacSHA256(key: chainingKey, ikm)
        let o1 = hkdfCounter[0].withUnsafeBytes { Sodium.hmacSHA256(key: temp, $0) }
        let o2 = o1.withUnsafeBytes { o in hkdfCounter[1].withUnsafeBytes { Sodium.hmacSHA256(key: temp, o, $0) } }
        return (o1, o2)
    }

    /// The bytes HKDF appends to number its outputs.
    private static let hkdfCounter: [[UInt8]] = [[0x01], [0x02]]

    /// A static or ephemeral X25519 key pair.
    struct KeyPair: Sendable {
        let secret: SecretKey
        let publicKey: [UInt8]

        init(secret: SecretKey) {
            self.secret = secret
            publicKey = Sodium.x25519PublicKey(of: secret)
        }

        static func generate() -> KeyPair { KeyPair(secret: SecretKey()) }
    }

    /// What a finished handshake yields.
    struct Result: Sendable {
        /// The peer's static public key (authenticated).
        let remoteStatic: [UInt8]
        /// Our sending cipher and the peer's (for the TCP records).
        let send: CipherState
        let receive: CipherState
        /// Datagram keys: ours to send with, the peer's to open with.
        let datagramSend: SecretKey
        let datagramReceive: SecretKey
        /// The final handshake hash: both sides hold the same value; the channel binding comes from it. (The short
        /// authentication string is taken earlier, over the hash after message 2: `SecureChannel`.)
        let handshakeHash: [UInt8]
    }

    /// The label that separates PeerMesh's datagram keys from the TCP transport keys.
    static let datagramLabel = Array("PeerMesh v2 datagram keys".utf8)

    /// The XX handshake, one side of it.
    struct XXHandshake: Sendable {
        enum Role: Sendable { case initiator, responder }

        private enum Step: Sendable {
            /// Initiator: write message 1. Responder: read message 1.
            case first
            /// Initiator: read message 2. Responder: write message 2.
            case second(remoteEphemeral: [UInt8]?)
            /// Initiator: write message 3. Responder: read message 3.
            case third(remoteEphemeral: [UInt8], remoteStatic: [UInt8]?)
            case done
        }

        let role: Role
        private let localStatic: KeyPair
        private let localEphemeral: KeyPair
        private var symmetric: SymmetricState
        private var step = Step.first

        /// `prologue` must be the same bytes on both sides (PeerMesh puts the inviter's clear preamble there, so a
        /// tampered offer fails the handshake; the advertiser's answer must repeat the offered mode or the inviter
        /// closes).
        init(role: Role, localStatic: KeyPair, localEphemeral: KeyPair = .generate(), prologue: [UInt8]) {
            self.role = role
            self.localStatic = localStatic
            self.localEphemeral = localEphemeral
            symmetric = SymmetricState(prologue: prologue)
        }

        /// The handshake hash so far.
        var hash: [UInt8] { symmetric.hash }

        // MARK: Initiator

        /// `-> e`, with a clear payload.
        mutating func writeMessage1(payload: [UInt8] = []) throws(Failure) -> [UInt8] {
            guard role == .initiator, case .first = step else { throw .outOfTurn }
            symmetric.mixHash(localEphemeral.publicKey)
            let p = symmetric.encryptAndHash(payload)
            step = .second(remoteEphemeral: nil)
            return localEphemeral.publicKey + p
        }

        /// `<- e, ee, s, es`: returns the responder's static key and its (encrypted) payload.
        mutating func readMessage2(_ m: [UInt8]) throws(Failure) -> (remoteStatic: [UInt8], payload: [UInt8]) {
            guard role == .initiator, case .second = step else { throw .outOfTurn }
            guard m.count >= 32 + 48 + Sodium.tagSize else { throw .badLength(m.count) }
            let re = Array(m[0..<32])
            symmetric.mixHash(re)
            guard let ee = Sodium.x25519(localEphemeral.secret, re) else { throw .badPublicKey }
            symmetric.mixKey(ee)
            let rs = try symmetric.decryptAndHash(Array(m[32..<80]))
            guard let es = Sodium.x25519(localEphemeral.secret, rs) else { throw .badPublicKey }
            symmetric.mixKey(es)
            let payload = try symmetric.decryptAndHash(Array(m[80...]))
            step = .third(remoteEphemeral: re, remoteStatic: rs)
            return (rs, payload)
        }

        /// `-> s, se`: finishes the initiator's side.
        mutating func writeMessage3(payload: [UInt8]) throws(Failure) -> ([UInt8], Result) {
            guard role == .initiator, case .third(let re, let rs?) = step else { throw .outOfTurn }
            let s = symmetric.encryptAndHash(localStatic.publicKey)
            guard let se = Sodium.x25519(localStatic.secret, re) else { throw .badPublicKey }
            symmetric.mixKey(se)
            let p = symmetric.encryptAndHash(payload)
            step = .done
            return (s + p, finish(remoteStatic: rs))
        }

        // MARK: Responder

        /// `-> e`: returns the initiator's clear payload.
        mutating func readMessage1(_ m: [UInt8]) throws(Failure) -> [UInt8] {
            guard role == .responder, case .first = step else { throw .outOfTurn }
            guard m.count >= 32 else { throw .badLength(m.count) }
            let re = Array(m[0..<32])
            symmetric.mixHash(re)
            let payload = try symmetric.decryptAndHash(Array(m[32...]))
            step = .second(remoteEphemeral: re)
            return payload
        }

        /// `<- e, ee, s, es`, with an encrypted payload.
        mutating func writeMessage2(payload: [UInt8]) throws(Failure) -> [UInt8] {
            guard role == .responder, case .second(let re?) = step else { throw .outOfTurn }
            symmetric.mixHash(localEphemeral.publicKey)
            guard let ee = Sodium.x25519(localEphemeral.secret, re) else { throw .badPublicKey }
            symmetric.mixKey(ee)
            let s = symmetric.encryptAndHash(localStatic.publicKey)
            guard let es = Sodium.x25519(localStatic.secret, re) else { throw .badPublicKey }
            symmetric.mixKey(es)
            let p = symmetric.encryptAndHash(payload)
            step = .third(remoteEphemeral: re, remoteStatic: nil)
            return localEphemeral.publicKey + s + p
        }

        /// `-> s, se`: returns the initiator's static key, its payload and the finished handshake.
        mutating func readMessage3(_ m: [UInt8]) throws(Failure) -> (payload: [UInt8], result: Result) {
            guard role == .responder, case .third(let re, nil) = step else { throw .outOfTurn }
            guard m.count >= 48 + Sodium.tagSize else { throw .badLength(m.count) }
            _ = re
            let rs = try symmetric.decryptAndHash(Array(m[0..<48]))
            guard let se = Sodium.x25519(localEphemeral.secret, rs) else { throw .badPublicKey }
            symmetric.mixKey(se)
            let payload = try symmetric.decryptAndHash(Array(m[48...]))
            step = .done
            return (payload, finish(remoteStatic: rs))
        }

        private func finish(remoteStatic: [UInt8]) -> Result {
            let (c1, c2) = symmetric.split()
            let (d1, d2) = symmetric.derive(label: Noise.datagramLabel)
            let initiator = role == .initiator
            return Result(remoteStatic: remoteStatic, send: initiator ? c1 : c2, receive: initiator ? c2 : c1,
                          datagramSend: initiator ? d1 : d2, datagramReceive: initiator ? d2 : d1,
                          handshakeHash: symmetric.hash)
        }
    }
}
