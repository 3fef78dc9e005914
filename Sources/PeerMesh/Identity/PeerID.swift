import Foundation

/// A peer's identity in a PeerMesh session, the counterpart of MultipeerConnectivity's `MCPeerID`.
///
/// Equality and hashing use the random 64-bit `identity` only, so two peers may share a display name.
/// `PeerID` is `Codable`: persist it to reuse the same identity across launches.
public struct PeerID: Hashable, Sendable, Codable, CustomStringConvertible {
    /// The name people see, 1–63 UTF-8 bytes.
    public let displayName: String
    /// The random 64-bit value that identifies this peer.
    public let identity: UInt64

    /// Longest display name, in UTF-8 bytes (MC's limit, which is also a DNS label's).
    public static let maximumDisplayNameBytes = 63

    /// Creates a peer with a fresh random identity.
    /// - Throws: `PeerMeshError.invalidDisplayName` when `displayName` is empty or longer than 63 UTF-8 bytes.
    public init(displayName: String) throws(PeerMeshError) {
        try self.init(displayName: displayName, identity: UInt64.random(in: 1...UInt64.max))
    }

    /// Re-creates a known peer, for instance one decoded from the wire.
    public init(displayName: String, identity: UInt64) throws(PeerMeshError) {
        try PeerID.validate(displayName: displayName)
        self.displayName = displayName
        self.identity = identity
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

    public static func == (a: PeerID, b: PeerID) -> Bool { a.identity == b.identity }
    public func hash(into h: inout Hasher) { h.combine(identity) }

    public var description: String { "\(displayName) [\(identityString)]" }

    private enum CodingKeys: String, CodingKey { case displayName, identity }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let name = try c.decode(String.self, forKey: .displayName)
        let id = try c.decode(UInt64.self, forKey: .identity)
        do { try self.init(displayName: name, identity: id) } catch {
            throw DecodingError.dataCorruptedError(forKey: .displayName, in: c, debugDescription: error.description)
        }
    }
}
