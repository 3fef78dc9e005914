import FoundationEssentials
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import MeshPOSIX
import PeerMesh

/// `mesh-chat` options: the MultipeerConnectivity demo app, a chat room over PeerMesh.
package struct ChatOptions: CommandLineTool, Sendable, Equatable {
    package static let program = "mesh-chat"

    /// Who may join the room and be joined.
    package enum Accept: String, Sendable, Equatable {
        /// Only members whose keys are in the trust store (`paired.json` in the state directory).
        case paired
        /// Anyone on the network: an open room.
        case all
    }

    package var name: String?
    package var service = "mesh-chat"
    package var accept: Accept = .paired
    package var state = StateDirectory.default
    /// Where received files are put.
    package var receiveDirectory = "."
    package var bind = ""
    package var peerTimeout: Double = 2
    /// `--pair` (open a pairing window in the room) or `--pair CODE` (pair with the member showing it, then exit).
    package var pair: Pair?
    package var pairTimeout: Double = 30

    /// What `--pair` asks for.
    package enum Pair: Sendable, Equatable {
        /// Show a code; members that type it (`mesh-chat --pair CODE`) are paired, both ways.
        case window
        /// Pair with the member showing this code, then exit.
        case code(String)
    }

    package static let usage = """
        usage: mesh-chat --name NAME [--service TYPE] [--accept paired|all] [--state-dir DIR] [--receive-dir DIR]
               mesh-chat --name NAME --pair [CODE] [--pair-timeout S]
          Joins the chat room of a service (default mesh-chat): every member found on the LAN is connected directly,
          so each line goes straight to every member. Members are printed as they come and go.
          Lines typed on stdin go to every member. Commands:
            /to NAME text    to one member          /who          the members connected now
            /send PATH       a file to every member (a progress bar on a terminal; the receivers print where it went)
            /quit            leave once the files being sent have gone (so do the end of input and Ctrl-C;
                             a second Ctrl-C leaves at once)
          --accept MODE       paired (default): only members in the state directory's trust store; all: an open room
          --pair              in the room, open a pairing window: prints a code; a member that types it is paired
          --pair CODE         pair with the member showing CODE (both trust each other from then on), then exit
          --pair-timeout S    how long the window stays open (default 30)
          --state-dir DIR     identity and paired devices, as mesh-record and mesh-play (default
                              $XDG_CONFIG_HOME/peermesh or ~/.config/peermesh)
          --receive-dir DIR   where received files go (default: the current directory)
          --bind ADDR         listen and connect on this address only
          --peer-timeout S    a silent member is gone after S seconds (default 2)
          Chat lines and members coming and going go to stdout; events and errors to stderr. Bad flags exit 2.
        """

    package static func parse(_ arguments: [String]) throws(UsageError) -> ParsedCommand<ChatOptions> {
        var cursor = ArgumentCursor(arguments)
        var o = ChatOptions()
        while let flag = try cursor.next() {
            switch flag {
            case "--help", "-h": return .help
            case "--version": return .version
            case "--name":
                let name = try cursor.value(for: flag)
                do { try PeerID.validate(displayName: name) } catch { throw UsageError("--name: \(error)") }
                o.name = name
            case "--service":
                o.service = try cursor.value(for: flag)
                do { try DiscoveryValidation.validate(serviceType: o.service) } catch { throw UsageError("--service: \(error)") }
            case "--accept":
                let v = try cursor.value(for: flag)
                guard let mode = Accept(rawValue: v) else { throw UsageError("--accept takes paired or all, got \"\(v)\"") }
                o.accept = mode
            case "--state-dir": o.state = StateDirectory(try cursor.directory(for: flag))
            case "--receive-dir": o.receiveDirectory = try cursor.value(for: flag)
            case "--bind": o.bind = try cursor.value(for: flag)
            case "--peer-timeout": o.peerTimeout = try cursor.number(for: flag, in: 0.2...3_600)
            case "--pair":
                if let code = cursor.optionalValue() {
                    guard Pairing.normalize(code).count == 8 else {
                        throw UsageError("--pair takes the 8-digit code the other member shows (like 4821-0937), got \"\(code)\"")
                    }
                    o.pair = .code(code)
                } else {
                    o.pair = .window
                }
            case "--pair-timeout": o.pairTimeout = try cursor.number(for: flag, in: 1...3_600)
            default: throw UsageError("unknown option \"\(flag)\"")
            }
        }
        guard o.name != nil else { throw UsageError("say who you are: --name NAME") }
        return .run(o)
    }
}

/// One line of `mesh-chat` input.
package enum ChatInput: Equatable, Sendable {
    /// Text for every member.
    case say(String)
    /// Text for the members named `name`.
    case tell(name: String, text: String)
    /// Send a file to every member.
    case send(path: String)
    /// List the members.
    case who
    /// Leave.
    case quit
    /// Nothing to do (an empty line).
    case nothing
    /// A command line that is not right; the text says how to write it.
    case invalid(String)

    package init(line raw: String) {
        let line = raw.hasSuffix("\r") ? String(raw.dropLast()) : raw
        guard line.hasPrefix("/") else {
            self = line.isEmpty ? .nothing : .say(line)
            return
        }
        let parts = line.split(separator: " ", maxSplits: 2, omittingEmptySubsequences: true)
        switch parts.first {
        case "/who": self = .who
        case "/quit": self = .quit
        case "/to":
            guard parts.count == 3 else { self = .invalid("usage: /to NAME text"); return }
            self = .tell(name: String(parts[1]), text: String(parts[2]))
        case "/send":
            // The path is the rest of the line, spaces inside it kept.
            let path = line.dropFirst("/send".count).drop { $0 == " " }
            self = path.isEmpty ? .invalid("usage: /send PATH") : .send(path: String(path))
        default:
            self = .invalid("unknown command \(parts.first ?? ""); the commands are /to, /send, /who and /quit")
        }
    }
}

/// Where a file a member sent is kept: in the receive directory, under the name it was sent with, unless that name
/// is taken (then `name.1`, `name.2`…) or starts with a dot. A dot name would be hidden from `ls`, and could be a
/// shell's or a tool's startup file (`.bash_profile`, `.envrc`) in a directory someone chats from: it is kept
/// visible, its dot made a `_`. (PeerMesh has already refused names that are not one plain path component.)
package enum ReceivedFile {
    /// The longest file name Linux file systems take, in bytes.
    static let maximumNameBytes = 255

    /// The file name a resource named `name` is kept under, before any `.1` that a taken name adds.
    package static func name(for name: String) -> String {
        // By bytes, not characters: `.` followed by a combining mark is one character that does not start with ".".
        name.utf8.first == UInt8(ascii: ".") ? "_" + String(name.unicodeScalars.dropFirst()) : name
    }

    /// The most names tried for one file (`name`, `name.1` … `name.999`): a member who sends the same name over and
    /// over cannot make each new file cost more and more tries.
    package static let maximumAttempts = 1_000

    /// The `attempt`th name a resource named `resource` may be kept under in `directory`: `name(for:)`'s at 0, then
    /// with `.1`, `.2`… (cut at its end, a scalar at a time, to stay within 255 bytes).
    package static func candidate(in directory: String, for resource: String, attempt: Int) -> String {
        let kept = name(for: resource)
        guard attempt > 0 else { return "\(directory)/\(kept)" }
        let suffix = ".\(attempt)"
        // A scalar is 4 bytes at most, and a character may be any number of them.
        var base = Substring(kept)
        while base.utf8.count + suffix.utf8.count > maximumNameBytes { base.unicodeScalars.removeLast() }
        return "\(directory)/\(base)\(suffix)"
    }

    /// Moves the received file at `file` into `directory` under the first of `candidate`'s names that nothing holds,
    /// and returns where it went. Each try is the move itself, so a file, directory or symbolic link that appears
    /// meanwhile is never replaced or written through. Throws `EEXIST` when every name is taken.
    /// From another file system (resources arrive in `$TMPDIR`) the file is copied once, whatever the number of
    /// names taken.
    package static func keep(_ file: String, in directory: String, for resource: String) throws(SyscallError) -> String {
        let names = (0..<maximumAttempts).map { candidate(in: directory, for: resource, attempt: $0) }
        if let path = try FileSystem.moveWithoutReplacing(file, toFirstFreeOf: names) { return path }
        throw SyscallError(call: "keep \(names[0]) (the name and \(maximumAttempts - 1) numbered ones are taken)", code: EEXIST)
    }
}

/// A chat message on the wire (a reliable PeerMesh message): a kind byte, then UTF-8 text.
package enum ChatMessage: Equatable, Sendable {
    /// A line for the whole room.
    case room(String)
    /// A line for the receiver only.
    case direct(String)

    package func encoded() -> Data {
        switch self {
        case .room(let t): Data([1] + Array(t.utf8))
        case .direct(let t): Data([2] + Array(t.utf8))
        }
    }

    /// Decodes a message from a member; nil for anything else (counted and dropped by the app).
    package static func decode(_ data: Data) -> ChatMessage? {
        guard let kind = data.first, let text = String(validating: data.dropFirst(), as: UTF8.self) else { return nil }
        // Control characters other than tab would let a member rewrite the receiver's terminal.
        guard !text.unicodeScalars.contains(where: { ($0.value < 0x20 && $0 != "\t") || $0.value == 0x7f || (0x80...0x9f).contains($0.value) })
        else { return nil }
        switch kind {
        case 1: return .room(text)
        case 2: return .direct(text)
        default: return nil
        }
    }
}
