import Foundation
import MeshAudio
import PeerMesh
import Synchronization
@testable import MeshRelay

/// The environment flags `scripts/test` sets when its rigs run.
enum Rig {
    static let env = ProcessInfo.processInfo.environment
    static var jack: Bool { env["MESH_JACK_RIG"] == "1" }
    static var avahi: Bool { env["MESH_AVAHI_RIG"] == "1" }
    static var jackDir: String { env["MESH_JACK_RIG_DIR"] ?? "" }

    /// A fresh, valid service type so concurrent tests never see each other.
    static func uniqueService() -> String {
        "pmr-" + String((0..<8).map { _ in "abcdefghijklmnopqrstuvwxyz".randomElement()! })
    }

    static func tempPath(_ name: String) -> String {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("meshrelay-tests-\(getpid())")
        try? FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        return dir.appendingPathComponent(name).path
    }
}

/// An executable built by this package, next to the test bundle.
func product(_ name: String) -> URL {
    var dir = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    if dir.lastPathComponent.hasSuffix(".xctest") { dir = dir.deletingLastPathComponent() }
    return dir.appendingPathComponent(name)
}

/// A child CLI whose stdout and stderr lines are collected. Stopped with SIGKILL on release: the test runner's
/// children inherit a signal mask that holds SIGTERM pending.
final class CLIProcess: @unchecked Sendable { // lines are guarded by the lock; the process by the owning test
    let process = Process()
    private let lock = NSLock()
    private var outLines: [String] = []
    private var errLines: [(Date, String)] = []
    private var partial: [Int: Data] = [:]

    init(_ name: String, _ arguments: [String], stdin: FileHandle? = nil) throws {
        process.executableURL = product(name)
        process.arguments = arguments
        let out = Pipe(), err = Pipe()
        process.standardOutput = out
        process.standardError = err
        if let stdin { process.standardInput = stdin } else { process.standardInput = FileHandle.nullDevice }
        out.fileHandleForReading.readabilityHandler = { [weak self] h in self?.take(h.availableData, stream: 1) }
        err.fileHandleForReading.readabilityHandler = { [weak self] h in self?.take(h.availableData, stream: 2) }
        try process.run()
    }

    private func take(_ d: Data, stream: Int) {
        guard !d.isEmpty else { return }
        lock.lock()
        defer { lock.unlock() }
        var buf = partial[stream, default: Data()] + d
        while let nl = buf.firstIndex(of: 0x0a) {
            let line = String(decoding: buf[buf.startIndex..<nl], as: UTF8.self)
            if stream == 1 { outLines.append(line) } else { errLines.append((Date(), line)) }
            buf = Data(buf[(nl + 1)...])
        }
        partial[stream] = buf
    }

    var stdout: [String] { lock.lock(); defer { lock.unlock() }; return outLines }
    var stderr: [String] { lock.lock(); defer { lock.unlock() }; return errLines.map(\.1) }

    /// When a stderr line containing `text` first appeared.
    func timeOfLine(containing text: String) -> Date? {
        lock.lock(); defer { lock.unlock() }
        return errLines.first { $0.1.contains(text) }?.0
    }

    /// JSON objects printed on stdout.
    var jsonObjects: [[String: Any]] {
        stdout.compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
    }

    @discardableResult
    func waitForExit(seconds: Double) -> Int32? {
        let deadline = Date().addingTimeInterval(seconds)
        while process.isRunning, Date() < deadline { usleep(10_000) }
        if process.isRunning { return nil }
        usleep(50_000) // let the pipes drain
        return process.terminationStatus
    }

    func kill(_ sig: Int32 = SIGKILL) { if process.isRunning { Glibc.kill(process.processIdentifier, sig) } }

    deinit {
        if process.isRunning {
            Glibc.kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }
}

/// Waits until `condition` holds or `seconds` pass.
@discardableResult
func eventually(_ seconds: Double = 5, _ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if condition() { return true }
        usleep(5_000)
    }
    return condition()
}

/// All samples of a WAV file.
func readWAV(_ path: String) throws -> (samples: [Float], format: AudioFormat) {
    let source = try WAVFileSource(path: path, periodFrames: 1024, loop: false, realtime: false)
    try source.start()
    defer { source.stop() }
    var out: [Float] = []
    out.reserveCapacity(source.frameCount * source.format.channels)
    var buf = [Float](repeating: 0, count: 1024 * source.format.channels)
    while true {
        let info = buf.withUnsafeMutableBufferPointer { source.read(into: $0, timeoutNanos: 200_000_000) }
        guard let info else {
            if source.isFinished { break }
            continue
        }
        out.append(contentsOf: buf[0..<(info.frames * source.format.channels)])
    }
    return (out, source.format)
}

/// Raw Float32 little-endian samples.
func readRaw(_ path: String) throws -> [Float] {
    let d = try Data(contentsOf: URL(fileURLWithPath: path))
    return d.withUnsafeBytes { raw in (0..<(raw.count / 4)).map { Float(bitPattern: UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: $0 * 4, as: UInt32.self))) } }
}

/// Where a 256-sample window of the received audio starting at `start` sits inside `reference`: the offset of
/// its last exact match (the last, so that a reference made of a looped signal can be walked back through), or
/// `nil`.
func exactOffset(of received: [Float], at start: Int, in reference: [Float], window: Int = 256) -> Int? {
    guard start >= 0, start + window <= received.count else { return nil }
    let probe = Array(received[start..<(start + window)])
    guard probe.contains(where: { $0 != 0 }) else { return nil }
    var i = reference.count - window
    while i >= 0 {
        if reference[i] == probe[0], Array(reference[i..<(i + window)]) == probe { return i - start }
        i -= 1
    }
    return nil
}

/// The largest step between neighbouring samples.
func largestJump(_ s: ArraySlice<Float>) -> Float {
    var m: Float = 0
    var prev = s.first ?? 0
    for v in s { m = max(m, abs(v - prev)); prev = v }
    return m
}
