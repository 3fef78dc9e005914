// Helpers every test target shares: waiting for conditions, built executables, child processes, seeded randomness.
import Foundation
import MeshPOSIX
import Synchronization

/// A seeded generator (SplitMix64): random tests replay exactly from their seed.
package typealias SeededRandom = SplitMix64

/// Polls `condition` every few milliseconds until it holds or `seconds` pass; returns whether it held.
@discardableResult
package func eventually(_ seconds: Double = 5, _ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if condition() { return true }
        usleep(2_000)
    }
    return condition()
}

/// An executable built by this package: next to the test bundle (`swift build` puts them side by side).
package func builtProduct(_ name: String) -> URL {
    var dir = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    if dir.lastPathComponent.hasSuffix(".xctest") { dir = dir.deletingLastPathComponent() }
    for candidate in [dir, dir.deletingLastPathComponent()] {
        let url = candidate.appendingPathComponent(name)
        if FileManager.default.isExecutableFile(atPath: url.path) { return url }
    }
    return dir.appendingPathComponent(name)
}

/// A child process a test started, with its stdout and stderr collected line by line (stderr lines with the
/// time they appeared). It is ended by its own PID: SIGKILL on release if it still runs — the test runner's
/// children inherit a signal mask that holds SIGTERM pending, so SIGTERM may never land.
package final class ChildProcess: Sendable {
    private struct Output {
        var out: [String] = []
        var err: [(Date, String)] = []
        var partial: [Int: Data] = [:]
    }

    private let process: Process
    private let output = Mutex(Output())

    /// Starts `executable` with `arguments`; `environment` entries are added to the test's own. stdin is
    /// `/dev/null` unless given.
    package init(_ executable: URL, _ arguments: [String], environment: [String: String]? = nil,
                 stdin: FileHandle? = nil, discardOutput: Bool = false) throws {
        let p = Process()
        process = p
        p.executableURL = executable
        p.arguments = arguments
        if let environment { p.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 } }
        p.standardInput = stdin ?? FileHandle.nullDevice
        if discardOutput {
            p.standardOutput = FileHandle.nullDevice
            p.standardError = FileHandle.nullDevice
        } else {
            let out = Pipe(), err = Pipe()
            p.standardOutput = out
            p.standardError = err
            out.fileHandleForReading.readabilityHandler = { [weak self] h in self?.take(h.availableData, stream: 1) }
            err.fileHandleForReading.readabilityHandler = { [weak self] h in self?.take(h.availableData, stream: 2) }
        }
        try p.run()
    }

    /// Starts a product of this package by name.
    package convenience init(product name: String, _ arguments: [String], environment: [String: String]? = nil,
                             stdin: FileHandle? = nil) throws {
        try self.init(builtProduct(name), arguments, environment: environment, stdin: stdin)
    }

    private func take(_ d: Data, stream: Int) {
        guard !d.isEmpty else { return }
        output.withLock { o in
            var buf = o.partial[stream, default: Data()] + d
            while let nl = buf.firstIndex(of: 0x0a) {
                let line = String(decoding: buf[buf.startIndex..<nl], as: UTF8.self)
                if stream == 1 { o.out.append(line) } else { o.err.append((Date(), line)) }
                buf = Data(buf[(nl + 1)...])
            }
            o.partial[stream] = buf
        }
    }

    package var pid: Int32 { process.processIdentifier }
    package var isRunning: Bool { process.isRunning }
    /// Lines printed on stdout so far.
    package var stdout: [String] { output.withLock { $0.out } }
    /// Lines printed on stderr so far.
    package var stderr: [String] { output.withLock { $0.err.map(\.1) } }

    /// When a stderr line containing `text` first appeared.
    package func timeOfLine(containing text: String) -> Date? {
        output.withLock { $0.err.first { $0.1.contains(text) }?.0 }
    }

    /// JSON objects printed on stdout.
    package var jsonObjects: [[String: Any]] {
        stdout.compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
    }

    /// The first JSON object on stdout whose line contains the quoted string `"text"` (as a key or a value).
    package func json(containing text: String) -> [String: Any]? {
        for l in stdout where l.contains("\"\(text)\"") {
            if let o = try? JSONSerialization.jsonObject(with: Data(l.utf8)) as? [String: Any] { return o }
        }
        return nil
    }

    /// Waits up to `seconds` for the process to exit; its status, or nil if it still runs.
    @discardableResult
    package func waitForExit(seconds: Double) -> Int32? {
        let deadline = Date().addingTimeInterval(seconds)
        while process.isRunning, Date() < deadline { usleep(10_000) }
        if process.isRunning { return nil }
        usleep(50_000) // let the pipes drain
        return process.terminationStatus
    }

    /// Sends `sig` to the process (by its PID) if it still runs.
    package func signal(_ sig: Int32) {
        if process.isRunning { kill(process.processIdentifier, sig) }
    }

    /// SIGKILL and wait.
    package func stop() {
        signal(SIGKILL)
        process.waitUntilExit()
    }

    deinit {
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }
}
