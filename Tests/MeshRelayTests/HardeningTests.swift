import Foundation
import MeshAudio
import MeshTestSupport
import PeerMesh
import Testing
@testable import MeshRelay

/// What users and attackers hit first, through the real CLIs: hostile samples, honest exits, names and addresses,
/// a daemon that comes late, a host that restarts. Real Avahi on lo, real UDP, encrypted and paired.
@Suite("Hardening and honest behaviour (CLIs)", .serialized, .avahiDaemonShared,
       .enabled(if: Rig.avahi, "needs scripts/test's Avahi rig"))
struct HardeningTests {
    /// A host that sends ±FLT_MAX, NaN and ±inf: the player neither traps nor plays them; it clamps, zeroes, counts.
    @Test("A host sending ±FLT_MAX, NaN and ±inf samples: the player plays on, clamps and zeroes them, and counts them")
    func hostileSamples() throws {
        var hostile: [Float] = []
        for i in 0..<(2 * 44_100) {
            switch i % 7 {
            case 0: hostile.append(.greatestFiniteMagnitude)
            case 1: hostile.append(-.greatestFiniteMagnitude)
            case 2: hostile.append(.nan)
            case 3: hostile.append(.infinity)
            case 4: hostile.append(-.infinity)
            default: hostile.append(0.25)
            }
        }
        let input = Rig.tempPath("hostile-\(UUID().uuidString.prefix(6)).wav")
        try SoundFiles.write(path: input, format: .default, encoding: .float32, samples: hostile)
        let service = Rig.uniqueService()
        let paired = try PairedStates()
        let host = try CLIProcess("mesh-record", paired.hostArgs + ["--host", "--name", "evil-host", "--service", service,
                                                                   "--input", input, "--quiet"])
        defer { host.kill() }
        let out = Rig.tempPath("hostile-\(service).wav")
        // --quiet still computes the status line's meter every second: that is where ±FLT_MAX used to trap.
        let player = try CLIProcess("mesh-play", paired.playerArgs() + ["--find", "--service", service, "--output", out,
                                                                       "--sample-format", "f32", "--duration", "3", "--json", "--quiet"])
        #expect(player.waitForExit(seconds: 20) == 0, "\(player.stderr)")
        let final = try #require(player.jsonObjects.last { $0["final"] as? Bool == true }, "\(player.stdout)")
        #expect((final["sanitizedSamples"] as? Int ?? 0) > 10_000, "\(final)")
        let samples = try readWAV(out).samples
        #expect(samples.count > 44_100)
        #expect(samples.allSatisfy { $0.isFinite && abs($0) <= 1 }, "every sample played is finite and within [-1, 1]")
        #expect(samples.contains { abs($0 - 1) < 1e-6 } && samples.contains { abs($0 + 1) < 1e-6 }, "±FLT_MAX clamped to ±1")
    }

    @Test("A player that never played a frame exits 1 and says why; --quiet still prints the error; --list says when empty")
    func honestExits() throws {
        let service = Rig.uniqueService()
        let paired = try PairedStates()
        // No host at all, with --duration: exit 1, not 0 with seconds of silence.
        let none = try CLIProcess("mesh-play", paired.playerArgs() + ["--find", "--service", service, "--duration", "1",
                                                                     "--output", Rig.tempPath("none.wav"), "--quiet"])
        #expect(none.waitForExit(seconds: 15) == 1)
        #expect(none.stderr.contains { $0.contains("no paired host found (service _\(service)._tcp); no hosts seen at all") },
                "--quiet hides events, never the error: \(none.stderr)")
        #expect(!none.stderr.contains { $0.contains("searching") }, "--quiet hides events: \(none.stderr)")
        // --quiet and a refused address: the error is printed.
        let refused = try CLIProcess("mesh-play", paired.playerArgs() + ["--quiet", "--connect", "127.0.0.1:1",
                                                                        "--output", Rig.tempPath("refused.wav")])
        #expect(refused.waitForExit(seconds: 20) == 1)
        #expect(refused.stderr.contains { $0.contains("cannot join 127.0.0.1:1") && $0.contains("refused") }, "\(refused.stderr)")
        // --list with no host: a line saying so and exit 1; with --json an empty array.
        let list = try CLIProcess("mesh-play", paired.playerArgs() + ["--list", "--service", service])
        #expect(list.waitForExit(seconds: 10) == 1)
        #expect(list.stderr.contains { $0.contains("no hosts found (service _\(service)._tcp, 2 s)") }, "\(list.stderr)")
        let listJSON = try CLIProcess("mesh-play", paired.playerArgs() + ["--list", "--json", "--service", service, "--duration", "1"])
        #expect(listJSON.waitForExit(seconds: 10) == 1)
        #expect(listJSON.stdout == ["[]"], "\(listJSON.stdout)")
    }

    @Test("--host matches any case and a fingerprint prefix; a wrong --host lists what it saw, escaped once")
    func hostMatching() throws {
        let service = Rig.uniqueService()
        let paired = try PairedStates(hostName: "Kitchen\u{202E}Den")
        let host = try CLIProcess("mesh-record", paired.hostArgs + ["--host", "--service", service, "--input", "tone:440"])
        defer { host.kill() }
        let fp = String(paired.host.publicKey.shortFingerprint.prefix(4))
        for (label, wanted) in [("case", "kitchen\u{202E}den"), ("fingerprint", fp)] {
            let p = try CLIProcess("mesh-play", paired.playerArgs() + ["--find", "--host", wanted, "--service", service,
                                                                      "--duration", "1.5", "--output", Rig.tempPath("match-\(label).wav")])
            #expect(p.waitForExit(seconds: 20) == 0, "\(label): \(p.stderr)")
            #expect(p.stderr.contains { $0.contains("joined Kitchen\\u{202e}Den") }, "\(label), escaped: \(p.stderr)")
        }
        let wrong = try CLIProcess("mesh-play", paired.playerArgs() + ["--find", "--host", "garage", "--service", service,
                                                                      "--duration", "2", "--output", Rig.tempPath("wrong.wav")])
        #expect(wrong.waitForExit(seconds: 20) == 1)
        #expect(wrong.stderr.contains { $0.hasSuffix("no host \"garage\" found (service _\(service)._tcp); saw: Kitchen\\u{202e}Den (paired)") },
                "escaped once, not twice: \(wrong.stderr)")
    }

    @Test("--connect resolves names and takes IPv6 literals: localhost:PORT and [::1]:PORT both play; a bad name is not retried")
    func connectByNameAndIPv6() throws {
        let paired = try PairedStates(hostName: "dual")
        let port = freePort()
        let host = try CLIProcess("mesh-record", paired.hostArgs + ["--host", "--name", "dual", "--service", Rig.uniqueService(),
                                                                   "--input", "tone:440", "--port", String(port)])
        defer { host.kill() }
        #expect(eventually(5) { host.stderr.contains { $0.contains("on port \(port)") } }, "\(host.stderr)")
        for address in ["localhost:\(port)", "[::1]:\(port)"] {
            let p = try CLIProcess("mesh-play", paired.playerArgs() + ["--connect", address, "--duration", "1.5",
                                                                      "--output", Rig.tempPath("connect.wav")])
            #expect(p.waitForExit(seconds: 20) == 0, "\(address): \(p.stderr)")
            #expect(p.stderr.contains { $0.contains("joined dual") }, "\(address): \(p.stderr)")
        }
        let started = Date()
        let bad = try CLIProcess("mesh-play", paired.playerArgs() + ["--connect", "no-such-host.invalid:\(port)",
                                                                    "--output", Rig.tempPath("bad.wav")])
        #expect(bad.waitForExit(seconds: 20) == 1)
        #expect(Date().timeIntervalSince(started) < 5, "a name that does not resolve is not retried")
        #expect(bad.stderr.filter { $0.contains("no-such-host.invalid") }.count >= 1, "\(bad.stderr)")
        #expect(!bad.stderr.contains { $0.contains("attempts") }, "one attempt, not five: \(bad.stderr)")
    }

    @Test("A host restarted with its identity is rejoined within 300 ms of its first announcement, after at most one failed attempt")
    func rejoinAfterRestart() throws {
        let service = Rig.uniqueService()
        let paired = try PairedStates(hostName: "phoenix")
        var host = try CLIProcess("mesh-record", paired.hostArgs + ["--host", "--service", service, "--input", "tone:440"])
        let player = try CLIProcess("mesh-play", paired.playerArgs() + ["--find", "--service", service, "--duration", "12",
                                                                       "--output", Rig.tempPath("rejoin-\(service).wav")])
        defer { player.kill(); host.kill() }
        #expect(eventually(10) { player.stderr.contains { $0.contains("joined phoenix") } }, "\(player.stderr)")
        host.kill(SIGKILL)
        _ = host.waitForExit(seconds: 5)
        #expect(eventually(4) { player.stderr.contains { $0.contains("went away") } }, "\(player.stderr)")
        let before = player.stderr.count
        host = try CLIProcess("mesh-record", paired.hostArgs + ["--host", "--service", service, "--input", "tone:440"])
        #expect(eventually(10) { player.stderr.dropFirst(before).contains { $0.contains("joined phoenix") } }, "\(player.stderr)")
        let announced = try #require(host.timeOfLine(containing: "advertised as _"), "\(host.stderr)")
        let rejoined = try #require(player.timeOfLine(containing: "joined phoenix", after: before), "\(player.stderr)")
        let ms = rejoined.timeIntervalSince(announced) * 1000
        print("host restarted → advertised → player rejoined after \(Int(ms)) ms")
        #expect(ms <= 300, "rejoined \(Int(ms)) ms after the announcement: \(player.stderr)")
        let failed = player.stderr.dropFirst(before).filter { $0.contains("could not join") }
        #expect(failed.count <= 1, "a stale record costs at most one failed attempt: \(failed)")
    }

    @Test("A host started before avahi-daemon says it waits, publishes when the daemon appears, and is then found",
          .avahiDaemonExclusive, .enabled(if: ProcessInfo.processInfo.environment["MESH_AVAHI_CTL"] != nil, "needs a daemon this rig owns"))
    func avahiAfterHost() throws {
        let ctl = ProcessInfo.processInfo.environment["MESH_AVAHI_CTL"]!
        func avahi(_ verb: String) throws {
            let p = try ChildProcess(URL(fileURLWithPath: ctl), [verb])
            #expect(p.waitForExit(seconds: 20) == 0, "avahi-ctl \(verb): \(p.stderr)")
        }
        try avahi("stop")
        defer { try? avahi("start") }
        let service = Rig.uniqueService()
        let paired = try PairedStates(hostName: "early-bird")
        let host = try CLIProcess("mesh-record", paired.hostArgs + ["--host", "--service", service, "--input", "tone:440", "--json"])
        defer { host.kill() }
        #expect(eventually(5) { host.stderr.contains { $0.contains("waiting for avahi-daemon") } }, "\(host.stderr)")
        Thread.sleep(forTimeInterval: 1)
        #expect(!host.stderr.contains { $0.contains("advertised as _") }, "nothing is claimed before the daemon runs: \(host.stderr)")
        #expect(eventually(5) { !host.jsonObjects.isEmpty }, "one JSON status a second")
        #expect(host.jsonObjects.last?["advertised"] as? Bool == false, "\(host.stdout.suffix(1))")
        try avahi("start")
        #expect(eventually(15) { host.stderr.contains { $0.contains("advertised as _\(service)._tcp") } }, "\(host.stderr)")
        let player = try CLIProcess("mesh-play", paired.playerArgs() + ["--find", "--service", service, "--duration", "1.5",
                                                                       "--output", Rig.tempPath("early.wav")])
        #expect(player.waitForExit(seconds: 20) == 0, "\(player.stderr)")
        #expect(player.stderr.contains { $0.contains("joined early-bird") }, "\(player.stderr)")
    }
}
