// Helpers every test target shares: waiting for conditions, free ports, built executables, child processes, seeded
// randomness.
import Foundation
import MeshPOSIX
import Synchronization

/// A seeded generator (SplitMix64): random tests replay exactly from their seed.
package typealias SeededRandom = SplitMix64

/// A port number for a host's `--port` (TCP and UDP with one number): below the kernel's ephemeral range (32768 and
/// up), so that no socket another test opens meanwhile is given it, and free for both when checked (bound, then
/// released). A number picked at random in the ephemeral range collided with a running test's sockets.
package func freePort() -> UInt16 {
    while true {
        let port = UInt16.random(in: 20_000...32_000)
        guard let any = SocketAddress(numericHost: "::", port: port),
              let tcp = try? FileDescriptor.tcpListener(any), let udp = try? FileDescriptor.udpSocket(any) else { continue }
        tcp.close()
        udp.close()
        return port
    }
}

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

/// Runs a real-time measurement up to `attempts` times (twice by default: a lost period now and then is the machine's,
/// one in each of two runs is worth failing for), until the rig leaves one undisturbed. `attempt` returns its
/// result and, when a device reported an xrun (the machine did not run a real-time thread in time: CPU taken by the
/// hypervisor on a shared VM, a JACK cycle that ran late), what disturbed it. A disturbed attempt is printed and run
/// again; the last one's result is returned either way, so a test whose every attempt was disturbed still fails its
/// own assertions (which include "no xruns"). For sample-exact checks only: a lost period there is the machine's,
/// not the code's, and it breaks the exactness the test is about.
package func undisturbed<Result>(_ label: String, attempts: Int = 2,
                                 _ attempt: () throws -> (result: Result, disturbance: String?)) rethrows -> Result {
    precondition(attempts >= 1)
    var n = 1
    while true {
        let (result, disturbance) = try attempt()
        guard let disturbance, n < attempts else { return result }
        print("\(label): attempt \(n) of \(attempts) disturbed by the rig (\(disturbance)); running it again")
        n += 1
    }
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
    /// The child's own runtime directory (`RUNTIME_DIRECTORY`), removed when it is released.
    private let runtimeDirectory: String

    /// Children started by this test process so far (each gets a runtime directory of its own).
    private static let started = Atomic<Int>(0)

    /// Starts `executable` with `arguments`; `environment` entries are added to the test's own. stdin is
    /// `/dev/null` unless given.
    ///
    /// The child gets a runtime directory of its own (`RUNTIME_DIRECTORY`, unless `environment` names one): a host's
    /// control socket never lands in `/run/peermesh`, where it would stand in for another test's host, another
    /// run's, or the machine's mesh-record.service (`--runtime-dir` still overrides it).
    package init(_ executable: URL, _ arguments: [String], environment: [String: String]? = nil,
                 stdin: FileHandle? = nil, discardOutput: Bool = false) throws {
        let p = Process()
        process = p
        p.executableURL = executable
        p.arguments = arguments
        let n = Self.started.wrappingAdd(1, ordering: .relaxed).newValue
        runtimeDirectory = NSTemporaryDirectory() + "peermesh-test-run-\(getpid())-\(n)"
        p.environment = ProcessInfo.processInfo.environment
            .merging(["RUNTIME_DIRECTORY": runtimeDirectory]) { $1 }
            .merging(environment ?? [:]) { $1 }
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
        ChildLedger.record(p.processIdentifier)
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

    /// When a stderr line containing `text` first appeared among the lines after the first `after`.
    package func timeOfLine(containing text: String, after: Int) -> Date? {
        output.withLock { $0.err.dropFirst(after).first { $0.1.contains(text) }?.0 }
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
        try? FileManager.default.removeItem(atPath: runtimeDirectory)
    }
}

/// Captures the UDP datagrams on the loopback interface, as an attacker on the host would (an `AF_PACKET`
/// socket; root only). Each capture keeps the datagrams whose destination port is in `ports` (all if empty).
package final class LoopbackCapture: Sendable {
    /// One captured UDP datagram.
    package struct Datagram: Sendable {
        package var sourceIP: [UInt8]
        package var sourcePort: UInt16
        package var destinationPort: UInt16
        package var payload: [UInt8]
    }

    private let fd: Int32
    private let captured = Mutex<[Datagram]>([])
    private let running = Atomic<Bool>(true)
    private let done = WakeSignal()
    private let ports: Set<UInt16>

    /// Starts capturing; throws if the socket cannot be opened (not root).
    package init(ports: Set<UInt16> = []) throws {
        self.ports = ports
        let ethPAll = UInt16(0x0003)
        let s = socket(17 /* AF_PACKET */, Int32(SOCK_DGRAM.rawValue), Int32(ethPAll.bigEndian))
        guard s >= 0 else { throw CaptureError(text: "AF_PACKET socket: \(String(cString: strerror(errno)))") }
        var tv = timeval(tv_sec: 0, tv_usec: 100_000)
        setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        // Bind to lo: struct sockaddr_ll { family u16, protocol u16 (BE), ifindex i32, hatype u16, pkttype u8, halen u8, addr[8] }.
        var ll = [UInt8](repeating: 0, count: 20)
        ll[0] = 17; ll[1] = 0
        ll[2] = UInt8(ethPAll >> 8); ll[3] = UInt8(ethPAll & 0xff)
        let index = Int32(if_nametoindex("lo"))
        withUnsafeBytes(of: index.littleEndian) { for i in 0..<4 { ll[4 + i] = $0[i] } }
        let rc = ll.withUnsafeBytes { bind(s, $0.baseAddress!.assumingMemoryBound(to: sockaddr.self), socklen_t(20)) }
        guard rc == 0 else {
            close(s)
            throw CaptureError(text: "bind(AF_PACKET, lo): \(String(cString: strerror(errno)))")
        }
        fd = s
        let t = Thread { [self] in run() }
        t.start()
    }

    private func run() {
        var buf = [UInt8](repeating: 0, count: 65_536)
        var ll = [UInt8](repeating: 0, count: 20)
        while running.load(ordering: .acquiring) {
            var len = socklen_t(20)
            let n = buf.withUnsafeMutableBytes { b in
                ll.withUnsafeMutableBytes { l in
                    recvfrom(fd, b.baseAddress, b.count, 0, l.baseAddress!.assumingMemoryBound(to: sockaddr.self), &len)
                }
            }
            // Outgoing packets on lo are seen twice (PACKET_OUTGOING and the loop back in): keep the incoming copy.
            guard n > 28, ll[10] != 4 /* PACKET_OUTGOING */ else { continue }
            guard buf[0] >> 4 == 4, buf[9] == 17 else { continue } // IPv4, UDP
            let ihl = Int(buf[0] & 0x0f) * 4
            guard n >= ihl + 8 else { continue }
            let sport = UInt16(buf[ihl]) << 8 | UInt16(buf[ihl + 1])
            let dport = UInt16(buf[ihl + 2]) << 8 | UInt16(buf[ihl + 3])
            guard ports.isEmpty || ports.contains(dport) else { continue }
            let d = Datagram(sourceIP: Array(buf[12..<16]), sourcePort: sport, destinationPort: dport,
                             payload: Array(buf[(ihl + 8)..<n]))
            captured.withLock { $0.append(d) }
        }
        done.signal()
    }

    /// What was captured so far.
    package var datagrams: [Datagram] { captured.withLock { $0 } }

    /// Stops capturing.
    package func stop() {
        guard running.exchange(false, ordering: .acquiringAndReleasing) else { return }
        done.wait()
        close(fd)
    }

    deinit { stop() }

    package struct CaptureError: Error, CustomStringConvertible {
        package let text: String
        package var description: String { text }
    }
}

/// The children tests start, written down where `scripts/test` can find them (`PEERMESH_TEST_CHILDREN`, a file
/// path): one line per child, its PID and its start time (field 22 of `/proc/PID/stat`). A child is normally ended
/// by its `ChildProcess`; if the test process itself dies first (a crash, CI's timeout), `scripts/test` ends those
/// still running whose start time matches — never a process that has taken the PID since.
package enum ChildLedger {
    private static let path = ProcessInfo.processInfo.environment["PEERMESH_TEST_CHILDREN"]

    /// Writes down a child just started (nothing without `PEERMESH_TEST_CHILDREN`).
    package static func record(_ pid: Int32) {
        guard let path, !path.isEmpty, let start = startTime(of: pid) else { return }
        let fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return }
        LineWriter.writeLine("\(pid) \(start)", to: fd) // one short O_APPEND write: lines never interleave
        close(fd)
    }

    /// The start time of `pid` in clock ticks since boot (`/proc/PID/stat` field 22), nil if it is gone.
    package static func startTime(of pid: Int32) -> String? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let nameEnd = stat.lastIndex(of: ")") else { return nil }
        // After "PID (comm) " the fields start at field 3 (state); the name may hold spaces and parentheses.
        let fields = stat[stat.index(after: nameEnd)...].split(separator: " ")
        return fields.count > 19 ? String(fields[19]) : nil
    }
}

/// A directory made read-only for everyone, root included: a read-only tmpfs mounted on it (as root, which
/// `scripts/test` is), else its permission bits.
package struct ReadOnlyDirectory {
    package let path: String
    let mounted: Bool

    package init(_ path: String) throws {
        self.path = path
        if geteuid() == 0 {
            let p = Process()
            p.executableURL = URL(fileURLWithPath: "/bin/mount")
            p.arguments = ["-t", "tmpfs", "-o", "ro,size=64k", "pm-readonly", path]
            try p.run()
            p.waitUntilExit()
            mounted = p.terminationStatus == 0
        } else {
            mounted = false
        }
        if !mounted { chmod(path, 0o555) }
    }

    package func undo() {
        if mounted {
            let p = Process()
            p.executableURL = URL(fileURLWithPath: "/bin/umount")
            p.arguments = [path]
            try? p.run()
            p.waitUntilExit()
        } else {
            chmod(path, 0o755)
        }
    }
}
