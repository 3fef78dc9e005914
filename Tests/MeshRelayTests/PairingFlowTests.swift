import Foundation
import MeshAudio
import MeshCLI
import MeshTestSupport
import PeerMesh
import Testing
@testable import MeshRelay

/// Pairing and trust as people use them: the CLIs with their state directories, real Avahi on lo, real UDP.
@Suite("Pairing and trust through the CLIs", .serialized, .avahiDaemonShared,
       .enabled(if: Rig.avahi, "needs scripts/test's Avahi rig"))
struct PairingFlowTests {
    /// A fresh state directory.
    static func stateDirectory(_ label: String) -> String {
        Rig.tempPath("state-\(label)-\(UUID().uuidString.prefix(8))")
    }

    /// The code from a host's `pairing code: CODE` line.
    static func code(of host: CLIProcess) -> String? {
        guard eventually(10, { host.stderr.contains { $0.contains("pairing code: ") } }) else { return nil }
        let line = host.stderr.first { $0.contains("pairing code: ") }!
        return line.components(separatedBy: "pairing code: ").last?.trimmingCharacters(in: .whitespaces)
    }

    /// A wrong code for `code`: same shape, other digits.
    static func wrong(_ code: String) -> String {
        String(code.map { c in c.isNumber ? Character(String((Int(String(c))! + 1) % 10)) : c })
    }

    /// The tone's body (past the fade-in) in a WAV file: its peak, and whether it is unbroken.
    static func assertTone(_ path: String, _ label: String) throws {
        let samples = try readWAV(path).samples
        let from = (samples.firstIndex { $0 != 0 } ?? samples.count) + 4_410
        let body = samples[min(from, samples.count)...]
        #expect(body.count > 22_050, "\(label): at least half a second of audio")
        #expect(abs((body.max() ?? 0) - 0.5) < 0.01, "\(label): the 0.5-amplitude tone")
    }

    @Test("Pair with the code from the host's stderr, then --find plays; unpaired, a player gets nothing and exits 1 with the 'not paired' line; a renamed host stays trusted")
    func pairThenPlay() throws {
        let service = Rig.uniqueService()
        let hostDir = Self.stateDirectory("host"), playerDir = Self.stateDirectory("player")
        let port = freePort()
        var host = try CLIProcess("mesh-record", ["--host", "--pair", "--name", "pair-host", "--service", service,
                                                  "--input", "tone:440", "--port", String(port), "--state-dir", hostDir, "--quiet"])
        defer { host.kill() }
        let code = try #require(Self.code(of: host), "\(host.stderr)")
        #expect(!code.contains(" ") && code.count >= 8, "a code to type: \(code)")

        // Before pairing: by address, the host declines it ("not paired"); by discovery, it is not even tried.
        let early = try CLIProcess("mesh-play", ["--connect", "127.0.0.1:\(port)", "--state-dir", playerDir,
                                                 "--output", Rig.tempPath("early.wav")])
        #expect(early.waitForExit(seconds: 15) == 1, "\(early.stderr)")
        #expect(early.stderr.contains { $0.contains("pair-host: not paired; pair with mesh-play --pair CODE") }, "\(early.stderr)")
        let finder = try CLIProcess("mesh-play", ["--find", "--service", service, "--state-dir", playerDir, "--duration", "3",
                                                  "--output", Rig.tempPath("unpaired.wav")])
        #expect(finder.waitForExit(seconds: 15) == 1, "\(finder.stderr)")
        #expect(finder.stderr.contains { $0.contains("pair-host (not paired)") }, "\(finder.stderr)")

        // Pair.
        let pairing = try CLIProcess("mesh-play", ["--pair", code, "--service", service, "--state-dir", playerDir])
        #expect(pairing.waitForExit(seconds: 15) == 0, "\(pairing.stderr)")
        #expect(pairing.stderr.contains { $0.contains("paired with pair-host (") }, "\(pairing.stderr)")
        let me = try PeerIdentity.load(from: playerDir + "/identity.json")
        #expect(me.displayName == RecordOptions.defaultName, "the player is named after the machine")
        #expect(eventually(3) { host.stderr.contains { $0.contains("paired \(me.displayName)") } }, "\(host.stderr)")

        // Paired: --find plays the tone.
        let out = Rig.tempPath("paired-\(service).wav")
        let player = try CLIProcess("mesh-play", ["--find", "--service", service, "--state-dir", playerDir,
                                                  "--output", out, "--duration", "2"])
        #expect(player.waitForExit(seconds: 20) == 0, "\(player.stderr)")
        #expect(player.stderr.contains { $0.contains("joined pair-host") }, "\(player.stderr)")
        try Self.assertTone(out, "paired")

        // Trust follows the key: the host comes back under another name and is still joined, by the name it was
        // paired under (a paired device cannot pass for another by taking its name). The lists keep that name, and
        // say which it gives now. The player, renamed too, is logged by the host under its paired name.
        host.kill()
        _ = host.waitForExit(seconds: 5)
        host = try CLIProcess("mesh-record", ["--host", "--name", "renamed-host", "--service", service, "--input", "tone:440",
                                              "--state-dir", hostDir])
        let again = try CLIProcess("mesh-play", ["--find", "--host", "pair-host", "--name", "renamed-player", "--service", service,
                                                 "--state-dir", playerDir, "--output", Rig.tempPath("renamed.wav"), "--duration", "4"])
        #expect(again.waitForExit(seconds: 20) == 0, "\(again.stderr)")
        #expect(again.stderr.contains { $0.contains("joined pair-host") }, "\(again.stderr)")
        #expect(host.stderr.contains { $0.contains("player \(me.displayName) joined from ") && $0.hasSuffix(", calls itself \"renamed-player\")") },
                "\(host.stderr)")
        #expect(eventually(3) { host.stderr.contains { $0.hasSuffix("player \(me.displayName) left") } }, "\(host.stderr)")
        // Asked for by the name it advertises now, it is not joined (with the killed host's record long replaced, the
        // player sees it advertise "renamed-host").
        let wrongName = try CLIProcess("mesh-play", ["--find", "--host", "renamed-host", "--service", service,
                                                     "--state-dir", playerDir, "--output", Rig.tempPath("wrong-name.wav")])
        #expect(eventually(10) { wrongName.stderr.contains { $0.contains("found host pair-host (calls itself \"renamed-host\"), not \"renamed-host\"; still searching") } },
                "\(wrongName.stderr)")
        wrongName.kill()
        #expect(!wrongName.stderr.contains { $0.contains("joined") }, "\(wrongName.stderr)")
        let listed = try CLIProcess("mesh-play", ["--paired", "--state-dir", playerDir])
        #expect(listed.waitForExit(seconds: 5) == 0)
        #expect(listed.stdout.contains { $0.hasPrefix("pair-host\t") && $0.contains("last seen") && $0.hasSuffix("\tcalls itself \"renamed-host\"") },
                "\(listed.stdout)")
        let found = try CLIProcess("mesh-play", ["--list", "--service", service, "--state-dir", playerDir])
        #expect(found.waitForExit(seconds: 10) == 0, "\(found.stderr)")
        #expect(found.stdout.contains { $0.hasPrefix("pair-host\t") && $0.contains("paired, calls itself \"renamed-host\"") }, "\(found.stdout)")
    }

    @Test("A wrong code exits 1 saying so; three wrong codes close the window; a code after the timeout is refused")
    func wrongCodesAndTimeout() throws {
        let service = Rig.uniqueService()
        let hostDir = Self.stateDirectory("host")
        let hostPort = freePort()
        let host = try CLIProcess("mesh-record", ["--host", "--pair", "--name", "guarded", "--service", service,
                                                  "--input", "tone:440", "--port", String(hostPort), "--state-dir", hostDir])
        defer { host.kill() }
        let code = try #require(Self.code(of: host), "\(host.stderr)")
        for attempt in 1...3 {
            let guess = try CLIProcess("mesh-play", ["--pair", Self.wrong(code), "--service", service,
                                                     "--state-dir", Self.stateDirectory("guess\(attempt)")])
            #expect(guess.waitForExit(seconds: 15) == 1, "attempt \(attempt): \(guess.stderr)")
            #expect(guess.stderr.contains { $0.contains("pairing failed: wrong pairing code") }, "attempt \(attempt): \(guess.stderr)")
        }
        #expect(eventually(3) { host.stderr.contains { $0.contains("pairing window closed (3 wrong codes)") } }, "\(host.stderr)")
        // The window is no longer advertised, and the right code is now too late: the window is shut. (Asked by
        // address: by discovery, a player finds no open window and waits its whole timeout for one.)
        #expect(eventually(5) {
            let listed = try? CLIProcess("mesh-play", ["--list", "--service", service, "--state-dir", Self.stateDirectory("lister")])
            guard let listed, listed.waitForExit(seconds: 10) == 0 else { return false }
            return listed.stdout.contains { $0.hasPrefix("guarded\t") && !$0.contains("pairing open") }
        }, "the closed window is no longer advertised")
        let late = try CLIProcess("mesh-play", ["--pair", code, "--connect", "127.0.0.1:\(hostPort)", "--state-dir", Self.stateDirectory("late")])
        #expect(late.waitForExit(seconds: 20) == 1, "\(late.stderr)")
        #expect(late.stderr.contains { $0.contains("pairing failed") && $0.contains("pairing window is closed") }, "\(late.stderr)")
        #expect(try TrustStore(path: hostDir + "/paired.json").list().isEmpty, "no guess paired anything")

        // A window that timed out refuses the right code.
        let service2 = Rig.uniqueService()
        let port = freePort()
        let brief = try CLIProcess("mesh-record", ["--host", "--pair", "--pair-timeout", "1", "--name", "brief", "--service", service2,
                                                   "--input", "tone:440", "--port", String(port), "--state-dir", Self.stateDirectory("brief")])
        defer { brief.kill() }
        let briefCode = try #require(Self.code(of: brief), "\(brief.stderr)")
        #expect(eventually(5) { brief.stderr.contains { $0.contains("pairing window closed") } }, "\(brief.stderr)")
        let tooLate = try CLIProcess("mesh-play", ["--pair", briefCode, "--connect", "127.0.0.1:\(port)",
                                                   "--state-dir", Self.stateDirectory("tooLate")])
        #expect(tooLate.waitForExit(seconds: 20) == 1, "\(tooLate.stderr)")
        #expect(tooLate.stderr.contains { $0.contains("pairing window is closed") }, "\(tooLate.stderr)")
    }

    @Test("--forget on the host disconnects a playing player within a second, and it cannot rejoin")
    func forgetDisconnects() throws {
        let service = Rig.uniqueService()
        let paired = try PairedStates(players: 1, hostName: "forgetful")
        let host = try CLIProcess("mesh-record", paired.hostArgs + ["--host", "--name", "forgetful", "--service", service, "--input", "tone:440"])
        defer { host.kill() }
        let player = try CLIProcess("mesh-play", paired.playerArgs(0) + ["--find", "--service", service, "--output", Rig.tempPath("forget.wav")])
        defer { player.kill() }
        #expect(eventually(10) { player.stderr.contains { $0.contains("joined forgetful") } }, "\(player.stderr)")
        let forget = try CLIProcess("mesh-record", paired.hostArgs + ["--forget", "player-0"])
        #expect(forget.waitForExit(seconds: 5) == 0, "\(forget.stderr)")
        let forgotAt = Date()
        #expect(forget.stderr.contains { $0.contains("forgot player-0") }, "\(forget.stderr)")
        #expect(eventually(3) { host.stderr.contains { $0.contains("player player-0 left") } }, "\(host.stderr)")
        if let left = host.timeOfLine(containing: "player player-0 left") {
            let ms = left.timeIntervalSince(forgotAt) * 1000
            print("--forget → player disconnected after \(Int(ms)) ms")
            #expect(ms <= 1_000)
        }
        // It tries again and is told it is not paired any more: it stops, with no audio since.
        #expect(player.waitForExit(seconds: 15) == 1, "\(player.stderr)")
        #expect(player.stderr.contains { $0.contains("forgetful: not paired") }, "\(player.stderr)")
        #expect(host.stderr.filter { $0.contains("player player-0 joined") }.count == 1, "\(host.stderr)")
    }

    @Test("A host that copies a paired host's name, but not its key, is not joined, and --list shows it as not paired")
    func impostorHost() throws {
        let service = Rig.uniqueService()
        let paired = try PairedStates(players: 1, hostName: "kitchen")
        // The impostor: same name and service, its own key (it cannot have the real one).
        let impostor = try CLIProcess("mesh-record", ["--host", "--name", "kitchen", "--service", service, "--input", "tone:440",
                                                      "--accept", "all", "--state-dir", Self.stateDirectory("impostor")])
        defer { impostor.kill() }
        #expect(eventually(10) { impostor.stderr.contains { $0.contains("advertised as") } }, "\(impostor.stderr)")
        let player = try CLIProcess("mesh-play", paired.playerArgs(0) + ["--find", "--host", "kitchen", "--service", service,
                                                                         "--duration", "3", "--output", Rig.tempPath("impostor.wav")])
        #expect(player.waitForExit(seconds: 15) == 1, "\(player.stderr)")
        #expect(!player.stderr.contains { $0.contains("joined") }, "\(player.stderr)")
        #expect(player.stderr.contains { $0.contains("kitchen (not paired)") }, "\(player.stderr)")
        #expect(impostor.stderr.filter { $0.contains("joined from") }.isEmpty, "the impostor was never even invited")
        let list = try CLIProcess("mesh-play", paired.playerArgs(0) + ["--list", "--service", service])
        #expect(list.waitForExit(seconds: 10) == 0, "\(list.stderr)")
        #expect(list.stdout.contains { $0.hasPrefix("kitchen\t") && $0.contains("\tnot paired") }, "\(list.stdout)")
    }

    @Test("Two hosts with one name, both paired: the second is kept as NAME-2, and --host picks each by the name it is kept under")
    func twoHostsOneName() throws {
        let service = Rig.uniqueService()
        let paired = try PairedStates(players: 1, hostName: "kitchen")
        let first = try CLIProcess("mesh-record", paired.hostArgs + ["--host", "--name", "kitchen", "--service", service,
                                                                    "--input", "tone:440"])
        defer { first.kill() }
        let second = try CLIProcess("mesh-record", ["--host", "--pair", "--name", "kitchen", "--service", service,
                                                    "--input", "tone:440", "--state-dir", Self.stateDirectory("second")])
        defer { second.kill() }
        let code = try #require(Self.code(of: second), "\(second.stderr)")
        let pairing = try CLIProcess("mesh-play", paired.playerArgs(0) + ["--pair", code, "--service", service])
        #expect(pairing.waitForExit(seconds: 15) == 0, "\(pairing.stderr)")
        #expect(pairing.stderr.contains { $0.contains("paired with kitchen (") && $0.hasSuffix("), as kitchen-2 (another paired device is called kitchen)") },
                "\(pairing.stderr)")
        #expect(try paired.playerTrust(0).list().map(\.name) == ["kitchen", "kitchen-2"])
        for (name, host, other) in [("kitchen-2", second, first), ("kitchen", first, second)] {
            let before = other.stderr.filter { $0.contains("joined from") }.count
            let player = try CLIProcess("mesh-play", paired.playerArgs(0) + ["--find", "--host", name, "--service", service,
                                                                             "--duration", "1.5", "--output", Rig.tempPath("\(name).wav")])
            #expect(player.waitForExit(seconds: 20) == 0, "\(name): \(player.stderr)")
            #expect(player.stderr.contains { $0.hasSuffix("joined \(name)") }, "\(name): \(player.stderr)")
            #expect(host.stderr.contains { $0.contains("joined from") }, "\(name): \(host.stderr)")
            #expect(other.stderr.filter { $0.contains("joined from") }.count == before, "\(name): the other host was not joined")
        }
    }

    @Test("Identity and trust survive a restart; a corrupted trust file is a clear error and is left as it was")
    func stateSurvivesAndDamageIsReported() throws {
        let service = Rig.uniqueService()
        let dir = Self.stateDirectory("restart")
        func keyLine(_ p: CLIProcess) -> String? {
            guard eventually(10, { p.stderr.contains { $0.contains(", key ") } }) else { return nil }
            return p.stderr.first { $0.contains(", key ") }?.components(separatedBy: ", key ").last?.components(separatedBy: ",").first
        }
        let first = try CLIProcess("mesh-record", ["--host", "--name", "steady", "--service", service, "--input", "tone:440", "--state-dir", dir])
        let key = keyLine(first)
        #expect(first.stderr.contains { $0.contains("created this device's identity") })
        first.kill()
        _ = first.waitForExit(seconds: 5)
        var mode = stat()
        #expect(stat(dir, &mode) == 0 && mode.st_mode & 0o777 == 0o700, "the state directory is 0700")
        #expect(stat(dir + "/identity.json", &mode) == 0 && mode.st_mode & 0o777 == 0o600, "the identity is 0600")
        let player = try PeerIdentity.generate(displayName: "remembered")
        try TrustStore(path: dir + "/paired.json").add(player.publicKey, name: "remembered")

        let second = try CLIProcess("mesh-record", ["--host", "--service", service, "--input", "tone:440", "--state-dir", dir])
        #expect(keyLine(second) == key && key != nil, "the same key after a restart")
        #expect(!second.stderr.contains { $0.contains("created") }, "\(second.stderr)")
        #expect(second.stderr.contains { $0.contains("serving \"steady\"") }, "the saved name is kept without --name")
        second.kill()
        _ = second.waitForExit(seconds: 5)
        let listed = try CLIProcess("mesh-record", ["--paired", "--state-dir", dir])
        #expect(listed.waitForExit(seconds: 5) == 0)
        #expect(listed.stdout.contains { $0.hasPrefix("remembered\t") }, "\(listed.stdout)")

        // Damage the trust file: a clear error, exit 1, the file untouched.
        let damaged = Data("{\"version\":1,\"devices\":[{\"name\":".utf8)
        try damaged.write(to: URL(fileURLWithPath: dir + "/paired.json"))
        let third = try CLIProcess("mesh-record", ["--host", "--service", service, "--input", "tone:440", "--state-dir", dir])
        #expect(third.waitForExit(seconds: 10) == 1, "\(third.stderr)")
        #expect(third.stderr.contains { $0.contains(dir + "/paired.json") }, "the error names the file: \(third.stderr)")
        let forget = try CLIProcess("mesh-record", ["--forget", "remembered", "--state-dir", dir])
        #expect(forget.waitForExit(seconds: 5) == 1, "\(forget.stderr)")
        #expect(try Data(contentsOf: URL(fileURLWithPath: dir + "/paired.json")) == damaged, "nothing overwrote the damaged file")
    }

    /// Where this package's scripts are.
    static let scripts = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("scripts")

    @Test("--accept ask on a terminal: the prompt stays on screen, an escape in the name is shown escaped, 'a' pairs the player",
          .enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/python3"), "needs python3"))
    func askOnATerminal() throws {
        let service = Rig.uniqueService()
        let paired = try PairedStates(players: 0, hostName: "ask-tty")
        let sneaky = "\u{1B}[2K\u{1B}[1Galice"
        let player = try paired.addPlayer(0, name: sneaky)
        try FileManager.default.removeItem(atPath: paired.hostDirectory + "/paired.json")
        let port = freePort()
        let report = Rig.tempPath("pty-\(service).json")
        let session = try ChildProcess(URL(fileURLWithPath: "/usr/bin/python3"), [
            Self.scripts.appendingPathComponent("lib/pty_session.py").path, report, "--wait-for", "Allow?", "--hold", "3",
            "--answer", "a", "--after", "2", "--",
            builtProduct("mesh-record").path, "--host", "--accept", "ask", "--service", service, "--port", String(port),
            "--input", "tone:440", "--state-dir", paired.hostDirectory])
        defer { session.kill() }
        Thread.sleep(forTimeInterval: 1)
        let listener = try CLIProcess("mesh-play", paired.playerArgs(0) + ["--connect", "127.0.0.1:\(port)",
                                                                           "--output", Rig.tempPath("ask-tty.wav")])
        defer { listener.kill() }
        #expect(session.waitForExit(seconds: 30) == 0, "\(session.stderr)")
        let json = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: report))) as? [String: Any])
        let screen = try #require(json["screen_at_hold"] as? [String], "the prompt never appeared: \(json["raw"] ?? "")")
        let prompt = screen.last { $0.contains("Allow?") }
        print("ask prompt, 3 s after it appeared:\n" + screen.filter { !$0.isEmpty }.joined(separator: "\n"))
        #expect(prompt != nil, "the prompt is on screen 3 s later: \(screen)")
        #expect(prompt?.contains("player \"\\x1b[2K\\x1b[1Galice\" at 127.0.0.1") == true, "the name is escaped: \(prompt ?? "")")
        #expect(prompt?.contains("key \(player.publicKey.shortFingerprint)") == true)
        #expect(prompt?.contains("check code ") == true)
        // Shown on the terminal, the code is revealed to the player, which (kept waiting) shows the same one.
        let code = try #require(prompt.flatMap { p in p.range(of: "check code ").map { String(p[$0.upperBound...].prefix(7)) } })
        #expect(code.count == 7 && code.filter(\.isNumber).count == 6, "\(code)")
        #expect(listener.stderr.contains { $0.hasSuffix("check code there is \(code)") }, "\(listener.stderr)")
        let raw = json["raw"] as? String ?? ""
        #expect(!raw.contains("\u{1B}[1Galice"), "no raw escape from the peer reached the terminal")
        #expect(eventually(10) { listener.stderr.contains { $0.contains("joined ask-tty") } }, "\(listener.stderr)")
        #expect(try paired.hostTrust.list().map(\.publicKey) == [player.publicKey], "'a' paired the player")
    }
}
