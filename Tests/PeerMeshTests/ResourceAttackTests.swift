import Foundation
import Testing
import MeshPOSIX
import MeshTestSupport
@testable import PeerMesh

/// The resident memory of a process, in MB (VmRSS).
private func residentMegabytes(_ pid: Int32) -> Double? {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
          let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
          let kb = Double(line.split(separator: " ").dropFirst().first ?? "") else { return nil }
    return kb / 1024
}

/// Open descriptors of a process.
private func openDescriptors(_ pid: Int32) -> Int {
    (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count) ?? -1
}

/// A host (`peermesh-probe host`) under attack from this test process, and a real peer that must still join.
private struct ProbeHost {
    let process: ChildProcess
    let port: UInt16

    init(service: String, fileLimit: Int? = nil) throws {
        let probe = builtProduct("peermesh-probe").path
        let args = ["host", "--service", service, "--name", "victim", "--direct"]
        let child: ChildProcess
        if let fileLimit {
            child = try ChildProcess(URL(fileURLWithPath: "/bin/bash"),
                                     ["-c", "ulimit -n \(fileLimit) && exec \"$0\" \"$@\"", probe] + args)
        } else {
            child = try ChildProcess(URL(fileURLWithPath: probe), args)
        }
        guard eventually(10, { child.json(containing: "advertising") != nil }),
              let p = child.json(containing: "advertising")?["port"] as? Int else {
            throw PeerMeshError.transport("probe did not start: \(child.stderr)")
        }
        process = child
        port = UInt16(p)
    }

    /// A real peer joins with `peermesh-probe join` and exchanges messages and datagrams: its exit status.
    func realPeerJoins() throws -> (Int32?, [String]) {
        let join = try ChildProcess(product: "peermesh-probe", ["join", "--connect", "127.0.0.1:\(port)", "--reliable", "5",
                                                               "--datagrams", "20", "--timeout", "8", "--name", "real"])
        return (join.waitForExit(seconds: 15), join.stdout + join.stderr)
    }
}

/// Resource attacks on a host process: memory and descriptors stay bounded, and a real peer still joins.
@Suite("Attacks on a host's memory and descriptors (real processes)", .serialized)
struct ResourceAttackTests {
    @Test("200 authenticated connections that each start a maximum-size record and stop: RSS stays small, a real peer joins")
    func unfinishedMaximumRecords() throws {
        let host = try ProbeHost(service: "pm-rss")
        let baseline = try #require(residentMegabytes(host.process.pid))
        var held: [RawGuest] = []
        for i in 0..<200 {
            // A real handshake (any key will do: the attacker needs none of ours), then most of a 64 KiB record. From
            // 25 addresses, 8 each: one address that leaves more than 16 handshakes unfinished (these never invite) is
            // refused, and the test is about memory, not that ration.
            let guest = try RawGuest(port: host.port, name: "attacker\(i)", from: "127.0.1.\(1 + i / 8)")
            guest.sendRaw([0xff, 0xff] + [UInt8](repeating: 0x5a, count: 60_000))
            held.append(guest)
        }
        usleep(500_000)
        let during = try #require(residentMegabytes(host.process.pid))
        let (status, output) = try host.realPeerJoins()
        #expect(status == 0, "\(output)")
        #expect(during < 64, "host RSS \(during) MB with 200 attackers (baseline \(baseline) MB)")
        print("resource attack: host RSS \(String(format: "%.1f", baseline)) MB → \(String(format: "%.1f", during)) MB with 200 unfinished 64 KiB records; \(openDescriptors(host.process.pid)) fds open; a real peer joined")
        withExtendedLifetime(held) {}
    }

    @Test("1500 idle connections against a file-descriptor limit of 1024: a real peer still joins")
    func idleConnectionFlood() throws {
        Sys.raiseFileLimit()
        let host = try ProbeHost(service: "pm-fds", fileLimit: 1024)
        var held: [FileDescriptor] = []
        for _ in 0..<1500 {
            guard let fd = try? connectRaw(host.port) else { break }
            held.append(fd)
        }
        #expect(held.count == 1500, "the attacker opened \(held.count) connections")
        usleep(500_000)
        let (status, output) = try host.realPeerJoins()
        #expect(status == 0, "\(output)")
        let fds = openDescriptors(host.process.pid)
        #expect(fds < 200, "the host holds \(fds) descriptors")
        print("idle flood: 1500 idle connections, host at \(fds) fds (limit 1024); a real peer joined")
        withExtendedLifetime(held) {}
    }
}
