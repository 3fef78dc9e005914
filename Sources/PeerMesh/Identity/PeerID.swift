import FoundationEssentials

/// A peer's identity in a PeerMesh session, the counterpart of MultipeerConnectivity's `MCPeerID`.
///
/// A peer has a long-term X25519 key pair; its 64-bit `identity` is derived from the public key (the first 8 bytes
/// of its fingerprint), so no one can claim an identity without the key — encrypted sessions prove it in the
/// handshake. Equality and hashing use `identity` only, so two peers may share a display name.
///
/// `PeerID(displayName:)` makes a fresh key pair for this run. To keep an identity across launches, persist a
/// `PeerIdentity` and use its `peerID`. A `PeerID` met on the network carries the peer's `publicKey` (when it came
/// from an encrypted handshake, the key is proven); one decoded from JSON carries no private key.
public struct PeerID: Hashable, Sendable, Codable, CustomStringConvertible {
    /// The name people see, 1–63 UTF-8 bytes.
    public let displayName: String
    /// The 64-bit value that identifies this peer, derived from its public key.
    public let identity: UInt64
    /// The peer's long-term public key, when known.
    public let publicKey: PublicKey?
    /// Our own key pair, for a local peer; nil for peers met on the network.
    let keys: Noise.KeyPair?

    /// Longest display name, in UTF-8 bytes (MC's limit, which is also a DNS label's).
    public static let maximumDisplayNameBytes = 63

    /// Creates a local peer with a fresh key pair (an identity for this run only).
    /// - Throws: `PeerMeshError.invalidDisplayName` when `displayName` is empty or longer than 63 UTF-8 bytes.
    public init(displayName: String) throws(PeerMeshError) {
        try PeerID.validate(displayName: displayName)
        let keys = Noise.KeyPair.generate()
        let key = PublicKey(bytes: keys.publicKey)!
        self.displayName = displayName
        identity = key.identity
        publicKey = key
        self.keys = keys
    }

    /// A local peer signing in with `keys`.
    init(displayName: String, keys: Noise.KeyPair) throws(PeerMeshError) {
        try PeerID.validate(displayName: displayName)
        let key = PublicKey(bytes: keys.publicKey)!
        self.displayName = displayName
        identity = key.identity
        publicKey = key
        self.keys = keys
    }

    /// A remote peer known by its public key (from a handshake or an advertisement): its identity follows from it.
    public init(displayName: String, publicKey: PublicKey) throws(PeerMeshError) {
        try PeerID.validate(displayName: displayName)
        self.displayName = displayName
        identity = publicKey.identity
        self.publicKey = publicKey
        keys = nil
    }

    /// Re-creates a peer known only by name and identity (an unencrypted session's peer, or one decoded from the
    /// wire): no key is known, so nothing about it is proven.
    public init(displayName: String, identity: UInt64) throws(PeerMeshError) {
        try PeerID.validate(displayName: displayName)
        self.displayName = displayName
        self.identity = identity
        publicKey = nil
        keys = nil
    }

    /// Checks the display-name rule.
    public static func validate(displayName: String) throws(PeerMeshError) {
        let bytes = displayName.utf8.count
        guard bytes >= 1, bytes <= maximumDisplayNameBytes else {
            throw .invalidDisplayName("display name must be 1–63 UTF-8 bytes, got \(bytes)")
        }
    }

    /// The identity as 16 lower-case hex digits: the DNS-SD instance name.
    public var identityString: String {
        let hex = String(identity, radix: 16)
        return String(repeating: "0", count: 16 - hex.count) + hex
    }

    /// Parses `identityString` back.
    public static func identity(fromString s: some StringProtocol) -> UInt64? {
        // Hex digits only: `UInt64(_:radix:)` alone would also take a sign ("+00000000000000a").
        guard s.utf8.count == 16, s.utf8.allSatisfy({ (0x30...0x39).contains($0) || (0x61...0x66).contains($0 | 0x20) })
        else { return nil }
        return UInt64(s, radix: 16)
    }

    /// The same peer under another display name (a host renamed; trust follows the key).
    func renamed(_ name: String) throws(PeerMeshError) -> PeerID {
        if let keys { return try PeerID(displayName: name, keys: keys) }
        if let publicKey { return try PeerID(displayName: name, publicKey: publicKey) }
        return try PeerID(displayName: name, identity: identity)
    }

    public static func == (a: PeerID, b: PeerID) -> Bool { a.identity == b.identity }
    public func hash(into h: inout Hasher) { h.combine(identity) }

    public var description: String { "\(displayName) [\(identityString)]" }

    private enum CodingKeys: String, CodingKey { case displayName, identity, publicKey }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let name = try c.decode(String.self, forKey: .displayName)
        let id = try c.decode(UInt64.self, forKey: .identity)
        let key = try c.decodeIfPresent(PublicKey.self, forKey: .publicKey)
        do {
            if let key {
                guard key.identity == id else {
                    throw DecodingError.dataCorruptedError(forKey: .identity, in: c,
                                                           debugDescription: "identity does not match the public key")
                }
                try self.init(displayName: name, publicKey: key)
            } else {
                try self.init(displayName: name, identity: id)
            }
        } catch let e as PeerMeshError {
            throw DecodingError.dataCorruptedError(forKey: .displayName, in: c, debugDescription: e.description)
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(displayName, forKey: .displayName)
        try c.encode(identity, forKey: .identity)
        try c.encodeIfPresent(publicKey, forKey: .publicKey)
    }
}
