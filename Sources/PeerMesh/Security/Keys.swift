/// A peer's long-term public key: X25519, 32 bytes. It is what trust is pinned to; names are only labels.
public struct PublicKey: Hashable, Sendable, Codable, CustomStringConvertible {
    /// The 32 key bytes.
    public let bytes: [UInt8]

    /// Wraps 32 bytes; nil for any other length, and for a key that is not in X25519's canonical form.
    public init?(bytes: [UInt8]) {
        guard bytes.count == 32, Self.isCanonical(bytes) else { return nil }
        self.bytes = bytes
    }

    /// Whether `bytes` (32, little-endian) is a field element below 2²⁵⁵ − 19 with the top bit clear: the only form
    /// X25519 produces. X25519 ignores the top bit and reduces the rest, so one secret key has other encodings of
    /// its public key; each would hash to another fingerprint and identity, letting one key owner pass for several
    /// peers. Those are refused wherever a key comes in (the handshake, `_k`, connection data, the trust store).
    static func isCanonical(_ bytes: [UInt8]) -> Bool {
        guard bytes[31] & 0x80 == 0 else { return false }
        // 2²⁵⁵ − 19 … 2²⁵⁵ − 1: 0x7f, then thirty 0xff, then the low byte ≥ 0xed.
        guard bytes[31] == 0x7f, bytes[1...30].allSatisfy({ $0 == 0xff }) else { return true }
        return bytes[0] < 0xed
    }

    /// Parses the 64 lower- or upper-case hex digits of `hex`. Anything else — other characters, other lengths,
    /// 64 bytes of UTF-8 that are fewer than 64 characters (a TXT record can hold any bytes) — is nil.
    public init?(hex: some StringProtocol) {
        let digits = Array(hex.utf8)
        guard digits.count == 64 else { return nil }
        func value(_ c: UInt8) -> UInt8? {
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
            default: nil
            }
        }
        var out: [UInt8] = []
        out.reserveCapacity(32)
        var i = 0
        while i < 64 {
            guard let hi = value(digits[i]), let lo = value(digits[i + 1]) else { return nil }
            out.append(hi << 4 | lo)
            i += 2
        }
        guard Self.isCanonical(out) else { return nil }
        bytes = out
    }

    /// The key as 64 lower-case hex digits (the TXT record's `_k`).
    public var hex: String { bytes.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined() }

    /// The key's fingerprint: BLAKE2b-256 over a domain label and the key. What people compare.
    public var fingerprint: [UInt8] { Sodium.blake2b(Array("PeerMesh key fingerprint v2".utf8) + bytes, length: 32) }

    /// The fingerprint as 52 base32 characters in groups of four (`abcd-efgh-…`).
    public var fingerprintString: String { PublicKey.grouped(Base32.encode(fingerprint)) }

    /// The first 8 base32 characters of the fingerprint (`abcd-efgh`): what a list or a prompt shows.
    public var shortFingerprint: String { PublicKey.grouped(String(Base32.encode(fingerprint).prefix(8))) }

    /// The 64-bit identity a key gives its `PeerID`: the first 8 bytes of the fingerprint, never 0.
    public var identity: UInt64 {
        let f = fingerprint
        let v = f[0..<8].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        return v == 0 ? 1 : v
    }

    /// Whether `text` is a prefix of this key's fingerprint (dashes and case ignored): how people name a key.
    public func matches(fingerprintPrefix text: String) -> Bool {
        let wanted = text.lowercased().filter { $0 != "-" && $0 != ":" && $0 != " " }
        guard wanted.count >= 4 else { return false }
        return Base32.encode(fingerprint).hasPrefix(wanted)
    }

    public var description: String { shortFingerprint }

    private static func grouped(_ s: String) -> String {
        var out = ""
        for (i, c) in s.enumerated() {
            if i > 0, i % 4 == 0 { out.append("-") }
            out.append(c)
        }
        return out
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.singleValueContainer()
        let text = try c.decode(String.self)
        guard let k = PublicKey(hex: text) else {
            throw DecodingError.dataCorruptedError(in: c, debugDescription: "a public key is 64 hex digits")
        }
        self = k
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(hex)
    }
}

/// RFC 4648 base32, lower case, without padding: for fingerprints people read out.
enum Base32 {
    private static let alphabet = Array("abcdefghijklmnopqrstuvwxyz234567")

    static func encode(_ bytes: [UInt8]) -> String {
        var out = ""
        var buffer: UInt32 = 0
        var bits = 0
        for b in bytes {
            buffer = buffer << 8 | UInt32(b)
            bits += 8
            while bits >= 5 {
                out.append(alphabet[Int((buffer >> UInt32(bits - 5)) & 31)])
                bits -= 5
            }
        }
        if bits > 0 { out.append(alphabet[Int((buffer << UInt32(5 - bits)) & 31)]) }
        return out
    }
}
