import Foundation
import Testing
import MeshAudio
import MeshCLI
import MeshTestSupport
@testable import MeshRelay

/// The listener talks back, through the CLIs as scripts drive them: mesh-play reads one command a line on stdin,
/// and prints each answer as an event line. Real processes, encrypted and paired, over 127.0.0.1.
@Suite(.serialized)
struct RemoteControlTests {
    /// A paired host serving `input` (a 440 Hz tone by default) on a port of its own, with `extra` flags.
    static func host(_ paired: PairedStates, _ extra: [String] = [], input: String = "tone:440") throws -> (CLIProcess, UInt16) {
        let port = freePort()
        let host = try CLIProcess("mesh-record", paired.hostArgs + ["--host", "--name", "ctl-host", "--service", Rig.uniqueService(),
                                                                   "--input", input, "--port", String(port)] + extra)
        #expect(eventually(10) { host.stderr.contains { $0.contains("on port \(port)") } }, "\(host.stderr)")
        return (host, port)
    }

    /// A player writing to a WAV file, with a pipe for its stdin, and `extra` flags.
    static func player(_ paired: PairedStates, _ i: Int = 0, port: UInt16, seconds: Double, out: String,
                       _ extra: [String] = []) throws -> (CLIProcess, FileHandle) {
        let stdin = Pipe()
        let p = try CLIProcess("mesh-play", paired.playerArgs(i) + ["--connect", "127.0.0.1:\(port)", "--output", out,
                                                                   "--duration", String(seconds), "--json"] + extra,
                               stdin: stdin.fileHandleForReading)
        return (p, stdin.fileHandleForWriting)
    }

    /// Writes `line` to a player's stdin. Never `FileHandle.write(_:)`, which traps on a player that died (EPIPE),
    /// taking the whole test process down with the children it would have ended.
    static func say(_ line: String, to h: FileHandle) { try? h.write(contentsOf: Data((line + "\n").utf8)) }

    /// RMS of each 50 ms window.
    static func windows(_ s: [Float], size: Int = 2_205) -> [Float] {
        stride(from: 0, to: s.count - size, by: size).map { start in
            (s[start..<(start + size)].reduce(0) { $0 + $1 * $1 } / Float(size)).squareRoot()
        }
    }

    /// The longest run of exactly silent windows after the first audible one: its length, and the index just past
    /// it (0 and the first audible window's index when there is none); nil when nothing was audible.
    static func longestSilentRun(_ w: [Float]) -> (count: Int, end: Int)? {
        guard let start = w.firstIndex(where: { $0 > 0.05 }) else { return nil }
        var longest = (count: 0, end: start), run = 0
        for i in start..<w.count {
            run = w[i] == 0 ? run + 1 : 0
            if run > longest.count { longest = (run, i + 1) }
        }
        return longest
    }

    /// The length of `longestSilentRun`; nil when nothing was audible.
    static func longestSilence(_ w: [Float]) -> Int? { longestSilentRun(w)?.count }

    static func median(_ v: some Collection<Float>) -> Float { v.sorted()[v.count / 2] }

    @Test("volume -6 halfway: the second half's RMS is 0.50 ± 0.03 of the first; unsupported commands and bad lines are answered, and play goes on")
    func volume() throws {
        let paired = try PairedStates(hostName: "ctl-host")
        let (host, port) = try Self.host(paired)
        defer { host.kill() }
        let out = Rig.tempPath("volume-\(UUID().uuidString.prefix(6)).wav")
        let (p, stdin) = try Self.player(paired, port: port, seconds: 4.5, out: out)
        #expect(eventually(10) { p.stderr.contains { $0.contains("joined ctl-host") } }, "\(p.stderr)")
        Thread.sleep(forTimeInterval: 1.8)
        Self.say("volume -6", to: stdin)
        Self.say("capture", to: stdin)
        Self.say("talk on", to: stdin)
        Self.say("jump", to: stdin)
        #expect(p.waitForExit(seconds: 20) == 0, "\(p.stderr)")
        #expect(p.stderr.contains { $0.hasSuffix("volume -6 dB") })
        #expect(p.stderr.contains { $0.hasSuffix("capture single: not sent: the host keeps no clips (mesh-record --clips DIR)") }, "\(p.stderr)")
        #expect(p.stderr.contains { $0.hasSuffix("talk on: not sent: the host takes no talkback") })
        #expect(p.stderr.contains { $0.contains("unknown command \"jump\"") })
        let w = Self.windows(try readWAV(out).samples)
        guard let first = w.firstIndex(where: { $0 > 0.05 }), w.count > first + 60 else { Issue.record("no audio: \(w.count) windows"); return }
        let before = Self.median(w[(first + 6)..<(first + 20)])
        let after = Self.median(w[(w.count - 14)..<(w.count - 2)])
        #expect(abs(after / before - 0.5) <= 0.03, "RMS \(before) → \(after): ratio \(after / before)")
        #expect((p.jsonObjects.last?["volumeDb"] as? Double) == -6)
    }

    @Test("pause for 3 s then resume: the session stays connected; silence, then the host's audio at the live edge (no backlog); a second player plays throughout")
    func pauseAndResume() throws {
        let paired = try PairedStates(players: 2, hostName: "ctl-host")
        // A signal that never repeats within the run, so that where A's audio sits in it says when the host captured it.
        let (signal, input) = try signalWAV("pause-signal-\(UUID().uuidString.prefix(6)).wav", seconds: 30)
        let (host, port) = try Self.host(paired, ["--json"], input: input)
        defer { host.kill() }
        let outA = Rig.tempPath("pause-a-\(UUID().uuidString.prefix(6)).wav"), outB = Rig.tempPath("pause-b-\(UUID().uuidString.prefix(6)).wav")
        let (a, stdin) = try Self.player(paired, 0, port: port, seconds: 9, out: outA, ["--sample-format", "f32"])
        let (b, _) = try Self.player(paired, 1, port: port, seconds: 9, out: outB)
        #expect(eventually(10) { a.stderr.contains { $0.contains("joined ctl-host") } && b.stderr.contains { $0.contains("joined ctl-host") } })
        Thread.sleep(forTimeInterval: 1.5)
        Self.say("pause", to: stdin)
        #expect(eventually(5) { a.stderr.contains { $0.hasSuffix("pause: ok") } }, "\(a.stderr)")
        #expect(eventually(5) { a.stderr.contains { $0.contains("paused (the host holds this player's audio)") } })
        #expect(eventually(5) { host.stderr.contains { $0.contains("player-0 paused") } }, "\(host.stderr)")
        // Longer than the session's 2 s liveness timeout: a paused player stays connected.
        Thread.sleep(forTimeInterval: 3)
        Self.say("resume", to: stdin)
        #expect(eventually(5) { a.stderr.contains { $0.hasSuffix("resume: ok") } && a.stderr.contains { $0.hasSuffix("playing") } }, "\(a.stderr)")
        #expect(a.waitForExit(seconds: 20) == 0, "\(a.stderr)")
        #expect(b.waitForExit(seconds: 20) == 0, "\(b.stderr)")

        // A: tone, then at least a second of exact silence, then the tone again.
        let sa = try readWAV(outA).samples
        let wa = Self.windows(sa)
        guard let (longest, silenceEndWindow) = Self.longestSilentRun(wa) else { Issue.record("A played nothing"); return }
        #expect(longest >= 50 && longest <= 75, "silence of \(longest) windows of 50 ms (paused for 3 s)")
        #expect(wa[(wa.count - 10)...].allSatisfy { $0 > 0.05 }, "audio again after resume")
        // At the live edge: the host's signal went on during the pause as A's output did (silence, in real time), so
        // a window of A's audio half a second after the silence sits where one half a second before it did, shifted
        // by no more than the buffer's target moved; a backlog (what was captured during the pause, sent after it)
        // would sit the pause's 3 s earlier in the signal.
        let silenceEnd = silenceEndWindow * 2_205
        let silenceStart = silenceEnd - longest * 2_205
        func offset(near sample: Int) -> Int? {
            stride(from: 0, to: 8_820, by: 256).lazy.compactMap { exactOffset(of: sa, at: sample + $0, in: signal) }.first
        }
        if let before = offset(near: silenceStart - 22_050), let after = offset(near: silenceEnd + 22_050) {
            print("pause: the signal's offset moved \(after - before) samples across the pause")
            #expect(abs(after - before) < 22_050, "the signal's offset moved \(after - before) samples across the pause")
        } else {
            Issue.record("A's audio around the pause is not the host's signal, sample for sample")
        }
        // The pause is neither loss nor concealment, and no backlog is played.
        let final = a.jsonObjects.last { $0["final"] as? Bool == true } ?? [:]
        #expect((final["pausedMs"] as? Double ?? 0) >= 2700, "\(final)")
        #expect(a.stderr.filter { $0.contains("joined ctl-host") }.count == 1, "joined once, never lost: \(a.stderr)")
        #expect((final["lossPercent"] as? Double ?? 1) < 0.5 && (final["concealedMs"] as? Double ?? 999) < 60, "\(final)")
        // And the player's own buffer is back at its target after the resume (the live edge is checked above: a hold
        // resets the buffer, which drops a burst down to its target, so a backlog would not show here). The target
        // itself may move: one late burst from a loaded machine raises it by ~10 ms, before or after the pause, and
        // the burst's packets sit above the target until the excess has lasted 2 s. So each of the last three status
        // lines (a second apart) is within 50 ms of the highest target of the three lines up to it, and at least one
        // of them within 6 ms.
        let lines = a.jsonObjects.compactMap { o -> (buffer: Double, target: Double)? in
            guard let b = o["bufferMs"] as? Double, let t = o["targetMs"] as? Double else { return nil }
            return (b, t)
        }
        if lines.count >= 6 {
            let last = (lines.count - 3)..<lines.count
            func excess(_ i: Int) -> Double { lines[i].buffer - lines[(i - 2)...i].map(\.target).max()! }
            #expect(last.allSatisfy { excess($0) <= 50 }, "buffer/target \(lines)")
            #expect(last.contains { excess($0) <= 6 }, "buffer/target \(lines)")
        } else {
            Issue.record("\(a.jsonObjects.count) status lines")
        }
        // B never stopped.
        let wb = Self.windows(try readWAV(outB).samples)
        guard let startB = wb.firstIndex(where: { $0 > 0.05 }) else { Issue.record("B played nothing"); return }
        // Unaffected by A's pause: no silence anywhere near A's (≥ 50 windows), never paused, the tone nearly
        // throughout. (A loaded machine may cost B a concealed late burst of a window or two, which is not a pause.)
        let playedB = wb[startB..<(wb.count - 2)]
        let silentB = Self.longestSilence(wb) ?? 0
        let finalB = b.jsonObjects.last { $0["final"] as? Bool == true } ?? [:]
        #expect(silentB < 10, "B's longest silence: \(silentB) windows of 50 ms")
        #expect(Double(playedB.filter { $0 > 0.05 }.count) >= 0.95 * Double(playedB.count), "B was unaffected: \(finalB)")
        #expect((finalB["pausedMs"] as? Double ?? 0) == 0, "B never paused: \(finalB)")
        // The host saw it: A paused in its status, then playing.
        #expect(host.jsonObjects.contains { ($0["players"] as? [[String: Any]])?.contains { $0["paused"] as? Bool == true } == true })
    }

    @Test("capture writes the pre-roll's tone and what follows; the player prints saved; a read-only directory answers failed")
    func capture() throws {
        let paired = try PairedStates(hostName: "ctl-host")
        let clips = Rig.tempPath("clips-\(UUID().uuidString.prefix(6))")
        try FileManager.default.createDirectory(atPath: clips, withIntermediateDirectories: true)
        let (host, port) = try Self.host(paired, ["--clips", clips, "--clip-preroll", "2", "--clip-length", "1"])
        defer { host.kill() }
        let out = Rig.tempPath("capture-\(UUID().uuidString.prefix(6)).wav")
        let (p, stdin) = try Self.player(paired, port: port, seconds: 6, out: out)
        #expect(eventually(10) { p.stderr.contains { $0.contains("joined ctl-host") } })
        Thread.sleep(forTimeInterval: 2.5)
        Self.say("capture", to: stdin)
        #expect(eventually(5) { p.stderr.contains { $0.hasSuffix("capture single: recording") } }, "\(p.stderr)")
        #expect(eventually(10) { p.stderr.contains { $0.contains("clip saved ") } }, "\(p.stderr)")
        let line = p.stderr.first { $0.contains("clip saved ") } ?? ""
        let name = String(line[line.range(of: "clip saved ")!.upperBound...])
        #expect(name.hasPrefix("ctl-host-") && name.hasSuffix(".wav"))
        let (samples, format) = try readWAV(clips + "/" + name)
        #expect(format == .default)
        #expect(samples.count == 3 * 44_100, "2 s of pre-roll and 1 s after: \(samples.count)")
        var crossings = 0
        for i in 1..<samples.count where (samples[i - 1] < 0) != (samples[i] < 0) { crossings += 1 }
        #expect(abs(crossings - 3 * 880) <= 12, "a 440 Hz tone throughout: \(crossings) sign changes")
        #expect(p.waitForExit(seconds: 20) == 0, "\(p.stderr)")
        #expect(host.stderr.contains { $0.contains("clip saved: \(name)") })

        // A directory that cannot be written: the answer is failed, with the reason; the host serves on.
        let readOnly = try ReadOnlyDirectory(clips)
        defer { readOnly.undo() }
        let (p2, stdin2) = try Self.player(paired, port: port, seconds: 3, out: out)
        #expect(eventually(10) { p2.stderr.contains { $0.contains("joined ctl-host") } })
        Thread.sleep(forTimeInterval: 1)  // the host says what it offers a moment after the join
        Self.say("capture", to: stdin2)
        #expect(eventually(5) { p2.stderr.contains { $0.contains("capture single: failed: cannot write ctl-host-") } }, "\(p2.stderr)")
        #expect(p2.waitForExit(seconds: 20) == 0, "\(p2.stderr)")
        #expect(host.isRunning)
    }

    @Test("headset buttons through a FIFO of synthesized input events: volume keys, play/pause, a long press captures")
    func buttons() throws {
        let paired = try PairedStates(hostName: "ctl-host")
        let clips = Rig.tempPath("button-clips-\(UUID().uuidString.prefix(6))")
        try FileManager.default.createDirectory(atPath: clips, withIntermediateDirectories: true)
        let (host, port) = try Self.host(paired, ["--clips", clips, "--clip-preroll", "1", "--clip-length", "0.5"])
        defer { host.kill() }
        let fifo = Rig.tempPath("buttons-\(UUID().uuidString.prefix(6))")
        #expect(mkfifo(fifo, 0o600) == 0)
        let p = try CLIProcess("mesh-play", paired.playerArgs() + ["--connect", "127.0.0.1:\(port)", "--output", Rig.tempPath("buttons.wav"),
                                                                  "--duration", "8", "--buttons", fifo])
        #expect(eventually(10) { p.stderr.contains { $0.contains("joined ctl-host") } }, "\(p.stderr)")
        guard let events = FileHandle(forWritingAtPath: fifo) else { Issue.record("cannot open the FIFO"); return }
        func key(_ t: Double, _ code: UInt16, _ value: Int32) -> Data {
            Data(ButtonDecoder.event(seconds: Int64(t), microseconds: Int64(((t - t.rounded(.down)) * 1e6).rounded()),
                                     code: code, value: value))
        }
        events.write(key(1, 114, 1) + key(1.1, 114, 0) + key(1.5, 114, 1) + key(1.6, 114, 0)) // volume down twice
        #expect(eventually(5) { p.stderr.contains { $0.hasSuffix("volume -6 dB") } }, "\(p.stderr)")
        events.write(key(2, 164, 1) + key(2.1, 164, 0))                                        // play/pause: pause
        #expect(eventually(5) { p.stderr.contains { $0.hasSuffix("pause: ok") } }, "\(p.stderr)")
        #expect(eventually(5) { p.stderr.contains { $0.contains("paused (the host holds") } })
        events.write(key(3, 164, 1) + key(3.1, 164, 0))                                        // and resume
        #expect(eventually(5) { p.stderr.contains { $0.hasSuffix("resume: ok") } }, "\(p.stderr)")
        events.write(key(4, 164, 1) + key(4.5, 164, 2) + key(5.2, 164, 0))                     // long press: capture
        #expect(eventually(5) { p.stderr.contains { $0.hasSuffix("capture single: recording") } }, "\(p.stderr)")
        #expect(eventually(10) { p.stderr.contains { $0.contains("clip saved ctl-host-") } }, "\(p.stderr)")
        events.closeFile()
        #expect(p.waitForExit(seconds: 20) == 0, "\(p.stderr)")
        // A device that does not exist: a clear line, exit 1.
        let missing = try CLIProcess("mesh-play", paired.playerArgs() + ["--connect", "127.0.0.1:\(port)", "--buttons", "/dev/input/event-none"])
        #expect(missing.waitForExit(seconds: 10) == 1)
        #expect(missing.stderr.contains { $0.contains("--buttons /dev/input/event-none: cannot open: no such file or directory") }, "\(missing.stderr)")
    }

    @Test("talk on then talk off at once: both answered ok, and the microphone stays off (a late 'ok' to talk on does not turn it back on)")
    func talkOnThenOffAtOnce() throws {
        let paired = try PairedStates(hostName: "ctl-host")
        let talkOut = Rig.tempPath("talk-quick-\(UUID().uuidString.prefix(6)).wav")
        let (host, port) = try Self.host(paired, ["--talk-output", talkOut])
        defer { host.kill() }
        let out = Rig.tempPath("talk-quick-player-\(UUID().uuidString.prefix(6)).wav")
        let (p, stdin) = try Self.player(paired, port: port, seconds: 4, out: out, ["--talk-input", "tone:880"])
        #expect(eventually(10) { p.stderr.contains { $0.contains("joined ctl-host") } }, "\(p.stderr)")
        Thread.sleep(forTimeInterval: 1)
        // One write: the off is sent before the host's answer to the on can arrive.
        try? stdin.write(contentsOf: Data("talk on\ntalk off\n".utf8))
        #expect(eventually(5) { p.stderr.contains { $0.hasSuffix("talk on: ok") } && p.stderr.contains { $0.hasSuffix("talk off: ok") } },
                "\(p.stderr)")
        // A status line written after both answers, to count from.
        let seen = p.jsonObjects.count
        #expect(eventually(5) { p.jsonObjects.count >= seen + 2 })
        let sentAfterAnswers = p.jsonObjects.last?["talkPacketsSent"] as? Int
        #expect(p.waitForExit(seconds: 20) == 0, "\(p.stderr)")
        let last = p.jsonObjects.last
        #expect((last?["talking"] as? Bool) == false, "talk is off at the end: \(String(describing: last))")
        if let sentAfterAnswers, let final = last?["talkPacketsSent"] as? Int {
            #expect(final == sentAfterAnswers, "no talk packets after both answers (\(sentAfterAnswers) → \(final))")
        }
    }

    @Test("talk on with --talk-input tone:880 for 2 s: the host's --talk-output holds about 2 s of 880 Hz; the talker hears silence meanwhile (half duplex); a second talker gets busy")
    func talkback() throws {
        let paired = try PairedStates(players: 2, hostName: "ctl-host")
        let talkOut = Rig.tempPath("talk-\(UUID().uuidString.prefix(6)).wav")
        let (host, port) = try Self.host(paired, ["--talk-output", talkOut])
        defer { host.kill() }
        func player(_ i: Int, _ hz: Int) throws -> (CLIProcess, FileHandle, String) {
            let out = Rig.tempPath("talk-player\(i)-\(UUID().uuidString.prefix(6)).wav")
            let (p, stdin) = try Self.player(paired, i, port: port, seconds: 7, out: out, ["--talk-input", "tone:\(hz)"])
            return (p, stdin, out)
        }
        let (a, inA, outA) = try player(0, 880)
        let (b, inB, outB) = try player(1, 660)
        #expect(eventually(10) { a.stderr.contains { $0.contains("joined ctl-host") } && b.stderr.contains { $0.contains("joined ctl-host") } })
        Thread.sleep(forTimeInterval: 1.5)
        Self.say("talk on", to: inA)
        #expect(eventually(5) { a.stderr.contains { $0.hasSuffix("talk on: ok") } }, "\(a.stderr)")
        let talkStarted = Date()
        Self.say("talk on", to: inB)
        #expect(eventually(5) { b.stderr.contains { $0.hasSuffix("talk on: busy") } }, "\(b.stderr)")
        Thread.sleep(forTimeInterval: max(0, 2 - Date().timeIntervalSince(talkStarted)))
        Self.say("talk off", to: inA)
        #expect(eventually(5) { a.stderr.contains { $0.hasSuffix("talk off: ok") } }, "\(a.stderr)")
        #expect(a.waitForExit(seconds: 20) == 0, "\(a.stderr)")
        #expect(b.waitForExit(seconds: 20) == 0, "\(b.stderr)")
        #expect(host.stderr.contains { $0.contains("player player-0 talks") } && host.stderr.contains { $0.contains("player-0 stopped talking") },
                "\(host.stderr)")
        Thread.sleep(forTimeInterval: 0.3)

        // The host's talk output: about 2 s of 880 Hz (not B's 660 Hz), silence around it.
        let talk = try readWAV(talkOut).samples
        let size = 2_205
        var active = 0, crossings = 0
        for start in stride(from: 0, to: talk.count - size, by: size) {
            let w = talk[start..<(start + size)]
            guard (w.reduce(0) { $0 + $1 * $1 } / Float(size)).squareRoot() > 0.05 else { continue }
            active += 1
            for i in (start + 1)..<(start + size) where (talk[i - 1] < 0) != (talk[i] < 0) { crossings += 1 }
        }
        #expect(abs(active - 40) <= 8, "\(active) windows of 50 ms hold the talk (2 s is 40)")
        if active > 0 {
            let perWindow = Double(crossings) / Double(active)
            #expect(abs(perWindow - 88) <= 6, "\(perWindow) sign changes per 50 ms: 880 Hz is 88, 660 Hz would be 66")
        }
        // Half duplex: A heard silence while it talked; B heard the host throughout.
        let longest = Self.longestSilence(Self.windows(try readWAV(outA).samples)) ?? 0
        #expect(longest >= 30 && longest <= 50, "A's silence while talking: \(longest) windows")
        let wb = Self.windows(try readWAV(outB).samples)
        guard let s0 = wb.firstIndex(where: { $0 > 0.05 }) else { Issue.record("B played nothing"); return }
        #expect(wb[s0..<(wb.count - 2)].allSatisfy { $0 > 0.05 }, "B heard the host throughout")
    }
}
