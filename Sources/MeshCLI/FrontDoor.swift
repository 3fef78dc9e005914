import MeshPOSIX
#if canImport(Glibc)
import Glibc
#endif

/// The version every PeerMesh command-line tool prints.
package let meshVersion = "0.2.0"

/// What a command line asked for: run with a config, or print help or the version.
package enum ParsedCommand<Config: Sendable>: Sendable {
    case run(Config)
    case help
    case version
}

extension ParsedCommand: Equatable where Config: Equatable {}

/// A command line a tool cannot take. The front door prints it with the usage and exits 2.
package struct UsageError: Error, Equatable, CustomStringConvertible {
    package let message: String
    package init(_ message: String) { self.message = message }
    package var description: String { message }
}

/// A command-line tool: its name, usage text and parser. Every PeerMesh executable is one.
package protocol CommandLineTool {
    associatedtype Config: Sendable
    /// The program name, as in `mesh-record: …` lines.
    static var program: String { get }
    /// The usage text `--help` prints.
    static var usage: String { get }
    /// Turns the arguments (without the program name) into a typed config, or says what is wrong.
    static func parse(_ arguments: [String]) throws(UsageError) -> ParsedCommand<Config>
}

extension CommandLineTool {
    /// The front door: parses `CommandLine.arguments`, answers `--help` and `--version` (exit 0), and on a bad
    /// command line prints the problem and the usage and exits 2. Returns the config to run with.
    package static func configurationFromCommandLine() -> Config {
        do {
            switch try parse(Array(CommandLine.arguments.dropFirst())) {
            case .run(let config): return config
            case .help:
                LineWriter.writeLine(usage, to: 1)
                exit(0)
            case .version:
                LineWriter.writeLine("\(program) \(meshVersion)", to: 1)
                exit(0)
            }
        } catch {
            usage(error.description)
        }
    }

    /// Prints `problem` (if any) and the usage on stderr, and exits 2.
    package static func usage(_ problem: String? = nil) -> Never {
        if let problem { LineWriter.standardError("\(program): \(problem)") }
        LineWriter.standardError(usage)
        exit(2)
    }
}

/// Walks `--flag value` (or `--flag=value`) arguments.
package struct ArgumentCursor {
    private let args: [String]
    private var i = 0
    private var inline: String?
    /// The flag `next` returned last.
    private var current: String?

    package init(_ args: [String]) { self.args = args }

    /// The next flag (for `--flag=value`, the `--flag` part; the value waits for `value(for:)`). A `--flag=value`
    /// whose value was never taken is a flag that takes none: that is a usage error (`--quiet=no` must not mean
    /// `--quiet`), whatever parser walks the arguments.
    package mutating func next() throws(UsageError) -> String? {
        if let current, inline != nil { throw UsageError("\(current) takes no value") }
        guard i < args.count else { return nil }
        var a = args[i]
        i += 1
        inline = nil
        if a.hasPrefix("--"), let eq = a.firstIndex(of: "=") {
            inline = String(a[a.index(after: eq)...])
            a = String(a[..<eq])
        }
        current = a
        return a
    }

    /// The flag's value; a following flag is not taken as a value.
    package mutating func value(for flag: String) throws(UsageError) -> String {
        if let v = inline {
            inline = nil
            return v
        }
        guard i < args.count, !args[i].hasPrefix("--") || args[i] == "-" else { throw UsageError("\(flag) needs a value") }
        defer { i += 1 }
        return args[i]
    }

    /// A directory for PeerMesh's keys or sockets: not empty (an unset variable) and not the root, which would be
    /// taken over (and tightened to 0700).
    package mutating func directory(for flag: String) throws(UsageError) -> String {
        let v = try value(for: flag)
        guard v.contains(where: { $0 != "/" }) else { throw UsageError("\(flag) needs a directory of its own, got \"\(v)\"") }
        return v
    }

    /// The flag's value if one follows (`--flag=value`, or a next argument that is not a flag), else nil.
    package mutating func optionalValue() -> String? {
        if let v = inline {
            inline = nil
            return v
        }
        guard i < args.count, !args[i].hasPrefix("--") else { return nil }
        defer { i += 1 }
        return args[i]
    }

    /// An integer value in `range`.
    package mutating func int(for flag: String, in range: ClosedRange<Int>) throws(UsageError) -> Int {
        let v = try value(for: flag)
        guard let n = Int(v), range.contains(n) else {
            throw UsageError("\(flag) must be an integer in \(range.lowerBound)…\(range.upperBound), got \"\(v)\"")
        }
        return n
    }

    /// A finite number in `range`.
    package mutating func number(for flag: String, in range: ClosedRange<Double>) throws(UsageError) -> Double {
        let v = try value(for: flag)
        guard let d = Double(v), d.isFinite, range.contains(d) else {
            throw UsageError("\(flag) must be a number in \(Self.text(range.lowerBound))…\(Self.text(range.upperBound)), got \"\(v)\"")
        }
        return d
    }

    private static func text(_ d: Double) -> String { d == d.rounded() && abs(d) < 1e15 ? String(Int64(d)) : String(d) }
}
