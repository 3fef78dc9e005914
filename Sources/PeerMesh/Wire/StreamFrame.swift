/// The frames of a byte stream (`Session.startStream`), on the reliable connection inside its secure channel. The
/// writer names each of its streams with an `id` of its own; the reader answers with the writer's `id`. See
/// docs/PROTOCOL.md §3.4b.
///
/// Writer → reader: OPEN, DATA (never more than the reader's window allows), CLOSE(writer). Reader → writer:
/// CREDIT as the reader's app consumes bytes, CLOSE(reader) when it stops reading.
enum StreamFrame: Equatable, Sendable {
    /// A new stream named `name`.
    case open(id: UInt32, name: String)
    /// The next 1…`maximumData` bytes.
    case data(id: UInt32, bytes: [UInt8])
    /// The reader consumed `bytes` more: the writer may send that many more.
    case credit(id: UInt32, bytes: UInt32)
    /// One side ends the stream: the writer (`byWriter`, end of stream or failure) or the reader (it stops reading).
    case close(id: UInt32, byWriter: Bool, StreamEnd)

    /// Bytes per DATA at most.
    static let maximumData = 65_536
    /// The reader's window: bytes the writer may send beyond what the reader's app has consumed.
    static let window = 256 << 10

    var name: String {
        switch self {
        case .open: "STREAM_OPEN"
        case .data: "STREAM_DATA"
        case .credit: "STREAM_CREDIT"
        case .close: "STREAM_CLOSE"
        }
    }

    var id: UInt32 {
        switch self {
        case .open(let id, _), .data(let id, _), .credit(let id, _), .close(let id, _, _): id
        }
    }

    func encode(into w: inout ByteWriter) {
        switch self {
        case .open(let id, let name):
            w.u8(ControlFrame.Kind.streamOpen.rawValue)
            w.u32(id)
            let n = Array(name.utf8)
            w.u8(UInt8(n.count))
            w.raw(n)
        case .data(let id, let bytes):
            w.u8(ControlFrame.Kind.streamData.rawValue)
            w.u32(id)
            w.raw(bytes)
        case .credit(let id, let bytes):
            w.u8(ControlFrame.Kind.streamCredit.rawValue)
            w.u32(id)
            w.u32(bytes)
        case .close(let id, let byWriter, let end):
            w.u8(ControlFrame.Kind.streamClose.rawValue)
            w.u32(id)
            w.u8(byWriter ? 0 : 1)
            w.u8(end.rawValue)
        }
    }

    /// Decodes the body of a stream frame of kind `kind` (the reader is past the type byte). Pure; never traps.
    static func decode(_ kind: ControlFrame.Kind, _ r: inout ByteReader) -> Result<StreamFrame, ControlFrame.DecodeError> {
        guard let id = r.u32() else { return .failure(.truncated) }
        switch kind {
        case .streamOpen:
            guard let n = r.u8(), let nameBytes = r.bytes(Int(n)) else { return .failure(.truncated) }
            guard n > 0, let name = String(validating: nameBytes, as: UTF8.self) else { return .failure(.badField("stream name")) }
            return .success(.open(id: id, name: name))
        case .streamData:
            let bytes = r.rest()
            guard (1...maximumData).contains(bytes.count) else { return .failure(.badField("stream data length")) }
            return .success(.data(id: id, bytes: Array(bytes)))
        case .streamCredit:
            guard let n = r.u32() else { return .failure(.truncated) }
            guard n > 0, n <= UInt32(window) else { return .failure(.badField("stream credit")) }
            return .success(.credit(id: id, bytes: n))
        case .streamClose:
            guard let side = r.u8(), let raw = r.u8() else { return .failure(.truncated) }
            guard side <= 1 else { return .failure(.badField("stream side")) }
            guard let end = StreamEnd(rawValue: raw) else { return .failure(.badField("stream end")) }
            return .success(.close(id: id, byWriter: side == 0, end))
        default:
            return .failure(.unknownType(kind.rawValue))
        }
    }
}

/// How a byte stream ended.
public enum StreamEnd: UInt8, Sendable, Equatable, CustomStringConvertible {
    /// The writer closed it: every byte was sent (end of stream).
    case finished = 0
    /// The other side's app closed it early.
    case cancelled = 1
    /// The reader already has its limit of streams from this peer open.
    case refused = 2

    public var description: String {
        switch self {
        case .finished: "the writer finished the stream"
        case .cancelled: "the stream was closed by the other side"
        case .refused: "refused by the reader (too many streams from this peer at once)"
        }
    }
}
