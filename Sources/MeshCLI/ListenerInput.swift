import FoundationEssentials
import MeshPOSIX
import MeshRelay
#if canImport(Glibc)
import Glibc
#endif

/// What a person (or a script) at a CLI asks for: the commands of mesh-play's stdin and keys, and mesh-record's
/// mute. `parse` reads one line; `key` maps one key press.
package enum ListenerCommand: Sendable, Equatable {
    /// A command for the host (pause, resume, capture, talk).
    case remote(PlayerCommand)
    /// Local mute on or off.
    case mute(Bool)
    /// Local mute toggled (the `m` key).
    case toggleMute
    /// The volume set to this many dB.
    case volume(Double)
    /// The volume changed by this many dB (the `+` and `-` keys).
    case volumeStep(Double)
    /// Pause or resume, whichever the host's state calls for (the `p` key).
    case togglePause
    /// Talk on or off, whichever it is not (the space bar).
    case toggleTalk

    /// The commands one line can say.
    package static let help = "pause, resume, mute, unmute, volume DB, capture [begin|end|cancel] [secondary], talk on|off"

    /// One line of stdin: nil for an empty line, or why it is not a command.
    package static func parse(_ line: String) -> Result<ListenerCommand, CommandLineError>? {
        let words = line.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\r" }).map { $0.lowercased() }
        guard let verb = words.first else { return nil }
        let args = Array(words.dropFirst())
        func fail(_ why: String) -> Result<ListenerCommand, CommandLineError> { .failure(CommandLineError(why)) }
        switch verb {
        case "pause", "resume":
            guard args.isEmpty else { return fail("\(verb) takes nothing after it") }
            return .success(.remote(verb == "pause" ? .pause : .resume))
        case "mute", "unmute":
            guard args.isEmpty else { return fail("\(verb) takes nothing after it") }
            return .success(.mute(verb == "mute"))
        case "volume":
            guard args.count == 1, let db = Double(args[0]), db.isFinite else { return fail("volume takes dB, like volume -6") }
            guard OutputControls.volumeRange.contains(db) else { return fail("volume takes -60…12 dB, got \(args[0])") }
            return .success(.volume(db))
        case "capture":
            var phase = CapturePhase.single, action = CaptureAction.primary
            for a in args {
                switch a {
                case "begin": phase = .begin
                case "end": phase = .end
                case "cancel": phase = .cancel
                case "secondary": action = .secondary
                case "primary": action = .primary
                default: return fail("capture takes begin, end or cancel (and secondary), got \(a)")
                }
            }
            return .success(.remote(.capture(phase, action)))
        case "talk":
            guard args.count == 1, args[0] == "on" || args[0] == "off" else { return fail("talk takes on or off") }
            return .success(.remote(.talk(args[0] == "on")))
        default:
            return fail("unknown command \"\(verb)\" (commands: \(help))")
        }
    }

    /// One key on a terminal, or nil for a key that means nothing.
    package static func key(_ byte: UInt8) -> ListenerCommand? {
        switch byte {
        case UInt8(ascii: " "): .toggleTalk
        case UInt8(ascii: "p"), UInt8(ascii: "P"): .togglePause
        case UInt8(ascii: "m"), UInt8(ascii: "M"): .toggleMute
        case UInt8(ascii: "+"), UInt8(ascii: "="): .volumeStep(3)
        case UInt8(ascii: "-"), UInt8(ascii: "_"): .volumeStep(-3)
        case UInt8(ascii: "c"), UInt8(ascii: "C"): .remote(.capture(.single, .primary))
        default: nil
        }
    }
}

/// A line that is not a command, in words.
package struct CommandLineError: Error, Sendable, Equatable, CustomStringConvertible {
    package var description: String
    package init(_ description: String) { self.description = description }
}

/// Reads stdin on a thread of its own: on a terminal, one key at a time (raw mode, no echo, restored by
/// `restore()` and at exit); otherwise one line at a time. End of input ends the reader (a CLI that plays on keeps
/// playing).
package final class StandardInputReader: Sendable {
    /// Whether stdin is a terminal (keys) or not (lines).
    package let isTerminal: Bool

    /// Starts reading. `key` gets each byte typed on a terminal; `line` each line otherwise.
    package init(key: @escaping @Sendable (UInt8) -> Void, line: @escaping @Sendable (String) -> Void) {
        isTerminal = isatty(STDIN_FILENO) == 1
        let terminal = isTerminal
        if terminal { RawMode.enter() }
        OSThread.detach(name: "pm-stdin") {
            var pending: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 512)
            while true {
                let n = buffer.withUnsafeMutableBytes { read(STDIN_FILENO, $0.baseAddress, $0.count) }
                if n < 0, errno == EINTR { continue }
                guard n > 0 else { break }
                if terminal {
                    for b in buffer[0..<n] { key(b) }
                    continue
                }
                pending += buffer[0..<n]
                while let nl = pending.firstIndex(of: 0x0a) {
                    line(String(decoding: pending[..<nl], as: UTF8.self))
                    pending.removeSubrange(...nl)
                }
                if pending.count > 4096 { pending.removeAll() } // a line that never ends is not a command
            }
            if !pending.isEmpty { line(String(decoding: pending, as: UTF8.self)) }
        }
    }

    /// Puts the terminal back as it was.
    package func restore() { if isTerminal { RawMode.leave() } }
}

/// The terminal's mode before raw mode, restored on exit.
private enum RawMode {
    nonisolated(unsafe) static var saved = termios() // written once by enter(), before the reader starts; read at exit
    nonisolated(unsafe) static var active = false

    static func enter() {
        guard tcgetattr(STDIN_FILENO, &saved) == 0 else { return }
        var raw = saved
        raw.c_lflag &= ~tcflag_t(ICANON | ECHO)
        withUnsafeMutableBytes(of: &raw.c_cc) { cc in
            cc[Int(VMIN)] = 1
            cc[Int(VTIME)] = 0
        }
        guard tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0 else { return }
        active = true
        atexit { RawMode.leave() }
    }

    static func leave() {
        guard active else { return }
        active = false
        tcsetattr(STDIN_FILENO, TCSANOW, &saved)
    }
}
