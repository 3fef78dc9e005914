import FoundationEssentials

/// A network address at which a peer's advertiser accepts invitations (TCP): a host — numeric IPv4 or IPv6 (with
/// `%scope` when link-local) or a name to resolve — and a port.
public struct PeerEndpoint: Hashable, Sendable, CustomStringConvertible {
    /// Numeric address, e.g. `127.0.0.1` or `fe80::1%eth0`, or a name to resolve.
    public var host: String
    /// TCP port of the advertiser (and, by default, of the session's UDP socket).
    public var port: UInt16

    /// The endpoint at `host`, `port`.
    public init(host: String, port: UInt16) {
        self.host = host
        self.port = port
    }

    /// Parses `host:port` (or `[v6]:port`).
    public init?(parsing s: String) {
        var hostPart: Substring
        let portPart: Substring
        if s.hasPrefix("["), let close = s.firstIndex(of: "]") {
            hostPart = s[s.index(after: s.startIndex)..<close]
            let after = s[s.index(after: close)...]
            guard after.hasPrefix(":") else { return nil }
            portPart = after.dropFirst()
        } else {
            guard let colon = s.lastIndex(of: ":") else { return nil }
            hostPart = s[..<colon]
            portPart = s[s.index(after: colon)...]
            // An IPv6 host must be bracketed: "fe80::1" is not host "fe80:" port 1.
            guard !hostPart.contains(":") else { return nil }
        }
        if hostPart == "localhost" { hostPart = "127.0.0.1" }
        // Digits only (`UInt16` alone takes "+80"); no stray bracket in the host ("[::1:80").
        guard !hostPart.isEmpty, !hostPart.contains("["), !hostPart.contains("]"),
              portPart.allSatisfy({ $0.isASCII && $0.isNumber }), let p = UInt16(portPart), p != 0 else { return nil }
        self.init(host: String(hostPart), port: p)
    }

    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// What an advertiser publishes through a `DiscoveryBackend`.
public struct ServiceAdvertisement: Sendable, Equatable {
    /// The advertising peer.
    public var peer: PeerID
    /// The MC-style service type, e.g. `mesh-audio` (published as `_mesh-audio._tcp`).
    public var serviceType: String
    /// The advertiser's TCP port.
    public var port: UInt16
    /// The app's discovery info.
    public var discoveryInfo: [String: String]

    /// What `peer`'s advertiser publishes for `serviceType` on `port`.
    public init(peer: PeerID, serviceType: String, port: UInt16, discoveryInfo: [String: String]) {
        self.peer = peer
        self.serviceType = serviceType
        self.port = port
        self.discoveryInfo = discoveryInfo
    }

    /// The DNS-SD TXT record: `_v` protocol version, `_d` display name, then discovery info with keys that start
    /// with `_` escaped by one more `_` (MC's convention).
    public var txtRecord: [String] { TXTRecord.encode(peer: peer, discoveryInfo: discoveryInfo) }
}

/// A peer seen by a browser.
public struct DiscoveredPeer: Sendable, Equatable {
    /// The peer, from the instance name (identity) and `_d` (display name).
    public var peer: PeerID
    /// Its discovery info, unescaped.
    public var discoveryInfo: [String: String]
    /// Addresses at which its advertiser answers, best first.
    public var endpoints: [PeerEndpoint]

    /// `peer` as a browser found it, at `endpoints` (best first).
    public init(peer: PeerID, discoveryInfo: [String: String], endpoints: [PeerEndpoint]) {
        self.peer = peer
        self.discoveryInfo = discoveryInfo
        self.endpoints = endpoints
    }
}

/// An event from a browse.
public enum BrowseEvent: Sendable, Equatable {
    /// A peer appeared, or its endpoints or info changed.
    case found(DiscoveredPeer)
    /// A peer's last advertisement went away.
    case lost(PeerID)
    /// Browsing cannot go on (the daemon is gone and not coming back…). The text says what to do.
    case failed(PeerMeshError)
}

/// An event from a publication.
public enum PublicationEvent: Sendable, Equatable {
    /// The advertisement is live (possibly under an alternative instance name after a collision).
    case published(instanceName: String)
    /// avahi-daemon is not running (yet, or any more): the advertisement goes out as soon as it is.
    case waitingForDaemon
    /// Publishing failed; the text says what to do.
    case failed(PeerMeshError)
}

/// A running publication or browse. `cancel()` (or releasing it) withdraws it.
public protocol DiscoveryRegistration: AnyObject, Sendable {
    func cancel()
}

/// The discovery protocol: how advertisers publish and browsers find peers.
///
/// Session code never depends on a particular backend. PeerMesh ships `InProcessDiscovery` (tests, direct use)
/// and `AvahiDiscovery` (DNS-SD through avahi-daemon). Events for one registration are delivered in order, off
/// the caller's thread.
public protocol DiscoveryBackend: Sendable {
    /// Publishes `advertisement` until the returned registration is cancelled.
    func publish(_ advertisement: ServiceAdvertisement,
                 onEvent: @escaping @Sendable (PublicationEvent) -> Void) throws(PeerMeshError) -> any DiscoveryRegistration
    /// Browses for `serviceType`, ignoring `localPeer`'s own advertisement.
    func browse(serviceType: String, localPeer: PeerID,
                onEvent: @escaping @Sendable (BrowseEvent) -> Void) throws(PeerMeshError) -> any DiscoveryRegistration
}

/// The TXT-record codec shared by all discovery backends (MC's conventions, plus PeerMesh's keys).
public enum TXTRecord {
    /// Key of the protocol version.
    public static let versionKey = "_v"
    /// Key of the display name.
    public static let displayNameKey = "_d"
    /// Key of the advertiser's public key (64 hex digits): browsers pin the key, and the handshake proves it.
    public static let publicKeyKey = "_k"

    /// Encodes the record as `key=value` strings.
    public static func encode(peer: PeerID, discoveryInfo: [String: String]) -> [String] {
        var out = ["\(versionKey)=\(peerMeshProtocolVersion)", "\(displayNameKey)=\(peer.displayName)"]
        if let key = peer.publicKey { out.append("\(publicKeyKey)=\(key.hex)") }
        for key in discoveryInfo.keys.sorted() {
            let escaped = key.hasPrefix("_") ? "_" + key : key
            out.append("\(escaped)=\(discoveryInfo[key]!)")
        }
        return out
    }

    /// Why a TXT record was rejected.
    public enum DecodeError: Error, Equatable, CustomStringConvertible {
        case badInstanceName(String)
        case missingKey(String)
        case unsupportedVersion(String)
        case badDisplayName(String)
        case badPublicKey(String)

        public var description: String {
            switch self {
            case .badInstanceName(let n): "instance name \"\(n)\" is not a 16-hex-digit peer identity"
            case .missingKey(let k): "TXT record lacks required key \(k)"
            case .unsupportedVersion(let v): "TXT record has protocol version \(v); this build speaks \(peerMeshProtocolVersion)"
            case .badDisplayName(let n): "TXT display name \"\(n)\" is not 1–63 UTF-8 bytes"
            case .badPublicKey(let k): "TXT public key \"\(k.prefix(80))\" is not 64 hex digits whose fingerprint is the instance name"
            }
        }
    }

    /// Decodes an instance name and TXT strings back into a peer and its discovery info. Pure; never traps.
    public static func decode(instanceName: String, txt: [String]) -> Result<(PeerID, [String: String]), DecodeError> {
        guard let identity = PeerID.identity(fromString: instanceName), identity != 0 else {
            return .failure(.badInstanceName(instanceName))
        }
        var version: String?
        var name: String?
        var keyText: String?
        var info: [String: String] = [:]
        for entry in txt {
            let key: Substring
            let value: Substring
            if let eq = entry.firstIndex(of: "=") {
                key = entry[..<eq]; value = entry[entry.index(after: eq)...]
            } else {
                key = entry[...]; value = ""
            }
            // RFC 6763 §6.4: an entry without a key is ignored, and only a key's first occurrence counts.
            if key.isEmpty { continue }
            if key == versionKey { if version == nil { version = String(value) } }
            else if key == displayNameKey { if name == nil { name = String(value) } }
            else if key == publicKeyKey { if keyText == nil { keyText = String(value) } }
            else if key.hasPrefix("__") { let k = String(key.dropFirst()); if info[k] == nil { info[k] = String(value) } }
            else if key.hasPrefix("_") { continue } // a future PeerMesh key: ignore
            else if info[String(key)] == nil { info[String(key)] = String(value) }
        }
        guard let version else { return .failure(.missingKey(versionKey)) }
        guard version == String(peerMeshProtocolVersion) else { return .failure(.unsupportedVersion(version)) }
        guard let name else { return .failure(.missingKey(displayNameKey)) }
        do { try PeerID.validate(displayName: name) } catch { return .failure(.badDisplayName(name)) }
        guard let keyText else { return .failure(.missingKey(publicKeyKey)) }
        // The instance name must be the key's identity: a record cannot claim one peer's identity with another key.
        guard let key = PublicKey(hex: keyText), key.identity == identity,
              let peer = try? PeerID(displayName: name, publicKey: key) else { return .failure(.badPublicKey(keyText)) }
        return .success((peer, info))
    }
}

/// MC's rules for service types and discovery info.
public enum DiscoveryValidation {
    /// Largest total of discovery info, in UTF-8 bytes of `key=value` strings (MC documents about 400 bytes).
    public static let maximumDiscoveryInfoBytes = 400
    /// Largest single `key=value`, in UTF-8 bytes (a DNS TXT string's limit).
    public static let maximumEntryBytes = 255

    /// 1–15 characters of `a-z`, `0-9` and `-`; at least one letter; no leading, trailing or double hyphen.
    public static func validate(serviceType: String) throws(PeerMeshError) {
        let chars = Array(serviceType.unicodeScalars)
        guard (1...15).contains(chars.count) else {
            throw .invalidServiceType("service type \"\(serviceType)\" must be 1–15 characters long")
        }
        for c in chars where !(("a"..."z").contains(c) || ("0"..."9").contains(c) || c == "-") {
            throw .invalidServiceType("service type \"\(serviceType)\" may contain only a-z, 0-9 and '-'")
        }
        guard chars.contains(where: { ("a"..."z").contains($0) }) else {
            throw .invalidServiceType("service type \"\(serviceType)\" must contain at least one letter")
        }
        guard chars.first != "-", chars.last != "-" else {
            throw .invalidServiceType("service type \"\(serviceType)\" must not begin or end with '-'")
        }
        guard !serviceType.contains("--") else {
            throw .invalidServiceType("service type \"\(serviceType)\" must not contain '--'")
        }
    }

    /// Each `key=value` at most 255 UTF-8 bytes, keys non-empty without `=`, about 400 bytes in all.
    public static func validate(discoveryInfo: [String: String]) throws(PeerMeshError) {
        var total = 0
        for (key, value) in discoveryInfo {
            guard !key.isEmpty, !key.contains("=") else {
                throw .invalidDiscoveryInfo("discovery info key \"\(key)\" must be non-empty and contain no '='")
            }
            let escapedKey = key.hasPrefix("_") ? "_" + key : key
            let size = escapedKey.utf8.count + 1 + value.utf8.count
            guard size <= maximumEntryBytes else {
                throw .invalidDiscoveryInfo("discovery info entry \"\(key)\" is \(size) bytes; each key=value must be at most \(maximumEntryBytes) UTF-8 bytes")
            }
            total += size
        }
        guard total <= maximumDiscoveryInfoBytes else {
            throw .invalidDiscoveryInfo("discovery info is \(total) bytes in all; at most \(maximumDiscoveryInfoBytes) UTF-8 bytes")
        }
    }
}
