/// The frames of a relay pipe: a byte pipe between two members of a full-mesh session that cannot reach each other,
/// spliced by a member both are connected to. The pipe carries an ordinary PeerMesh connection (preamble, Noise XX,
/// records), so the splicing member sees only ciphertext. See docs/PROTOCOL.md §3.9.
///
/// Each pipe is numbered on each link by the side that opened it there; DATA, CREDIT and CLOSE say whether their
/// sender is that side (`opener`), so both sides may number pipes without colliding.
enum RelayFrame: Equatable, Sendable {
    /// Member → introducer: open pipe `pipe` to `peer`, a member you are connected to.
    case request(pipe: UInt32, peer: PeerID)
    /// Introducer → member: `peer` calls you through pipe `pipe`.
    case incoming(pipe: UInt32, peer: PeerID)
    /// The next 1…`maximumData` bytes of the pipe, never more than the far end's window allows.
    case data(pipe: UInt32, opener: Bool, bytes: [UInt8])
    /// The far end took `bytes` more off the pipe: the sender may send that many more.
    case credit(pipe: UInt32, opener: Bool, bytes: UInt32)
    /// The pipe is closed (or refused); answered with a CLOSE, after which the id may be reused.
    case close(pipe: UInt32, opener: Bool)

    /// Bytes per DATA at most.
    static let maximumData = 32_768
    /// Bytes one direction of a pipe may have in flight (sent and not yet credited), end to end.
    static let window = 256 << 10

    var name: String {
        switch self {
        case .request: "RELAY_REQUEST"
        case .incoming: "RELAY_INCOMING"
        case .data: "RELAY_DATA"
        case .credit: "RELAY_CREDIT"
        case .close: "RELAY_CLOSE"
        }
    }

    func encode(into w: inout ByteWriter) {
        switch self {
        case .request(let pipe, let peer):
            w.u8(ControlFrame.Kind.relayRequest.rawValue)
            w.u32(pipe)
            MeshFrame.write(peer, into: &w)
        case .incoming(let pipe, let peer):
            w.u8(ControlFrame.Kind.relayIncoming.rawValue)
            w.u32(pipe)
            MeshFrame.write(peer, into: &w)
        case .data(let pipe, let opener, let bytes):
            w.u8(ControlFrame.Kind.relayData.rawValue)
            w.u32(pipe)
            w.u8(opener ? 1 : 0)
            w.raw(bytes)
        case .credit(let pipe, let opener, let bytes):
            w.u8(ControlFrame.Kind.relayCredit.rawValue)
            w.u32(pipe)
            w.u8(opener ? 1 : 0)
            w.u32(bytes)
        case .close(let pipe, let opener):
            w.u8(ControlFrame.Kind.relayClose.rawValue)
            w.u32(pipe)
            w.u8(opener ? 1 : 0)
        }
    }

    /// Decodes the body of a relay frame of kind `kind` (the reader is past the type byte). Pure; never traps.
    static func decode(_ kind: ControlFrame.Kind, _ r: inout ByteReader) -> Result<RelayFrame, ControlFrame.DecodeError> {
        guard let pipe = r.u32() else { return .failure(.truncated) }
        switch kind {
        case .relayRequest:
            return MeshFrame.readPeer(&r).map { .request(pipe: pipe, peer: $0) }
        case .relayIncoming:
            return MeshFrame.readPeer(&r).map { .incoming(pipe: pipe, peer: $0) }
        default:
            break
        }
        guard let side = r.u8() else { return .failure(.truncated) }
        guard side <= 1 else { return .failure(.badField("relay side")) }
        switch kind {
        case .relayData:
            let bytes = r.rest()
            guard (1...maximumData).contains(bytes.count) else { return .failure(.badField("relay data length")) }
            return .success(.data(pipe: pipe, opener: side == 1, bytes: Array(bytes)))
        case .relayCredit:
            guard let n = r.u32() else { return .failure(.truncated) }
            guard n > 0, n <= UInt32(window) else { return .failure(.badField("relay credit")) }
            return .success(.credit(pipe: pipe, opener: side == 1, bytes: n))
        case .relayClose:
            return .success(.close(pipe: pipe, opener: side == 1))
        default:
            return .failure(.unknownType(kind.rawValue))
        }
    }
}
