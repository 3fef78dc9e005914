/// The frames that make a session a full mesh: a member introduces a newcomer to the others through the session,
/// and they connect directly with connection data (`NearbyConnectionData`) that pins their keys. See
/// docs/PROTOCOL.md §3.8.
enum MeshFrame: Equatable, Sendable {
    /// Introducer → member: `peer` joined me; make connection data that lets it connect to you. `members`: the
    /// identities of the introducer's other members, each asked about `peer` (at most `maximumListed`), so that the
    /// member, when `peer` comes, can tell which of its own members the introducer did not know of (docs/PROTOCOL.md
    /// §3.8). `fillsGap`: `peer` did not join the introducer but came to it by another member's introduction, whose
    /// request did not list the member asked now.
    case introRequest(peer: PeerID, members: [UInt64] = [], fillsGap: Bool = false)
    /// Member → introducer: connection data for the peer with identity `forIdentity` (empty: not needed).
    case introData(forIdentity: UInt64, data: [UInt8])
    /// Introducer → newcomer: connect to `peer` with `data`.
    case introduce(peer: PeerID, data: [UInt8])
    /// Member → member: my link to the member with identity `identity` ended without a GOODBYE (its socket closed,
    /// or it went silent for `peerTimeout`); if it is still your member, introduce us to each other again.
    case relink(identity: UInt64)

    /// Longest connection data carried.
    static let maximumData = 1_024
    /// Most members a MESH_INTRO_REQUEST lists (its count is a byte).
    static let maximumListed = 255

    var name: String {
        switch self {
        case .introRequest: "MESH_INTRO_REQUEST"
        case .introData: "MESH_INTRO_DATA"
        case .introduce: "MESH_INTRODUCE"
        case .relink: "MESH_RELINK"
        }
    }

    func encode(into w: inout ByteWriter) {
        switch self {
        case .introRequest(let peer, let members, let fillsGap):
            precondition(members.count <= Self.maximumListed, "MESH_INTRO_REQUEST lists at most 255 members")
            w.u8(ControlFrame.Kind.meshIntroRequest.rawValue)
            Self.write(peer, into: &w)
            w.u8(fillsGap ? 1 : 0)
            w.u8(UInt8(members.count))
            for id in members { w.u64(id) }
        case .introData(let id, let data):
            w.u8(ControlFrame.Kind.meshIntroData.rawValue)
            w.u64(id)
            w.raw(data)
        case .introduce(let peer, let data):
            w.u8(ControlFrame.Kind.meshIntroduce.rawValue)
            Self.write(peer, into: &w)
            w.raw(data)
        case .relink(let id):
            w.u8(ControlFrame.Kind.meshRelink.rawValue)
            w.u64(id)
        }
    }

    /// Writes a peer as mesh and relay frames carry it: name length u8 · name · public key (32).
    static func write(_ peer: PeerID, into w: inout ByteWriter) {
        let name = Array(peer.displayName.utf8)
        w.u8(UInt8(name.count))
        w.raw(name)
        w.raw(peer.publicKey?.bytes ?? [UInt8](repeating: 0, count: 32))
    }

    /// Reads a peer written by `write(_:into:)`.
    static func readPeer(_ r: inout ByteReader) -> Result<PeerID, ControlFrame.DecodeError> {
        guard let n = r.u8(), let nameBytes = r.bytes(Int(n)), let keyBytes = r.bytes(32) else { return .failure(.truncated) }
        guard let name = String(validating: nameBytes, as: UTF8.self), let key = PublicKey(bytes: Array(keyBytes)),
              let peer = try? PeerID(displayName: name, publicKey: key) else { return .failure(.badField("mesh peer")) }
        return .success(peer)
    }

    /// Decodes the body of a mesh frame of kind `kind` (the reader is past the type byte). Pure; never traps.
    static func decode(_ kind: ControlFrame.Kind, _ r: inout ByteReader) -> Result<MeshFrame, ControlFrame.DecodeError> {
        switch kind {
        case .meshIntroRequest:
            switch readPeer(&r) {
            case .failure(let e): return .failure(e)
            case .success(let peer):
                guard let fills = r.u8(), let n = r.u8() else { return .failure(.truncated) }
                guard fills <= 1 else { return .failure(.badField("mesh request purpose")) }
                var members: [UInt64] = []
                members.reserveCapacity(Int(n))
                for _ in 0..<n {
                    guard let id = r.u64() else { return .failure(.truncated) }
                    members.append(id)
                }
                return .success(.introRequest(peer: peer, members: members, fillsGap: fills == 1))
            }
        case .meshIntroData:
            guard let id = r.u64() else { return .failure(.truncated) }
            let data = r.rest()
            guard data.count <= maximumData else { return .failure(.badField("mesh data length")) }
            return .success(.introData(forIdentity: id, data: Array(data)))
        case .meshIntroduce:
            switch readPeer(&r) {
            case .failure(let e): return .failure(e)
            case .success(let peer):
                let data = r.rest()
                guard (1...maximumData).contains(data.count) else { return .failure(.badField("mesh data length")) }
                return .success(.introduce(peer: peer, data: Array(data)))
            }
        case .meshRelink:
            guard let id = r.u64() else { return .failure(.truncated) }
            return .success(.relink(identity: id))
        default:
            return .failure(.unknownType(kind.rawValue))
        }
    }
}
