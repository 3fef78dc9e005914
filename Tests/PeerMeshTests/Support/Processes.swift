import Foundation

/// Finds an executable built by this package next to the test bundle (`swift build` puts them side by side).
func builtProduct(_ name: String) -> URL {
    var dir = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    if dir.lastPathComponent.hasSuffix(".xctest") { dir = dir.deletingLastPathComponent() }
    for candidate in [dir, dir.deletingLastPathComponent(), URL(fileURLWithPath: FileManager.default.currentDirectoryPath).appendingPathComponent(".build/debug")] {
        let url = candidate.appendingPathComponent(name)
        if FileManager.default.isExecutableFile(atPath: url.path) { return url }
    }
    return dir.appendingPathComponent(name)
}

/// A child process whose stdout is collected line by line.
final class Child: @unchecked Sendable { // lines is guarded by lock; process is only touched by the owning test
    let process = Process()
    private let lock = NSLock()
    private var buffer = Data()
    private(set) var lines: [String] = []

    init(_ executable: URL, _ arguments: [String], environment: [String: String]? = nil) throws {
        process.executableURL = executable
        process.arguments = arguments
        if let environment { process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 } }
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = FileHandle.standardError
        pipe.fileHandleForReading.readabilityHandler = { [weak self] h in
            let d = h.availableData
            guard let self, !d.isEmpty else { return }
            self.lock.lock()
            self.buffer.append(d)
            while let nl = self.buffer.firstIndex(of: 0x0a) {
                self.lines.append(String(decoding: self.buffer[self.buffer.startIndex..<nl], as: UTF8.self))
                self.buffer.removeSubrange(self.buffer.startIndex...nl)
            }
            self.lock.unlock()
        }
        try process.run()
    }

    var output: [String] { lock.lock(); defer { lock.unlock() }; return lines }

    /// The first JSON line containing `key`, decoded.
    func json(containing key: String) -> [String: Any]? {
        for l in output where l.contains("\"\(key)\"") {
            if let o = try? JSONSerialization.jsonObject(with: Data(l.utf8)) as? [String: Any] { return o }
        }
        return nil
    }

    func signal(_ s: Int32) { if process.isRunning { kill(process.processIdentifier, s) } }

    deinit {
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }
}
