/// A short pairing code, checked with a balanced PAKE (CPace over ristretto255) inside an encrypted session.
///
/// Pairing proves that both ends of one Noise channel know the same short code — without revealing it: an
/// eavesdropper learns nothing (the exchange runs inside the encrypted channel, and CPace leaks nothing even in
/// clear), and an active attacker gets exactly one guess per attempt (the advertiser closes its window after a few
/// failures). The channel binding (`Session.pairingBinding`) ties the code to this very handshake, so a proof
/// cannot be relayed to another connection. On success each side trusts the other's proven key.
///
/// Messages (each one reliable message on the session, after the invitation):
/// ```
/// initiator → responder   "PMP1" · 1 · Ya (32)
/// responder → initiator   "PMP1" · 2 · Yb (32) · tagB (32)
/// initiator → responder   "PMP1" · 3 · tagA (32)
/// responder → initiator   "PMP1" · 4 · result u8 (0 paired, 1 wrong code, 2 window closed)
/// ```
/// `G = ristretto255_from_hash(SHA-512("PeerMesh CPace v1" ‖ len(code) ‖ code ‖ binding))`, `Ya = ya·G`, `Yb = yb·G`,
/// `K = ya·Yb = yb·Ya`, `ISK = SHA-512("PeerMesh CPace ISK" ‖ binding ‖ K ‖ Ya ‖ Yb)`,
/// `tagB = HMAC-SHA-256(ISK, "B" ‖ Ya ‖ Yb)`, `tagA = HMAC-SHA-256(ISK, "A" ‖ Ya ‖ Yb)`.
public enum Pairing {
    /// The first bytes of every pairing message.
    static let magic: [UInt8] = Array("PMP1".utf8)

    /// How a pairing ended, from the responder's side (message 4).
    public enum Result: UInt8, Sendable, Equatable, CustomStringConvertible {
        case paired = 0
        case wrongCode = 1
        case windowClosed = 2
        /// The code was right, but the responder could not store the pairing (its disk): nothing was paired.
        case notStored = 3
        /// Other pairing attempts are being checked and hold the wrong codes left: try again in a moment.
        case busy = 4

        public var description: String {
            switch self {
            case .paired: "paired"
            case .wrongCode: "wrong pairing code"
            case .windowClosed: "the pairing window is closed"
            case .notStored: "the host could not store the pairing (see its log); nothing was paired"
            case .busy: "the host is checking other pairing attempts; try again in a moment"
            }
        }
    }

    /// Why a pairing message was refused.
    public enum Failure: Error, Equatable, Sendable, CustomStringConvertible {
        /// Not a pairing message, or one out of turn.
        case malformed
        /// The peer's group element is invalid or the identity.
        case badElement
        /// The peer's confirmation tag does not match: it does not know the code (or relayed another channel).
        case wrongCode

        public var description: String {
            switch self {
            case .malformed: "a malformed pairing message"
            case .badElement: "an invalid pairing element"
            case .wrongCode: "wrong pairing code"
            }
        }
    }

    /// A pairing code: 8 random digits, shown as `1234-5678`.
    public static func newCode() -> String {
        var digits = ""
        while digits.count < 8 {
            // Rejection sampling keeps the digits uniform.
            let b = Sodium.randomBytes(1)[0]
            if b < 250 { digits.append(Character(String(b % 10))) }
        }
        return String(digits.prefix(4)) + "-" + String(digits.suffix(4))
    }

    /// The code as it is compared: digits only (people type `1234 5678`, `12345678` or `1234-5678`).
    public static func normalize(_ code: String) -> String { code.filter { $0.isASCII && $0.isNumber } }

    static func generator(code: String, binding: [UInt8]) -> [UInt8] {
        let c = Array(normalize(code).utf8)
        return Sodium.ristrettoFromHash(Sodium.sha512([Array("PeerMesh CPace v1".utf8), [UInt8(c.count)], c, binding]))
    }

    /// Runs `body` with the ISK of an exchange where this side's scalar is `secret` and the peer's element is
    /// `peer` (`K = secret·peer`). K and the ISK are wiped when it returns; only what `body` makes of them leaves.
    /// - Throws: `Failure.badElement` when `peer` is invalid or K is the identity, and whatever `body` throws.
    static func withConfirmationKey<R>(secret: SecretKey, peer: [UInt8], binding: [UInt8], ya: [UInt8], yb: [UInt8],
                                       _ body: ([UInt8]) throws(Failure) -> R) throws(Failure) -> R {
        guard var k = Sodium.ristrettoMultiply(secret, peer) else { throw .badElement }
        defer { Sodium.wipe(&k) }
        var isk = Sodium.sha512([Array("PeerMesh CPace ISK".utf8), binding, k, ya, yb])
        defer { Sodium.wipe(&isk) }
        return try body(isk)
    }

    static func tag(_ isk: [UInt8], _ role: String, _ ya: [UInt8], _ yb: [UInt8]) -> [UInt8] {
        Sodium.hmacSHA256(key: isk, [Array(role.utf8), ya, yb])
    }

    /// The side that asks to pair (the player): message 1, then checks message 2 and answers with message 3.
    public struct Initiator: Sendable {
        private let binding: [UInt8]
        private let secret: SecretKey
        private let ya: [UInt8]
        private var done = false

        /// `binding` is the session's pairing binding for the peer (both sides compute the same bytes).
        public init(code: String, binding: [UInt8]) {
            self.binding = binding
            secret = Sodium.ristrettoRandomScalar()
            ya = Sodium.ristrettoMultiply(secret, Pairing.generator(code: code, binding: binding)) ?? []
        }

        /// Message 1.
        public var firstMessage: [UInt8] { Pairing.magic + [1] + ya }

        /// Reads message 2; returns message 3, or why the responder is not to be trusted.
        public mutating func answer(_ m2: [UInt8]) throws(Failure) -> [UInt8] {
            guard !done, m2.count == 4 + 1 + 64, Array(m2[0..<4]) == Pairing.magic, m2[4] == 2 else { throw .malformed }
            done = true
            let yb = Array(m2[5..<37]), tagB = Array(m2[37..<69])
            return try Pairing.withConfirmationKey(secret: secret, peer: yb, binding: binding, ya: ya, yb: yb) { isk throws(Failure) in
                guard Sodium.constantTimeEqual(tagB, Pairing.tag(isk, "B", ya, yb)) else { throw .wrongCode }
                return Pairing.magic + [3] + Pairing.tag(isk, "A", ya, yb)
            }
        }
    }

    /// The side that holds the window open (the host): answers message 1, then judges message 3.
    public struct Responder: Sendable {
        private let binding: [UInt8]
        private let g: [UInt8]
        private var expectedTagA: [UInt8]?

        public init(code: String, binding: [UInt8]) {
            self.binding = binding
            g = Pairing.generator(code: code, binding: binding)
        }

        /// Reads message 1; returns message 2.
        public mutating func answer(_ m1: [UInt8]) throws(Failure) -> [UInt8] {
            guard expectedTagA == nil, m1.count == 4 + 1 + 32, Array(m1[0..<4]) == Pairing.magic, m1[4] == 1 else {
                throw .malformed
            }
            let ya = Array(m1[5..<37])
            let secret = Sodium.ristrettoRandomScalar()
            guard let yb = Sodium.ristrettoMultiply(secret, g) else { throw .badElement }
            let (tagA, tagB) = try Pairing.withConfirmationKey(secret: secret, peer: ya, binding: binding, ya: ya, yb: yb) { isk in
                (Pairing.tag(isk, "A", ya, yb), Pairing.tag(isk, "B", ya, yb))
            }
            expectedTagA = tagA
            return Pairing.magic + [2] + yb + tagB
        }

        /// Reads message 3: whether the initiator knows the code.
        public func verify(_ m3: [UInt8]) throws(Failure) {
            guard let expected = expectedTagA, m3.count == 4 + 1 + 32, Array(m3[0..<4]) == Pairing.magic, m3[4] == 3 else {
                throw .malformed
            }
            guard Sodium.constantTimeEqual(Array(m3[5...]), expected) else { throw .wrongCode }
        }
    }

    /// Message 4: how it ended.
    public static func resultMessage(_ r: Result) -> [UInt8] { magic + [4, r.rawValue] }

    /// Reads message 4.
    public static func result(_ m: [UInt8]) -> Result? {
        guard m.count == 6, Array(m[0..<4]) == magic, m[4] == 4 else { return nil }
        return Result(rawValue: m[5])
    }

    /// Whether `message` is a pairing message (so an app can route it).
    public static func isPairingMessage(_ message: [UInt8]) -> Bool { message.count >= 5 && Array(message[0..<4]) == magic }
}
