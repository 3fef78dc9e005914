/// The relay's remote-control protocol, version 1: what a player asks of its host (pause, resume, capture, talk) and
/// what the host answers (one reply per command, and state sync). Messages travel on the audio session's reliable,
/// encrypted channel, one message per reliable send. `docs/PROTOCOL.md` §7 documents the layout byte by byte.
///
///     0      2        3      4          8
///     "PC" | version | kind | id (u32) | body
///
/// Pure: encoding and decoding touch no socket; `decode` takes bytes from a peer and never traps on them.
public enum ControlMessage: Sendable, Equatable {
    /// Player → host. `id` is the player's (nonzero); the reply carries it back.
    case command(id: UInt32, PlayerCommand)
    /// Host → player: the one answer to command `id`.
    case reply(id: UInt32, HostReply)
    /// Host → player, unasked: the host's state as this player sees it.
    case state(HostControlState)

    /// The protocol version this build speaks.
    public static let version: UInt8 = 1
    /// The magic that starts every control message.
    static let magic: [UInt8] = [0x50, 0x43] // "PC"
    /// Largest encoded message: header, three body bytes and a 255-byte text.
    public static let maximumSize = 8 + 4 + 255
    /// Longest text (a clip's name, a reason), in UTF-8 bytes; longer text is cut at a character boundary.
    public static let maximumTextBytes = 255

    enum Kind: UInt8 {
        case pause = 0x01, resume = 0x02, capture = 0x03, talk = 0x04
        case reply = 0x81, state = 0x82
    }

    /// The wire bytes.
    public var encoded: [UInt8] {
        var out = Self.magic + [Self.version]
        func header(_ kind: Kind, _ id: UInt32) {
            out.append(kind.rawValue)
            out += [UInt8(id >> 24), UInt8(truncatingIfNeeded: id >> 16), UInt8(truncatingIfNeeded: id >> 8), UInt8(truncatingIfNeeded: id)]
        }
        switch self {
        case .command(let id, .pause): header(.pause, id)
        case .command(let id, .resume): header(.resume, id)
        case .command(let id, .capture(let phase, let action)):
            header(.capture, id)
            out += [phase.rawValue, action.rawValue]
        case .command(let id, .talk(let on)):
            header(.talk, id)
            out.append(on ? 1 : 0)
        case .reply(let id, let reply):
            header(.reply, id)
            out.append(reply.status)
            Self.appendText(reply.text, to: &out)
        case .state(let s):
            header(.state, 0)
            var flags: UInt8 = 0
            if s.paused { flags |= 1 }
            if s.muted { flags |= 2 }
            if s.talkAccepted { flags |= 4 }
            out += [flags, s.features.rawValue, s.capture.code]
            Self.appendText(s.capture.text, to: &out)
        }
        return out
    }

    private static func appendText(_ text: String, to out: inout [UInt8]) {
        var bytes = Array(text.utf8)
        if bytes.count > maximumTextBytes {
            // Cut at a character boundary: never inside a multi-byte sequence.
            var n = maximumTextBytes
            while n > 0, bytes[n] & 0xC0 == 0x80 { n -= 1 }
            bytes = Array(bytes[..<n])
        }
        out.append(UInt8(bytes.count))
        out += bytes
    }

    /// Decodes one message from a peer.
    public static func decode(_ bytes: [UInt8]) throws(ControlDecodeError) -> ControlMessage {
        guard bytes.count >= 8 else { throw ControlDecodeError(id: nil, reason: "a control message of \(bytes.count) bytes (at least 8)") }
        guard bytes.count <= maximumSize else { throw ControlDecodeError(id: nil, reason: "a control message of \(bytes.count) bytes (at most \(maximumSize))") }
        guard bytes[0] == magic[0], bytes[1] == magic[1] else { throw ControlDecodeError(id: nil, reason: "not a control message") }
        let id = UInt32(bytes[4]) << 24 | UInt32(bytes[5]) << 16 | UInt32(bytes[6]) << 8 | UInt32(bytes[7])
        guard bytes[2] == version else { throw ControlDecodeError(id: id, reason: "control version \(bytes[2]) (this host speaks \(version))") }
        guard let kind = Kind(rawValue: bytes[3]) else { throw ControlDecodeError(id: id, reason: "unknown command 0x\(String(bytes[3], radix: 16))") }
        var body = bytes[8...]
        func byte() throws(ControlDecodeError) -> UInt8 {
            guard let b = body.first else { throw ControlDecodeError(id: id, reason: "a truncated \(kind) message") }
            body = body.dropFirst()
            return b
        }
        func text() throws(ControlDecodeError) -> String {
            let n = Int(try byte())
            guard body.count >= n else { throw ControlDecodeError(id: id, reason: "a truncated \(kind) message") }
            let raw = Array(body.prefix(n))
            body = body.dropFirst(n)
            guard let s = String(validating: raw, as: UTF8.self) else { throw ControlDecodeError(id: id, reason: "text that is not UTF-8") }
            return s
        }
        let message: ControlMessage
        switch kind {
        case .pause, .resume, .capture, .talk:
            guard id != 0 else { throw ControlDecodeError(id: nil, reason: "a command with id 0") }
            switch kind {
            case .pause: message = .command(id: id, .pause)
            case .resume: message = .command(id: id, .resume)
            case .capture:
                let p = try byte(), a = try byte()
                guard let phase = CapturePhase(rawValue: p) else { throw ControlDecodeError(id: id, reason: "capture phase \(p)") }
                guard let action = CaptureAction(rawValue: a) else { throw ControlDecodeError(id: id, reason: "capture action \(a)") }
                message = .command(id: id, .capture(phase, action))
            default:
                let on = try byte()
                guard on <= 1 else { throw ControlDecodeError(id: id, reason: "talk \(on) (0 or 1)") }
                message = .command(id: id, .talk(on == 1))
            }
        case .reply:
            let status = try byte()
            let t = try text()
            guard let reply = HostReply(status: status, text: t) else {
                throw ControlDecodeError(id: id, reason: "reply status \(status) with \(t.utf8.count) bytes of text")
            }
            message = .reply(id: id, reply)
        case .state:
            guard id == 0 else { throw ControlDecodeError(id: nil, reason: "a state message with id \(id) (it carries 0)") }
            let flags = try byte(), features = try byte(), code = try byte()
            let t = try text()
            guard flags & ~7 == 0 else { throw ControlDecodeError(id: id, reason: "state flags 0x\(String(flags, radix: 16))") }
            guard features & ~ControlFeatures.known.rawValue == 0 else {
                throw ControlDecodeError(id: id, reason: "features 0x\(String(features, radix: 16))")
            }
            guard let capture = CaptureState(code: code, text: t) else {
                throw ControlDecodeError(id: id, reason: "capture state \(code) with \(t.utf8.count) bytes of text")
            }
            message = .state(HostControlState(paused: flags & 1 != 0, muted: flags & 2 != 0, talkAccepted: flags & 4 != 0,
                                              features: ControlFeatures(rawValue: features),
                                              capture: capture))
        }
        guard body.isEmpty else { throw ControlDecodeError(id: id, reason: "\(body.count) bytes after a \(kind) message") }
        return message
    }
}

/// Why a control message was refused. `id` is the command's when the header got that far, so the answer can name it.
public struct ControlDecodeError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The refused command's id, when the header decoded that far.
    public var id: UInt32?
    /// What was wrong, in words.
    public var reason: String
    public var description: String { reason }
}

/// What a player asks of its host.
public enum PlayerCommand: Sendable, Equatable, CustomStringConvertible {
    /// Stop sending audio to this player (the session stays connected).
    case pause
    /// Send audio again, from the live edge.
    case resume
    /// Clip capture, with Apple capture events' phases and actions.
    case capture(CapturePhase, CaptureAction)
    /// Push-to-talk on or off.
    case talk(Bool)

    public var description: String {
        switch self {
        case .pause: "pause"
        case .resume: "resume"
        case .capture(let p, let a): a == .primary ? "capture \(p)" : "capture \(p) \(a)"
        case .talk(let on): on ? "talk on" : "talk off"
        }
    }
}

/// The phase of a capture command.
///
/// Printed (`"\(phase)"`), a phase shows its case name.
public enum CapturePhase: UInt8, Sendable, Equatable {
    /// One press: the pre-roll plus what follows, up to the clip length.
    case single = 0
    /// The press went down: record until `end` (or the clip length).
    case begin = 1
    /// The press came up: finish and save the clip.
    case end = 2
    /// The press was cancelled: discard the clip.
    case cancel = 3
}

/// Which action a capture command carries.
///
/// Printed, an action shows its case name.
public enum CaptureAction: UInt8, Sendable, Equatable {
    /// Record a clip: the pre-roll and what follows.
    case primary = 0
    /// Keep the moment just heard: the pre-roll alone, saved at once.
    case secondary = 1
}

/// The one answer to a command.
public enum HostReply: Sendable, Equatable, CustomStringConvertible {
    /// Done.
    case ok
    /// A clip is being recorded (the answer to a capture that started one).
    case recording
    /// Someone else holds it (another player's clip, another talker).
    case busy
    /// It was tried and failed (a clip that cannot be written).
    case failed(String)
    /// The host does not offer it.
    case unsupported(String)
    /// The command was malformed or out of order.
    case error(String)

    var status: UInt8 {
        switch self {
        case .ok: 0
        case .recording: 1
        case .busy: 2
        case .failed: 3
        case .unsupported: 4
        case .error: 5
        }
    }

    var text: String {
        switch self {
        case .ok, .recording, .busy: ""
        case .failed(let t), .unsupported(let t), .error(let t): t
        }
    }

    /// The reply of `status` with `text`; nil for an unknown status, or text on one that carries none.
    init?(status: UInt8, text: String) {
        guard status >= 3 || text.isEmpty else { return nil }
        switch status {
        case 0: self = .ok
        case 1: self = .recording
        case 2: self = .busy
        case 3: self = .failed(text)
        case 4: self = .unsupported(text)
        case 5: self = .error(text)
        default: return nil
        }
    }

    public var description: String {
        switch self {
        case .ok: "ok"
        case .recording: "recording"
        case .busy: "busy"
        case .failed(let t): "failed: \(t)"
        case .unsupported(let t): "unsupported: \(t)"
        case .error(let t): "error: \(t)"
        }
    }
}

/// What a host offers (also published in its TXT record as `ctl=1`, `clip=1`, `talk=1`).
public struct ControlFeatures: OptionSet, Sendable, Equatable {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }
    /// Pause and resume (every host that speaks the control protocol).
    public static let control = ControlFeatures(rawValue: 1)
    /// Clip capture (`mesh-record --clips DIR`).
    public static let clips = ControlFeatures(rawValue: 2)
    /// Talkback.
    public static let talk = ControlFeatures(rawValue: 4)
    static let known: ControlFeatures = [.control, .clips, .talk]

    /// The TXT entries that advertise these features.
    public var discoveryInfo: [String: String] {
        var info: [String: String] = [:]
        if contains(.control) { info["ctl"] = "1" }
        if contains(.clips) { info["clip"] = "1" }
        if contains(.talk) { info["talk"] = "1" }
        return info
    }

    /// The features a TXT record advertises.
    public init(discoveryInfo info: [String: String]) {
        var f: ControlFeatures = []
        if info["ctl"] == "1" { f.insert(.control) }
        if info["clip"] == "1" { f.insert(.clips) }
        if info["talk"] == "1" { f.insert(.talk) }
        self = f
    }
}

/// A clip's state, as players see it.
public enum CaptureState: Sendable, Equatable, CustomStringConvertible {
    /// The host keeps no clips.
    case off
    /// Ready: the pre-roll is filling.
    case armed
    /// A clip is being recorded.
    case recording
    /// The latest clip was saved under this name.
    case saved(String)
    /// The latest clip could not be written, for this reason.
    case failed(String)

    var code: UInt8 {
        switch self {
        case .off: 0
        case .armed: 1
        case .recording: 2
        case .saved: 3
        case .failed: 4
        }
    }

    var text: String {
        switch self {
        case .saved(let t), .failed(let t): t
        default: ""
        }
    }

    /// The state of `code` with `text`; nil for an unknown code, or text on one that carries none.
    init?(code: UInt8, text: String) {
        guard code >= 3 || text.isEmpty else { return nil }
        switch code {
        case 0: self = .off
        case 1: self = .armed
        case 2: self = .recording
        case 3: self = .saved(text)
        case 4: self = .failed(text)
        default: return nil
        }
    }

    public var description: String {
        switch self {
        case .off: "off"
        case .armed: "armed"
        case .recording: "recording"
        case .saved(let n): "saved \(n)"
        case .failed(let r): "failed \(r)"
        }
    }
}

/// The host's state as one player sees it (state sync).
public struct HostControlState: Sendable, Equatable {
    /// This state as a state-sync message's bytes.
    public var encodedState: [UInt8] { ControlMessage.state(self).encoded }

    /// Whether the host holds this player's audio.
    public var paused: Bool
    /// Whether the host's operator muted the microphone.
    public var muted: Bool
    /// Whether talkback is accepted now.
    public var talkAccepted: Bool
    /// What the host offers.
    public var features: ControlFeatures
    /// The clip state.
    public var capture: CaptureState

    public init(paused: Bool = false, muted: Bool = false, talkAccepted: Bool = false, features: ControlFeatures = .control,
                capture: CaptureState = .off) {
        self.paused = paused
        self.muted = muted
        self.talkAccepted = talkAccepted
        self.features = features
        self.capture = capture
    }
}
