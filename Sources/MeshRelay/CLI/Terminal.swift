import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// stderr logging and the live status line, shared by both CLIs.
public final class Terminal: Sendable {
    /// Whether stderr is a terminal (the status line is drawn only then).
    public let isTTY: Bool
    /// `--quiet`: no event lines, no status line.
    public let quiet: Bool
    private let lock = NSLock()
    private let program: String

    public init(program: String, quiet: Bool) {
        self.program = program
        self.quiet = quiet
        isTTY = isatty(STDERR_FILENO) == 1
    }

    /// One event line on stderr (clears the status line first).
    public func log(_ text: String) {
        guard !quiet else { return }
        error(text)
    }

    /// An error line on stderr, even when quiet.
    public func error(_ text: String) {
        write(isTTY ? "\r\u{1B}[2K\(program): \(text)\n" : "\(program): \(text)\n")
    }

    /// Redraws the status line (terminals only).
    public func status(_ text: String) {
        guard !quiet, isTTY else { return }
        write("\r\u{1B}[2K\(text)")
    }

    /// Ends the status line.
    public func finish() {
        guard !quiet, isTTY else { return }
        write("\n")
    }

    /// A line on stdout (JSON).
    public func stdout(_ line: String) {
        lock.lock()
        defer { lock.unlock() }
        FileHandle.standardOutput.write(Data((line + "\n").utf8))
    }

    private func write(_ s: String) {
        lock.lock()
        defer { lock.unlock() }
        FileHandle.standardError.write(Data(s.utf8))
    }
}

/// Runs `handler` once on SIGINT or SIGTERM (delivered through DispatchSource, never in a signal handler).
public final class SignalTrap: @unchecked Sendable { // sources are created once in init and only cancelled in deinit
    private var sources: [DispatchSourceSignal] = []

    public init(queue: DispatchQueue = .main, _ handler: @escaping @Sendable (Int32) -> Void) {
        for sig in [SIGINT, SIGTERM] {
            signal(sig, SIG_IGN)
            let s = DispatchSource.makeSignalSource(signal: sig, queue: queue)
            s.setEventHandler { handler(sig) }
            s.resume()
            sources.append(s)
        }
    }

    deinit { sources.forEach { $0.cancel() } }
}
