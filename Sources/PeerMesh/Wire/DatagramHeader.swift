/// The header of every PeerMesh UDP datagram (20 bytes, big-endian):
///
/// | bytes | field |
/// |---|---|
/// | 0–1 | magic `PM` (0x50 0x4D) |
/// | 2 | protocol version (`peerMeshProtocolVersion`: 4) |
/// | 3 | kind: 1 data, 2 ping, 3 pong |
/// | 4–11 | the receiver's link token, chosen by the receiver during the handshake |
/// | 12–19 | the sender's per-link sequence number, starting at 1 |
///
/// Every datagram that is not taken is dropped and counted by why: a header that does not decode (magic, version,
/// kind) is malformed; a token or source address that matches no connected peer is a stranger's; one that does not
/// authenticate is unauthentic; a sequence number the replay window has seen, or has moved past, is a duplicate.
struct DatagramHeader: Equatable, Sendable {
    enum Kind: UInt8, Sendable { case data = 1, ping = 2, pong = 3 }

    static let size = 20
    static let magic0: UInt8 = 0x50
    static let magic1: UInt8 = 0x4d

    var kind: Kind
    var token: UInt64
    var sequence: UInt64

    /// Writes the header into the first 20 bytes of `out`.
    func write(to out: UnsafeMutableRawBufferPointer) {
        precondition(out.count >= Self.size)
        out[0] = Self.magic0; out[1] = Self.magic1; out[2] = peerMeshProtocolVersion; out[3] = kind.rawValue
        for i in 0..<8 { out[4 + i] = UInt8((token >> UInt64(56 - 8 * i)) & 0xff) }
        for i in 0..<8 { out[12 + i] = UInt8((sequence >> UInt64(56 - 8 * i)) & 0xff) }
    }

    enum DecodeError: Error, Equatable { case short, badMagic, badVersion, badKind }

    /// Parses a header; pure, never traps.
    static func decode(_ d: UnsafeRawBufferPointer) -> Result<DatagramHeader, DecodeError> {
        var r = ByteReader(d)
        guard d.count >= size, let m0 = r.u8(), let m1 = r.u8(), let v = r.u8(), let k = r.u8(),
              let token = r.u64(), let seq = r.u64() else { return .failure(.short) }
        guard m0 == magic0, m1 == magic1 else { return .failure(.badMagic) }
        guard v == peerMeshProtocolVersion else { return .failure(.badVersion) }
        guard let kind = Kind(rawValue: k) else { return .failure(.badKind) }
        return .success(DatagramHeader(kind: kind, token: token, sequence: seq))
    }
}
