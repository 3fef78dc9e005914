import Dispatch
import MeshPOSIX
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// stderr logging and the live status line, shared by every CLI.
///
/// Event and error lines go to stderr as `program: text`; the status line is redrawn in place, on terminals
/// only; JSON goes to stdout, one object per line. One lock keeps lines from interleaving.
package final class Terminal: Sendable {
    /// Whether stderr is a terminal (the status line is drawn only then).
    package let isTTY: Bool
    /// `--quiet`: no event lines, no status line (errors are still printed).
    package let quiet: Bool
    private let program: String
    /// Serializes writes, and holds the question on screen (a terminal's only): a line logged meanwhile is written
    /// above it and the question is drawn again below, so it never scrolls away or gets erased.
    private let lock = Mutex<String?>(nil)

    package init(program: String, quiet: Bool) {
        self.program = program
        self.quiet = quiet
        isTTY = isatty(STDERR_FILENO) == 1
    }

    /// One event line on stderr (clears the status line first).
    package func log(_ text: String) {
        guard !quiet else { return }
        error(text)
    }

    /// An error line on stderr, even when quiet. Off a terminal (a log file, a journal) each line starts with an
    /// ISO-8601 timestamp.
    package func error(_ text: String) {
        write(isTTY ? "\r\u{1B}[2K\(program): \(text)\n" : "\(StatusReport.timestamp()) \(program): \(text)\n", to: 2)
    }

    /// Text on stderr as it is (a QR code).
    package func raw(_ text: String) { write(text, to: 2) }

    /// Prints `text` as an error and exits 1: the run did not do its job.
    package func fail(_ text: String) -> Never {
        error(text)
        exit(1)
    }

    /// Redraws the status line (terminals only; not while a question is open).
    package func status(_ text: String) {
        guard !quiet, isTTY else { return }
        lock.withLock { open in
            // Not while a question is open: it would erase the question.
            if open == nil { LineWriter.write("\r\u{1B}[2K\(text)", to: 2) }
        }
    }

    /// Shows a question and keeps it on screen: the status line pauses until `endQuestion`.
    package func question(_ text: String) {
        guard isTTY else { return write("\(program): \(text)\n", to: 2) }
        let line = "\(program): \(text) "
        lock.withLock { open in
            open = line
            LineWriter.write("\r\u{1B}[2K" + line, to: 2)
        }
    }

    /// The question is answered or gone: the status line may come back.
    package func endQuestion() {
        if isTTY {
            lock.withLock { open in
                open = nil
                LineWriter.write("\n", to: 2)
            }
        }
    }

    /// Ends the status line.
    package func finish() {
        guard !quiet, isTTY else { return }
        write("\n", to: 2)
    }

    /// A line on stdout (JSON).
    package func stdout(_ line: String) { write(line + "\n", to: 1) }

    private func write(_ s: String, to fd: Int32) {
        lock.withLock { open in
            LineWriter.write(s, to: fd)
            if fd == 2, let open, s.hasSuffix("\n") { LineWriter.write(open, to: 2) }
        }
    }
}

/// Runs `handler` on SIGINT or SIGTERM (delivered through DispatchSource, never in a signal handler).
package final class SignalTrap: @unchecked Sendable { // `sources` is set once in init and only cancelled in deinit
    private let sources: [any DispatchSourceSignal]

    package init(queue: DispatchQueue = .main, _ handler: @escaping @Sendable (Int32) -> Void) {
        sources = [SIGINT, SIGTERM].map { sig in
            signal(sig, SIG_IGN)
            let s = DispatchSource.makeSignalSource(signal: sig, queue: queue)
            s.setEventHandler { handler(sig) }
            s.resume()
            return s
        }
    }

    deinit { sources.forEach { $0.cancel() } }
}

extension Terminal {
    /// Bounds the shutdown that starts now: if the program is still running `seconds` from now, says so and exits 1
    /// at once. Closing an audio device talks to its sound server, and a server that hangs (stopped, deadlocked)
    /// never answers: a Ctrl-C must still end the program.
    package func exitIfStopTakesLonger(than seconds: Int = 5) {
        DispatchQueue.global().asyncAfter(deadline: .now() + .seconds(seconds)) { [self] in
            error("still stopping after \(seconds) s (an audio device that does not close: is its sound server hung?); "
                + "exiting without it")
            _exit(1)
        }
    }
}
