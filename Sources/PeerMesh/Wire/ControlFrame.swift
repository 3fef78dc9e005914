import FoundationEssentials

/// Version of the PeerMesh wire protocol carried in every HELLO and datagram. See docs/PROTOCOL.md.
public let peerMeshProtocolVersion: UInt8 = 4

/// Why an invitation was declined, carried in a DECLINE frame.
public enum DeclineReason: UInt8, Sendable, Equatable, CustomStringConvertible {
    /// The invited app said no.
    case declined = 1
    /// The session already holds its maximum number of peers.
    case peerLimit = 2
    /// The invitation's timeout expired before an answer.
    case timedOut = 3
    /// Both peers invited each other at once; the other invitation wins (see docs/PROTOCOL.md).
    case simultaneousInvite = 4
    /// The peer is already connected to this session.
    case alreadyConnected = 5
    /// The invitation could not be delivered (the advertiser stopped, the frame was malformed…).
    case unavailable = 6
    /// The invited peer does not trust this peer's key (not paired); asking again will not help. A session also
    /// reports its own invitation failed with this reason when its certificate check refused the invitee's key.
    case notTrusted = 7

    /// Whether asking again later could succeed: declined, unknown keys and duplicates are answers, not accidents.
    public var isPermanent: Bool {
        switch self {
        case .declined, .notTrusted, .alreadyConnected: true
        case .peerLimit, .timedOut, .simultaneousInvite, .unavailable: false
        }
    }

    public var description: String {
        switch self {
        case .declined: "declined by the invited peer"
        case .peerLimit: "the session is full (peer limit reached)"
        case .timedOut: "the invitation timed out"
        case .simultaneousInvite: "simultaneous invitations; the other one wins"
        case .alreadyConnected: "already connected"
        case .unavailable: "the invited peer is not available"
        case .notTrusted: "the keys are not trusted (not paired)"
        }
    }
}

/// One message on a PeerMesh TCP connection: control (HELLO, INVITE, ACCEPT, DECLINE, HEARTBEAT, GOODBYE) or a
/// reliable DATA message. Framing: `u32 length` (big-endian, counts the type byte and the body) then `u8 type`
/// then the body.
enum ControlFrame: Equatable, Sendable {
    /// First frame each side sends: who it is.
    case hello(peer: PeerID)
    /// Inviter → invitee: join my session.
    case invite(InviteBody)
    /// Invitee → inviter: joined.
    case accept(udpPort: UInt16, token: UInt64)
    /// Invitee → inviter: not joining, and why.
    case decline(DeclineReason, String)
    /// An application message sent with `.reliable`.
    case data([UInt8])
    /// Liveness, sent every heartbeat interval.
    case heartbeat
    /// Clean departure; the peer is `notConnected` at once.
    case goodbye
    /// A resource transfer's frame (`Session.sendResource`).
    case resource(ResourceFrame)
    /// A byte stream's frame (`Session.startStream`).
    case stream(StreamFrame)
    /// A full-mesh introduction's frame.
    case mesh(MeshFrame)
    /// A relay pipe's frame (members that cannot reach each other, through one both reach).
    case relay(RelayFrame)
    /// An unreliable message carried on the connection: how a relayed link, which has no UDP path, carries
    /// `.unreliable` sends. 1 byte or more.
    case datagram([UInt8])
    /// Responder → initiator, once, inside the encrypted channel: the nonce the responder committed to in handshake
    /// message 2, opened when the responder's app shows the digits or its session lets the initiator in (the initiator's short authentication
    /// string needs it). `SecureChannel` sends and takes it; owners never see it. Exactly 32 bytes.
    case sasNonce([UInt8])

    struct InviteBody: Equatable, Sendable {
        var context: [UInt8]
        var timeoutMillis: UInt32
        var udpPort: UInt16
        var token: UInt64
    }

    enum Kind: UInt8 {
        case hello = 1, invite = 2, accept = 3, decline = 4, data = 5, heartbeat = 6, goodbye = 7
        case resourceStart = 8, resourceChunk = 9, resourceEnd = 10, resourceCancel = 11, resourceResult = 12
        case streamOpen = 13, streamData = 14, streamCredit = 15, streamClose = 16
        case meshIntroRequest = 17, meshIntroData = 18, meshIntroduce = 19
        case relayRequest = 20, relayIncoming = 21, relayData = 22, relayCredit = 23, relayClose = 24
        case datagram = 25
        case sasNonce = 26
        case meshRelink = 27
    }

    /// The frame's name, for diagnostics.
    var name: String {
        switch self {
        case .hello: "HELLO"
        case .invite: "INVITE"
        case .accept: "ACCEPT"
        case .decline: "DECLINE"
        case .data: "DATA"
        case .heartbeat: "HEARTBEAT"
        case .goodbye: "GOODBYE"
        case .resource(let r): r.name
        case .stream(let f): f.name
        case .mesh(let f): f.name
        case .relay(let f): f.name
        case .datagram: "DATAGRAM"
        case .sasNonce: "SAS-NONCE"
        }
    }

    /// `PMSH`, the first bytes of a HELLO body.
    static let magic: [UInt8] = [0x50, 0x4d, 0x53, 0x48]
    /// Largest frame (type byte + body) accepted: 16 MiB. Larger lengths mean garbage; the connection is closed.
    static let maximumFrameLength = 16 << 20
    /// Largest reliable message: the frame limit less the type byte.
    static let maximumReliableMessage = maximumFrameLength - 1
    /// Largest invitation context.
    static let maximumContext = 65_535
    /// Longest decline text.
    static let maximumDeclineText = 1_024

    /// The frame with its length prefix, ready to write.
    func encoded() -> [UInt8] {
        var w = ByteWriter(capacity: 16)
        w.u32(0)
        switch self {
        case .hello(let peer):
            w.u8(Kind.hello.rawValue)
            w.raw(Self.magic)
            w.u8(peerMeshProtocolVersion)
            w.u64(peer.identity)
            let name = Array(peer.displayName.utf8)
            w.u8(UInt8(name.count))
            w.raw(name)
        case .invite(let b):
            w.u8(Kind.invite.rawValue)
            w.u32(b.timeoutMillis)
            w.u16(b.udpPort)
            w.u64(b.token)
            w.u16(UInt16(b.context.count))
            w.raw(b.context)
        case .accept(let port, let token):
            w.u8(Kind.accept.rawValue)
            w.u16(port)
            w.u64(token)
        case .decline(let reason, let text):
            w.u8(Kind.decline.rawValue)
            w.u8(reason.rawValue)
            // Cut on a character boundary: a split UTF-8 sequence would make the frame undecodable.
            let t = Array(text.utf8.prefix(Self.maximumDeclineText)).cutToCharacterBoundary()
            w.u16(UInt16(t.count))
            w.raw(t)
        case .data(let payload):
            w.u8(Kind.data.rawValue)
            w.raw(payload)
        case .heartbeat:
            w.u8(Kind.heartbeat.rawValue)
        case .goodbye:
            w.u8(Kind.goodbye.rawValue)
        case .resource(let r):
            r.encode(into: &w)
        case .stream(let f):
            f.encode(into: &w)
        case .mesh(let f):
            f.encode(into: &w)
        case .relay(let f):
            f.encode(into: &w)
        case .datagram(let payload):
            w.u8(Kind.datagram.rawValue)
            w.raw(payload)
        case .sasNonce(let nonce):
            w.u8(Kind.sasNonce.rawValue)
            w.raw(nonce)
        }
        var out = w.bytes
        let length = UInt32(out.count - 4)
        out[0] = UInt8(length >> 24); out[1] = UInt8((length >> 16) & 0xff)
        out[2] = UInt8((length >> 8) & 0xff); out[3] = UInt8(length & 0xff)
        return out
    }

    /// Why a frame could not be decoded. Any of these closes the connection.
    enum DecodeError: Error, Equatable, Sendable, CustomStringConvertible {
        case unknownType(UInt8)
        case truncated
        case badMagic
        case unsupportedVersion(UInt8)
        case badField(String)
        case trailingBytes
        case oversize(Int)

        var description: String {
            switch self {
            case .unknownType(let t): "unknown frame type \(t)"
            case .truncated: "truncated frame"
            case .badMagic: "bad HELLO magic"
            case .unsupportedVersion(let v): "protocol version \(v) (this build speaks \(peerMeshProtocolVersion))"
            case .badField(let f): "bad \(f) field"
            case .trailingBytes: "trailing bytes after a frame"
            case .oversize(let n): "frame length \(n) out of range"
            }
        }
    }

    /// Decodes one frame body (type byte + body, without the length prefix). Pure; never traps.
    static func decode(body: UnsafeRawBufferPointer) -> Result<ControlFrame, DecodeError> {
        var r = ByteReader(body)
        guard let type = r.u8() else { return .failure(.truncated) }
        guard let kind = Kind(rawValue: type) else { return .failure(.unknownType(type)) }
        let frame: ControlFrame
        switch kind {
        case .hello:
            guard let m = r.bytes(4) else { return .failure(.truncated) }
            guard Array(m) == magic else { return .failure(.badMagic) }
            guard let version = r.u8() else { return .failure(.truncated) }
            guard version == peerMeshProtocolVersion else { return .failure(.unsupportedVersion(version)) }
            guard let id = r.u64(), let n = r.u8(), let nameBytes = r.bytes(Int(n)) else { return .failure(.truncated) }
            guard let name = String(validating: nameBytes, as: UTF8.self),
                  let peer = try? PeerID(displayName: name, identity: id), id != 0
            else { return .failure(.badField("peer")) }
            frame = .hello(peer: peer)
        case .invite:
            guard let t = r.u32(), let port = r.u16(), let token = r.u64(), let n = r.u16(),
                  let ctx = r.bytes(Int(n)) else { return .failure(.truncated) }
            frame = .invite(InviteBody(context: Array(ctx), timeoutMillis: t, udpPort: port, token: token))
        case .accept:
            guard let port = r.u16(), let token = r.u64() else { return .failure(.truncated) }
            frame = .accept(udpPort: port, token: token)
        case .decline:
            guard let raw = r.u8(), let n = r.u16(), let t = r.bytes(Int(n)) else { return .failure(.truncated) }
            guard let reason = DeclineReason(rawValue: raw) else { return .failure(.badField("reason")) }
            guard n <= Self.maximumDeclineText, let text = String(validating: t, as: UTF8.self) else {
                return .failure(.badField("text"))
            }
            frame = .decline(reason, text)
        case .data:
            frame = .data(Array(r.rest()))
        case .heartbeat:
            frame = .heartbeat
        case .goodbye:
            frame = .goodbye
        case .resourceStart, .resourceChunk, .resourceEnd, .resourceCancel, .resourceResult:
            switch ResourceFrame.decode(kind, &r) {
            case .success(let f): frame = .resource(f)
            case .failure(let e): return .failure(e)
            }
        case .streamOpen, .streamData, .streamCredit, .streamClose:
            switch StreamFrame.decode(kind, &r) {
            case .success(let f): frame = .stream(f)
            case .failure(let e): return .failure(e)
            }
        case .meshIntroRequest, .meshIntroData, .meshIntroduce, .meshRelink:
            switch MeshFrame.decode(kind, &r) {
            case .success(let f): frame = .mesh(f)
            case .failure(let e): return .failure(e)
            }
        case .relayRequest, .relayIncoming, .relayData, .relayCredit, .relayClose:
            switch RelayFrame.decode(kind, &r) {
            case .success(let f): frame = .relay(f)
            case .failure(let e): return .failure(e)
            }
        case .datagram:
            let payload = r.rest()
            // What a relayed link carries is what a UDP datagram would: 1 to `Session.maximumDatagramSize` bytes.
            guard (1...Session.maximumDatagramSize).contains(payload.count) else { return .failure(.badField("datagram length")) }
            frame = .datagram(Array(payload))
        case .sasNonce:
            guard let nonce = r.bytes(SecureChannel.nonceSize) else { return .failure(.truncated) }
            frame = .sasNonce(Array(nonce))
        }
        guard r.remaining == 0 else { return .failure(.trailingBytes) }
        return .success(frame)
    }
}

/// Splits a TCP byte stream into frame bodies. Pure: feed bytes, take frames; an error means the stream is
/// garbage and the connection must be closed.
struct FrameAssembler {
    private var buffer: [UInt8] = []
    private var start = 0
    /// Largest frame (type byte + body) accepted; a larger length means garbage.
    var maximumFrameLength: Int

    init(maximumFrameLength: Int = ControlFrame.maximumFrameLength) {
        self.maximumFrameLength = maximumFrameLength
    }

    mutating func append(_ bytes: UnsafeRawBufferPointer) {
        if start > 0, start == buffer.count { buffer.removeAll(keepingCapacity: true); start = 0 }
        buffer.append(contentsOf: bytes)
    }

    /// The next complete frame, `nil` when more bytes are needed, or an error for an impossible length.
    mutating func next() -> Result<ControlFrame, ControlFrame.DecodeError>? {
        let available = buffer.count - start
        guard available >= 4 else { return nil }
        let length = Int(buffer[start]) << 24 | Int(buffer[start + 1]) << 16 | Int(buffer[start + 2]) << 8 | Int(buffer[start + 3])
        guard length >= 1, length <= maximumFrameLength else { return .failure(.oversize(length)) }
        guard available >= 4 + length else { return nil }
        let result = buffer.withUnsafeBytes { raw in
            ControlFrame.decode(body: UnsafeRawBufferPointer(rebasing: raw[(start + 4)..<(start + 4 + length)]))
        }
        start += 4 + length
        if start > 65_536, start * 2 > buffer.count {
            buffer.removeFirst(start)
            start = 0
        }
        return result
    }

    /// Bytes received but not yet framed.
    var pendingBytes: [UInt8] { Array(buffer[start...]) }
}
