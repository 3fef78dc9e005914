import Foundation
import Synchronization
import PeerMesh
import MeshTestSupport

/// What the Avahi integration tests need from `scripts/lib/avahi-rig.sh`: whether the rig is up, its control
/// script, unique service types, child processes (avahi-publish, avahi-browse) and event recording.
enum AvahiRig {
    /// True when `avahi_rig_start` exported `MESH_AVAHI_RIG=1` (a loopback-only avahi-daemon is running).
    static var enabled: Bool { ProcessInfo.processInfo.environment["MESH_AVAHI_RIG"] == "1" }

    /// `DIR/avahi-ctl` when the rig owns its daemon (so tests may stop, start and restart it).
    static var ctl: String? { ProcessInfo.processInfo.environment["MESH_AVAHI_CTL"].flatMap { $0.isEmpty ? nil : $0 } }

    /// True when the rig can restart its daemon.
    static var canRestart: Bool { enabled && ctl != nil }

    /// A service type no other test uses: `pmt-` and eight random letters (valid by MC's rule).
    static func uniqueServiceType() -> String {
        "pmt-" + String((0..<8).map { _ in "abcdefghijklmnopqrstuvwxyz".randomElement()! })
    }

    /// Runs a command to completion (bounded), returning its exit status and standard output (or, with
    /// `standardError`, its standard error instead). `environment` is laid over this process's.
    static func run(_ executable: String, _ arguments: [String], timeout: Double = 20,
                    environment: [String: String] = [:], standardError: Bool = false) throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        if !environment.isEmpty {
            process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        }
        let out = Pipe()
        process.standardOutput = standardError ? FileHandle.nullDevice : out
        process.standardError = standardError ? out : FileHandle.nullDevice
        process.standardInput = FileHandle.nullDevice
        try process.run()
        let data = Mutex(Data())
        let reader = Thread {
            let d = out.fileHandleForReading.readDataToEndOfFile()
            data.withLock { $0 = d }
        }
        reader.start()
        let deadline = Date().addingTimeInterval(timeout)
        while process.isRunning, Date() < deadline { Thread.sleep(forTimeInterval: 0.02) }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
        while reader.isExecuting { Thread.sleep(forTimeInterval: 0.01) }
        return (process.terminationStatus, String(decoding: data.withLock { $0 }, as: UTF8.self))
    }

    /// `avahi-browse -rpt _<type>._tcp`: resolved lines (`=;iface;proto;name;type;domain;host;address;port;txt`)
    /// split into fields. Retries (bounded) until at least one resolved line appears.
    static func avahiBrowse(serviceType: String, attempts: Int = 5) throws -> [[String]] {
        for _ in 0..<attempts {
            let (_, out) = try run("/usr/bin/avahi-browse", ["-rpt", AvahiDiscovery.dnssdType(serviceType)])
            let lines = out.split(separator: "\n").filter { $0.hasPrefix("=;") }
                .map { $0.split(separator: ";", maxSplits: 9, omittingEmptySubsequences: false).map(String.init) }
            if !lines.isEmpty { return lines }
            Thread.sleep(forTimeInterval: 0.3)
        }
        return []
    }
}

extension ChildProcess {
    /// An avahi tool (`avahi-publish`…) with its output discarded.
    convenience init(avahiTool path: String, _ arguments: [String]) throws {
        try self.init(URL(fileURLWithPath: path), arguments, discardOutput: true)
    }
}

/// Collects a registration's events with their arrival times, and waits (bounded) for one that matches.
final class AvahiEventLog<Event: Sendable>: Sendable {
    private let events = Mutex<[(event: Event, at: ContinuousClock.Instant)]>([])

    var handler: @Sendable (Event) -> Void {
        { [self] e in events.withLock { $0.append((e, .now)) } }
    }

    var all: [Event] { events.withLock { $0.map(\.event) } }

    /// The first event (after the first `skip` ones) matching `predicate`, with its arrival time; nil after `timeout`.
    func wait(timeout: Duration = .seconds(8), skip: Int = 0,
              _ predicate: (Event) -> Bool) async -> (event: Event, at: ContinuousClock.Instant)? {
        let deadline = ContinuousClock.now + timeout
        while true {
            let hit = events.withLock { list in list.dropFirst(skip).first { predicate($0.event) } }
            if let hit { return hit }
            if ContinuousClock.now >= deadline { return nil }
            try? await Task.sleep(for: .milliseconds(20))
        }
    }

    var count: Int { events.withLock { $0.count } }
}

extension BrowseEvent {
    /// The found peer, if this is `.found`.
    var avahiFound: DiscoveredPeer? { if case .found(let p) = self { p } else { nil } }
    /// The lost peer, if this is `.lost`.
    var avahiLost: PeerID? { if case .lost(let p) = self { p } else { nil } }
}
