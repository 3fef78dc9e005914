import MeshPOSIX

/// The frames of one resource transfer (`Session.sendResource`), carried on the reliable connection inside its
/// secure channel like every other frame. The sender names each of its transfers with an `id` of its own choosing;
/// the receiver answers with the sender's `id`. See docs/PROTOCOL.md §4.
///
/// Sender → receiver: START (size and name), CHUNKs in order, then END (the SHA-256 of everything sent), or
/// CANCEL at any point. Receiver → sender: one RESULT (delivered, or why not), which also cancels a transfer the
/// receiver gives up on.
enum ResourceFrame: Equatable, Sendable {
    /// A new transfer of `size` bytes named `name`.
    case start(id: UInt32, size: UInt64, name: String)
    /// The next bytes of transfer `id` (1…`maximumChunk` of them).
    case chunk(id: UInt32, bytes: [UInt8])
    /// Every byte of `id` has been sent; `sha256` is their hash.
    case end(id: UInt32, sha256: [UInt8])
    /// The sender gave up on `id`: the receiver deletes what it has.
    case cancel(id: UInt32)
    /// The receiver's answer for `id`: delivered (`.delivered`), or why not. Final for both sides.
    case result(id: UInt32, ResourceOutcome, String)

    /// Bytes per CHUNK at most: 64 KiB, so a transfer never holds a connection for long.
    static let maximumChunk = 65_536
    /// Longest resource name, in UTF-8 bytes (a file name's limit on Linux).
    static let maximumName = 255
    /// Longest RESULT text.
    static let maximumText = 1_024
    /// The longest resource frame (type byte + body): a full CHUNK.
    static let maximumFrameLength = 1 + 4 + maximumChunk

    var name: String {
        switch self {
        case .start: "RESOURCE_START"
        case .chunk: "RESOURCE_CHUNK"
        case .end: "RESOURCE_END"
        case .cancel: "RESOURCE_CANCEL"
        case .result: "RESOURCE_RESULT"
        }
    }

    /// The frame's id, whichever kind it is.
    var id: UInt32 {
        switch self {
        case .start(let id, _, _), .chunk(let id, _), .end(let id, _), .cancel(let id), .result(let id, _, _): id
        }
    }

    /// The type byte and body.
    func encode(into w: inout ByteWriter) {
        switch self {
        case .start(let id, let size, let name):
            w.u8(ControlFrame.Kind.resourceStart.rawValue)
            w.u32(id)
            w.u64(size)
            let n = Array(name.utf8)
            w.u8(UInt8(n.count))
            w.raw(n)
        case .chunk(let id, let bytes):
            w.u8(ControlFrame.Kind.resourceChunk.rawValue)
            w.u32(id)
            w.raw(bytes)
        case .end(let id, let hash):
            w.u8(ControlFrame.Kind.resourceEnd.rawValue)
            w.u32(id)
            w.raw(hash)
        case .cancel(let id):
            w.u8(ControlFrame.Kind.resourceCancel.rawValue)
            w.u32(id)
        case .result(let id, let outcome, let text):
            w.u8(ControlFrame.Kind.resourceResult.rawValue)
            w.u32(id)
            w.u8(outcome.rawValue)
            let t = Array(text.utf8.prefix(Self.maximumText)).cutToCharacterBoundary()
            w.u16(UInt16(t.count))
            w.raw(t)
        }
    }

    /// Decodes the body of a resource frame of kind `kind` (the reader is past the type byte). Pure; never traps.
    static func decode(_ kind: ControlFrame.Kind, _ r: inout ByteReader) -> Result<ResourceFrame, ControlFrame.DecodeError> {
        guard let id = r.u32() else { return .failure(.truncated) }
        switch kind {
        case .resourceStart:
            guard let size = r.u64(), let n = r.u8(), let nameBytes = r.bytes(Int(n)) else { return .failure(.truncated) }
            guard let name = String(validating: nameBytes, as: UTF8.self), ResourceName.isOnePathComponent(name) else {
                return .failure(.badField("resource name"))
            }
            return .success(.start(id: id, size: size, name: name))
        case .resourceChunk:
            let bytes = r.rest()
            guard (1...maximumChunk).contains(bytes.count) else { return .failure(.badField("resource chunk length")) }
            return .success(.chunk(id: id, bytes: Array(bytes)))
        case .resourceEnd:
            guard let hash = r.bytes(32) else { return .failure(.truncated) }
            return .success(.end(id: id, sha256: Array(hash)))
        case .resourceCancel:
            return .success(.cancel(id: id))
        case .resourceResult:
            guard let raw = r.u8(), let n = r.u16(), let t = r.bytes(Int(n)) else { return .failure(.truncated) }
            guard let outcome = ResourceOutcome(rawValue: raw) else { return .failure(.badField("resource outcome")) }
            guard n <= maximumText, let text = String(validating: t, as: UTF8.self) else {
                return .failure(.badField("resource text"))
            }
            return .success(.result(id: id, outcome, text))
        default:
            return .failure(.unknownType(kind.rawValue))
        }
    }
}

/// How a resource transfer ended, as the receiver reports it in RESULT.
public enum ResourceOutcome: UInt8, Sendable, Equatable, CustomStringConvertible {
    /// Received whole, its SHA-256 verified, and handed to the app.
    case delivered = 0
    /// The receiving app cancelled it.
    case cancelled = 1
    /// The bytes received do not hash to what the sender announced.
    case hashMismatch = 2
    /// The receiver could not store it (disk full, no permission…); the text says what failed.
    case storageFailed = 3
    /// The receiver refused it at its start: its name holds control or invisible characters, the receiver already
    /// has its limit of transfers on this link in progress, the resource is larger than it accepts, or its disk has
    /// no room for it.
    case refused = 4

    public var description: String {
        switch self {
        case .delivered: "delivered"
        case .cancelled: "cancelled by the receiver"
        case .hashMismatch: "the received bytes do not match the sender's SHA-256"
        case .storageFailed: "the receiver could not store it"
        case .refused: "refused by the receiver (its name, too many transfers at once, too large, or no room on its disk)"
        }
    }
}

/// The rules for a resource's name: it becomes a file name on the receiver, so it is one path component, and one
/// that shows what it is.
enum ResourceName {
    /// What a name must be to be a frame at all: 1…255 UTF-8 bytes of one path component (no `/`, not `.` or `..`)
    /// without C0 controls (NUL among them) or DEL. A START whose name is not is malformed.
    static func isOnePathComponent(_ name: String) -> Bool {
        guard (1...ResourceFrame.maximumName).contains(name.utf8.count), name != ".", name != ".." else { return false }
        return !name.utf8.contains { $0 == UInt8(ascii: "/") || $0 < 0x20 || $0 == 0x7f }
    }

    /// What a name must be to be taken (and sent): one path component, without C1 controls nor invisible format
    /// characters (bidirectional controls, the zero-width space…: `Unicode.Scalar.isControlOrHidden`), with which a
    /// name could rewrite a terminal that lists it or pass for another (`invoice\u{202e}fdp.exe`). A START whose name
    /// is one path component but not this is refused, not a fault: peers built before this rule may send one.
    static func isValid(_ name: String) -> Bool {
        isOnePathComponent(name) && !name.unicodeScalars.contains { $0.isControlOrHidden }
    }
}

extension Array where Element == UInt8 {
    /// The bytes with a trailing incomplete UTF-8 sequence removed (after a cut at a byte count).
    func cutToCharacterBoundary() -> [UInt8] {
        var end = count
        var i = count - 1
        // Walk back over continuation bytes to the last sequence's lead byte, and keep the sequence only if whole.
        while i >= 0, self[i] & 0xc0 == 0x80 { i -= 1 }
        guard i >= 0 else { return [] }
        let lead = self[i]
        let length = lead < 0x80 ? 1 : lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1
        if count - i < length { end = i }
        return Array(self[..<end])
    }
}
