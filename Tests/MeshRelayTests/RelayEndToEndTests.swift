import Foundation
import MeshAudio
import MeshCLI
import Synchronization
import MeshTestSupport
import PeerMesh
import Testing
@testable import MeshRelay

/// The relay end to end on one host: real Avahi on lo, real ALSA through the JACK rig, real UDP.
@Suite("Relay end to end (CLIs, real Avahi, ALSA and UDP)", .serialized, .avahiDaemonShared,
       .enabled(if: Rig.jack && Rig.avahi, "needs scripts/test's JACK and Avahi rigs"))
struct RelayEndToEndTests {
    /// Compares what the player played with the signal the host captured: 0 lost, no resampling (one clock, so the
    /// drift loop holds the ratio at exactly 1.0), and every 256-sample window of the audio is the reference's
    /// samples bit for bit at some offset. The offset may step where the buffer stretched, skipped or concealed
    /// (a scheduling stall on a busy machine); it may step only a few times, and at least 90 % of the windows must
    /// match exactly.
    func assertCarries(_ reference: [Float], received: [Float], final: [String: Any], label: String) {
        #expect((final["lostPackets"] as? Int) == 0, "\(label): packets lost on loopback")
        #expect((final["resampling"] as? Bool) == false, "\(label): the resampler engaged on one clock")
        let window = 256
        let first = (received.firstIndex { $0 != 0 } ?? received.count) + 4_410   // past the fade-in
        let last = (received.lastIndex { $0 != 0 } ?? 0) - 4_410                  // before the stop or the signal's end
        var offset: Int?
        var windows = 0, exact = 0, steps = 0, longest = 0, run = 0
        var at = first
        while at + window <= last {
            windows += 1
            let probe = received[at..<(at + window)]
            var found: Int?
            if let o = offset, at + o >= 0, at + o + window <= reference.count, reference[(at + o)..<(at + o + window)].elementsEqual(probe) {
                found = o
            } else {
                found = exactOffset(of: received, at: at, in: reference, window: window)
                if found != nil, offset != nil { steps += 1 }
            }
            if let f = found {
                exact += 1
                run += window
                longest = max(longest, run)
                offset = f
            } else {
                run = 0
            }
            at += window
        }
        let fraction = windows == 0 ? 0 : Double(exact) / Double(windows)
        print("\(label): \(exact)/\(windows) windows bit-exact (\(String(format: "%.1f", fraction * 100)) %), offset steps \(steps), longest exact run \(String(format: "%.2f", Double(longest) / 44_100)) s; stretched \(final["stretchedFrames"] ?? "?"), skipped \(final["skippedFrames"] ?? "?"), underruns \(final["underruns"] ?? "?")")
        #expect(windows > 44_100 / window, "\(label): at least a second of audio")
        #expect(fraction >= 0.9, "\(label): the signal is carried bit-exact")
        // Each adaptation (a skip or stretch after a late burst) moves the alignment once. On this rig a run now and
        // then sees one or two scheduling stalls of ~20 ms somewhere between JACK's capture and its playback (seen 3
        // times in 10 runs right after the pairing suite: 8 underruns, then a skip; MESH_DEBUG_E2E=1 prints the
        // timeline), each costing a few steps. What must hold is below: bit-exact windows and one long exact run.
        #expect(steps <= 8, "\(label): the alignment steps only at a few adaptations")
        #expect(longest >= 44_100, "\(label): at least one second in one piece")
    }

    @Test("A known signal captured through ALSA by mesh-record comes out of mesh-play's ALSA output exactly")
    func knownSignalThroughALSA() throws {
        // Both ends on the JACK clock: the host captures the known signal from pm_knowncap, the player plays into
        // pm_loop_play, and a Recorder here captures pm_loop_cap, which JACK wires to it sample for sample.
        // (pm_loop_cap must be open before pm_loop_play connects to it.)
        // A period the machine lost on the way (an xrun in the player's output or the loop's capture) breaks the
        // exactness this test is about: such a run is repeated.
        let (received, final, code, player) = try undisturbed("ALSA → ALSA") {
            let loop = try Recorder(device: "pm_loop_cap", periodFrames: 128)
            try loop.start()
            let captured = SampleCollector(loop)
            let service = Rig.uniqueService()
            let paired = try PairedStates(hostName: "alsa-host")
            let host = try CLIProcess("mesh-record", paired.hostArgs + ["--host", "--name", "alsa-host", "--service", service, "--device", "pm_knowncap"])
            let player = try CLIProcess("mesh-play", paired.playerArgs() + ["--find", "--service", service, "--device", "pm_loop_play", "--duration", "8",
                                                     "--json", "--latency", "20"])
            let code = player.waitForExit(seconds: 20)
            host.kill()
            let received = captured.stop()
            let final = player.jsonObjects.last { $0["final"] as? Bool == true }
            if ProcessInfo.processInfo.environment["MESH_DEBUG_E2E"] != nil {
                for o in player.jsonObjects { print("e2e json: underruns \(o["underruns"] ?? "?") skipped \(o["skippedFrames"] ?? "?") late \(o["late"] ?? "?") buffer \(o["bufferMs"] ?? "?") target \(o["targetMs"] ?? "?") state \(o["state"] ?? "?")") }
                print("e2e host: \(host.stderr.suffix(5))")
            }
            let xruns = (player: final?["xruns"] as? Int ?? 0, loop: loop.stats.xruns)
            return ((received, final, code, player),
                    xruns.player == 0 && xruns.loop == 0 ? nil : "xruns: player \(xruns.player), loop capture \(xruns.loop)")
        }
        #expect(code == 0, "mesh-play: \(player.stderr)")
        let last = try #require(final)
        let known = try readRaw(Rig.jackDir + "/known.raw")
        assertCarries(known, received: received, final: last, label: "ALSA → ALSA")
        #expect(player.stderr.contains { $0.contains("joined alsa-host") })
        #expect((last["xruns"] as? Int) == 0)
    }

    @Test("--input FILE.wav on the host, --output FILE.wav on the player")
    func wavToWav() throws {
        let (signal, input) = try signalWAV("input.wav", seconds: 3)
        let service = Rig.uniqueService()
        let paired = try PairedStates()
        let out = Rig.tempPath("wav-\(service).wav")
        let host = try CLIProcess("mesh-record", paired.hostArgs + ["--host", "--name", "wav-host", "--service", service, "--input", input])
        let player = try CLIProcess("mesh-play", paired.playerArgs() + ["--find", "--service", service, "--output", out,
                                                    "--sample-format", "f32", "--duration", "6", "--json",
                                                    // A fixed target: this test is about carrying every sample, not
                                                    // about the adaptive buffer (tested on its own, in virtual time).
                                                    "--latency", "20"])
        let code = player.waitForExit(seconds: 20)
        host.kill()
        #expect(code == 0, "mesh-play: \(player.stderr)")
        let final = try #require(player.jsonObjects.last { $0["final"] as? Bool == true })
        // The host loops the file: the reference is the signal twice over.
        assertCarries(signal + signal + signal, received: try readWAV(out).samples, final: final, label: "WAV → WAV")
    }

    /// mesh-record `--codec CODEC --input INPUT` → mesh-play `--output` a Float32 WAV for `seconds`, with a fixed
    /// 20 ms target (these tests are about the wire format, not the adaptive buffer). Checks that mesh-play exited 0;
    /// returns both processes, the player's final status, the WAV's path, and which of the two had libopus mapped
    /// while audio flowed (each loads it when it makes its first encoder or decoder).
    func relayWithCodec(_ codec: String, input: String, seconds: Int) throws
        -> (host: CLIProcess, player: CLIProcess, final: [String: Any], out: String, mapsLibopus: (host: Bool, player: Bool)) {
        let service = Rig.uniqueService()
        let paired = try PairedStates()
        let out = Rig.tempPath("\(codec)-\(service).wav")
        let host = try CLIProcess("mesh-record", paired.hostArgs + ["--host", "--name", "\(codec)-host", "--service", service,
                                                                    "--input", input, "--codec", codec, "--json"])
        let player = try CLIProcess("mesh-play", paired.playerArgs() + ["--find", "--service", service, "--output", out,
                                                    "--sample-format", "f32", "--duration", String(seconds), "--json",
                                                    "--latency", "20"])
        func mapsLibopus(_ process: CLIProcess) -> Bool {
            ((try? String(contentsOfFile: "/proc/\(process.pid)/maps", encoding: .utf8)) ?? "").contains("libopus")
        }
        var mapped = (host: false, player: false)
        if eventually(10, { (player.jsonObjects.last?["receivedFrames"] as? Int ?? 0) > 4_410 }) {
            mapped = (mapsLibopus(host), mapsLibopus(player))
        } else {
            Issue.record("no audio reached the player within 10 s: \(player.stderr)")
        }
        let code = player.waitForExit(seconds: 20)
        host.kill(SIGINT)
        _ = host.waitForExit(seconds: 5)
        #expect(code == 0, "mesh-play: \(player.stderr)")
        let final = try #require(player.jsonObjects.last { $0["final"] as? Bool == true })
        return (host, player, final, out, mapped)
    }

    @Test("--codec opus: a 44.1 kHz tone travels as 48 kHz Opus of about 30 bytes a 2.5 ms packet and plays at 44.1 kHz, clean and without loss")
    func opusCodec() throws {
        let (host, player, final, out, mapped) = try relayWithCodec("opus", input: "tone:440", seconds: 4)
        // The player maps it anyway, through libsndfile (its --output); the host's tone needs no sound file.
        #expect(mapped.host, "the host loaded libopus for its encoder")
        #expect(final["codec"] as? String == "opus")
        #expect(host.jsonObjects.last?["codec"] as? String == "opus")
        #expect(host.stderr.contains { $0.contains("codec opus 96 kbit/s") })
        #expect((final["lostPackets"] as? Int) == 0)
        #expect((final["malformed"] as? Int) == 0)
        #expect((final["stalePackets"] as? Int) == 0, "nothing reordered on loopback")
        let bytes = try #require(final["audioBytes"] as? Int), received = try #require(final["datagrams"] as? Int)
        #expect(received > 1_000, "400 packets a second")
        let perPacket = Double(bytes) / Double(received)
        #expect(perPacket > 36 + 20 && perPacket < 36 + 40, "audioBytes \(bytes), datagrams \(received)")
        // The player decoded the 48 kHz stream back to 44.1 kHz; past the start, every 100 ms window is a clean tone.
        let (played, format) = try readWAV(out)
        #expect(format.sampleRate == 44_100)
        #expect(!player.stderr.contains { $0.contains("reopening playback") }, "no format change: the pipeline stays at 44.1 kHz")
        let first = (played.firstIndex { $0 != 0 } ?? played.count) + 8_820
        var snrs: [Double] = []
        var at = first
        while at + 4_410 <= played.count - 8_820 {
            snrs.append(toneSNR(Array(played[at..<(at + 4_410)]), hertz: 440, rate: 44_100))
            at += 4_410
        }
        #expect(snrs.count >= 20)
        let sorted = snrs.sorted()
        print("opus: \(bytes) audio bytes for \(received) packets; SNR median \(sorted[sorted.count / 2]) dB, worst \(sorted.first ?? 0) dB")
        #expect(sorted[sorted.count / 2] > 28, "median SNR")
        #expect(Double(snrs.filter { $0 > 20 }.count) >= 0.9 * Double(snrs.count))
    }

    @Test("--codec f32 from a tone: the host never loads libopus")
    func aPCMHostLoadsNoLibopus() throws {
        let (_, _, final, _, mapped) = try relayWithCodec("f32", input: "tone:440", seconds: 2)
        #expect(final["codec"] as? String == "f32")
        #expect(!mapped.host, "a PCM host with no sound file maps no libopus")
    }

    @Test("--codec s16: half the bytes on the wire, and every sample within 1.5 LSB of 16 bits of the host's")
    func int16Codec() throws {
        let (signal, input) = try signalWAV("input-s16.wav", seconds: 3)
        let (host, _, final, out, _) = try relayWithCodec("s16", input: input, seconds: 5)
        #expect(final["codec"] as? String == "s16")
        #expect(host.jsonObjects.last?["codec"] as? String == "s16")
        #expect(host.stderr.contains { $0.contains("codec s16") })
        // 128-frame periods: 36 header bytes + 2 × 128 sample bytes a packet (548 for f32); the file's last period
        // before it loops is shorter. Every datagram the session delivered is one audio packet (a few may still wait
        // in the ring at the end, so the count of packets played is not the divisor).
        let bytes = try #require(final["audioBytes"] as? Int), received = try #require(final["datagrams"] as? Int)
        #expect(received > 1_000)
        let perPacket = Double(bytes) / Double(received)
        #expect(perPacket > 288 && perPacket <= 292, "audioBytes \(bytes), datagrams \(received)")
        #expect((final["lostPackets"] as? Int) == 0)
        // Every 256-sample window of what played matches the signal, within 1.5 LSB, at some offset.
        let played = try readWAV(out).samples
        let reference = signal + signal + signal
        let tolerance: Float = 1.5 / 32768
        let window = 256
        let first = (played.firstIndex { $0 != 0 } ?? played.count) + 4_410, last = (played.lastIndex { $0 != 0 } ?? 0) - 4_410
        var windows = 0, matched = 0, offset: Int?
        var at = first
        func matches(_ o: Int) -> Bool {
            guard at + o >= 0, at + o + window <= reference.count else { return false }
            for i in 0..<window where abs(reference[at + o + i] - played[at + i]) > tolerance { return false }
            return true
        }
        while at + window <= last {
            windows += 1
            if let o = offset, matches(o) { matched += 1 } else if let o = (-at..<(reference.count - at)).first(where: matches) {
                matched += 1
                offset = o
            }
            at += window
        }
        print("s16: \(matched)/\(windows) windows within 1.5 LSB; \(bytes) audio bytes for \(received) packets")
        #expect(windows > 44_100 / window)
        #expect(Double(matched) >= 0.9 * Double(windows))
    }

    @Test("kill -9 of the host: the player is notConnected within the timeout and rejoins it, restarted under another name (by the name it was paired under)")
    func hostKilledAndReplaced() throws {
        let service = Rig.uniqueService()
        let paired = try PairedStates(hostName: "first")
        let out = Rig.tempPath("kill-\(service).wav")
        var host = try CLIProcess("mesh-record", paired.hostArgs + ["--host", "--name", "first", "--service", service, "--input", "tone:440"])
        let player = try CLIProcess("mesh-play", paired.playerArgs() + ["--find", "--service", service, "--output", out, "--duration", "15"])
        #expect(eventually(10) { player.stderr.contains { $0.contains("joined first") } }, "\(player.stderr)")
        let killedAt = Date()
        host.kill(SIGKILL)
        #expect(eventually(4) { player.timeOfLine(containing: "went away") != nil }, "\(player.stderr)")
        if let seen = player.timeOfLine(containing: "went away") {
            let ms = seen.timeIntervalSince(killedAt) * 1000
            print("host killed → player notConnected after \(Int(ms)) ms")
            #expect(ms <= 2_500)
        }
        let restartAt = Date()
        let before = player.stderr.count
        host = try CLIProcess("mesh-record", paired.hostArgs + ["--host", "--name", "second", "--service", service, "--input", "tone:440"])
        #expect(eventually(8) { player.stderr.dropFirst(before).contains { $0.contains("joined first") } }, "\(player.stderr)")
        #expect(!player.stderr.contains { $0.contains("joined second") }, "a paired host cannot rename itself in the player's lines")
        if let joined = player.timeOfLine(containing: "joined first", after: before) {
            print("new host started → player rejoined after \(Int(joined.timeIntervalSince(restartAt) * 1000)) ms")
        }
        player.kill()
        host.kill()
    }

    /// A host that comes back in another format gets a new file: numbered, made only where nothing is (a link that
    /// leads nowhere, planted at the next name, is neither followed nor replaced), and like every recording, 0600.
    @Test("A host back at 48 kHz: the player writes OUT-3.wav (OUT-2.wav is a planted link, left alone), both files 0600")
    func formatChangeWritesANewPrivateFile() throws {
        let service = Rig.uniqueService()
        let paired = try PairedStates(hostName: "fmt-host")
        let dir = Rig.tempPath("fmt-\(service)")
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let out = dir + "/out.wav", planted = dir + "/planted-target.wav"
        #expect(symlink(planted, dir + "/out-2.wav") == 0)
        var host = try CLIProcess("mesh-record", paired.hostArgs + ["--host", "--name", "fmt-host", "--service", service, "--input", "tone:440"])
        let player = try CLIProcess("mesh-play", paired.playerArgs() + ["--find", "--service", service, "--output", out, "--duration", "15"])
        #expect(eventually(10) { player.stderr.contains { $0.contains("joined fmt-host") } }, "\(player.stderr)")
        usleep(500_000)
        host.kill(SIGKILL)
        #expect(eventually(4) { player.timeOfLine(containing: "went away") != nil }, "\(player.stderr)")
        host = try CLIProcess("mesh-record", paired.hostArgs + ["--host", "--name", "fmt-host", "--service", service, "--input", "tone:440",
                                                 "--rate", "48000"])
        #expect(eventually(10) { player.stderr.contains { $0.contains("to \(dir)/out-3.wav (the host changed format") } }, "\(player.stderr)")
        usleep(1_000_000)
        player.signal(SIGINT)
        _ = player.waitForExit(seconds: 10)
        host.kill()
        var info = stat()
        #expect(lstat(dir + "/out-2.wav", &info) == 0 && (info.st_mode & S_IFMT) == S_IFLNK, "the planted link is still a link")
        #expect(access(planted, F_OK) != 0, "nothing was written through the link")
        for file in [out, dir + "/out-3.wav"] {
            #expect(stat(file, &info) == 0 && info.st_mode & 0o777 == 0o600, "\(file) is \(String(info.st_mode & 0o777, radix: 8))")
        }
        let second = try SoundFiles.read(path: dir + "/out-3.wav")
        #expect(second.format.sampleRate == 48_000 && !second.samples.isEmpty)
    }

    @Test("A garbage datagram flood at the host's port does not stop the stream")
    func garbageFlood() throws {
        let service = Rig.uniqueService()
        let paired = try PairedStates(hostName: "flood-host")
        let port = freePort()
        let out = Rig.tempPath("flood-\(service).wav")
        let host = try CLIProcess("mesh-record", paired.hostArgs + ["--host", "--name", "flood-host", "--service", service, "--input", "tone:440",
                                                 "--port", String(port)])
        let player = try CLIProcess("mesh-play", paired.playerArgs() + ["--connect", "127.0.0.1:\(port)", "--output", out, "--duration", "4", "--json"])
        #expect(eventually(10) { player.stderr.contains { $0.contains("joined flood-host") } }, "\(player.stderr)")
        // Two seconds of junk at the host's UDP port, bounded in count.
        let fd = socket(AF_INET, Int32(SOCK_DGRAM.rawValue), 0)
        defer { close(fd) }
        var to = sockaddr_in()
        to.sin_family = sa_family_t(AF_INET)
        to.sin_port = port.bigEndian
        to.sin_addr.s_addr = inet_addr("127.0.0.1")
        var junk = [UInt8](repeating: 0, count: 600)
        let until = Date().addingTimeInterval(2)
        var sent = 0
        while Date() < until, sent < 200_000 {
            for i in 0..<junk.count { junk[i] = UInt8.random(in: 0...255) }
            junk[0] = 0x50; junk[1] = 0x4d; junk[2] = peerMeshProtocolVersion; junk[3] = 1 // looks like PeerMesh data, with a bogus token
            _ = withUnsafePointer(to: &to) { p in
                p.withMemoryRebound(to: sockaddr.self, capacity: 1) { sendto(fd, junk, junk.count, 0, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            sent += 1
            if sent % 100 == 0 { usleep(1_000) }
        }
        #expect(player.waitForExit(seconds: 15) == 0, "\(player.stderr)")
        host.kill()
        let final = try #require(player.jsonObjects.last { $0["final"] as? Bool == true })
        #expect((final["lostPackets"] as? Int) == 0)
        #expect((final["state"] as? String) == "joined flood-host")
        let played = (final["playedFrames"] as? Int) ?? 0
        #expect(played > 3 * 44_100, "played \(played) frames")
        print("garbage flood: \(sent) junk datagrams; player lost \(final["lostPackets"] ?? "?") packets")
    }
}

@Suite("Relay command lines: bad input")
struct RelayBadInputTests {
    @Test("--accept ask takes each answer from standard input: no declines for good, yes admits once")
    func acceptAsk() throws {
        let paired = try PairedStates(players: 0, hostName: "ask-host")
        try paired.addPlayer(1, name: "first")
        try paired.addPlayer(2, name: "second")
        // Neither player is in the host's trust store: the host asks about each.
        try FileManager.default.removeItem(atPath: paired.hostDirectory + "/paired.json")
        let port = freePort()
        let answers = Pipe()
        let host = try CLIProcess("mesh-record", paired.hostArgs + ["--host", "--name", "ask-host", "--input", "tone:440",
                                  "--port", String(port), "--accept", "ask", "--service", Rig.uniqueService()],
                                  stdin: answers.fileHandleForReading)
        defer { host.kill() }
        Thread.sleep(forTimeInterval: 0.5)
        let first = try CLIProcess("mesh-play", paired.playerArgs(1) + ["--connect", "127.0.0.1:\(port)", "--output", Rig.tempPath("ask1.wav")])
        #expect(eventually(5) { host.stderr.contains { $0.contains("player \"first\"") && $0.contains("Allow?") } }, "\(host.stderr)")
        try? answers.fileHandleForWriting.write(contentsOf: Data("n\n".utf8))
        #expect(first.waitForExit(seconds: 10) == 1, "a declined player does not retry")
        #expect(first.stderr.contains { $0.contains("declined") }, "\(first.stderr)")
        let second = try CLIProcess("mesh-play", paired.playerArgs(2) + ["--connect", "127.0.0.1:\(port)", "--output", Rig.tempPath("ask2.wav")])
        defer { second.kill() }
        #expect(eventually(5) { host.stderr.contains { $0.contains("player \"second\"") } }, "\(host.stderr)")
        try? answers.fileHandleForWriting.write(contentsOf: Data("y\n".utf8))
        #expect(eventually(8) { second.stderr.contains { $0.contains("joined ask-host") } }, "\(second.stderr)")
        #expect(host.stderr.contains { $0.contains("declined first") })
        #expect(host.stderr.contains { $0.contains("accepted second once") })
        #expect(try paired.hostTrust.list().isEmpty, "\"y\" does not pair")
    }

    @Test("Unknown flags print usage and exit 2", arguments: [("mesh-record", ["--host", "--frobnicate"]),
                                                               ("mesh-play", ["--find", "--frobnicate"]),
                                                               ("mesh-record", []), ("mesh-play", ["--latency", "fast", "--find"])])
    func badFlags(tool: String, args: [String]) throws {
        let p = try CLIProcess(tool, args)
        #expect(p.waitForExit(seconds: 10) == 2)
        #expect(p.stderr.contains { $0.contains("usage:") })
    }

    @Test("--help and --version exit 0")
    func helpAndVersion() throws {
        for tool in ["mesh-record", "mesh-play"] {
            let h = try CLIProcess(tool, ["--help"])
            #expect(h.waitForExit(seconds: 10) == 0)
            #expect(h.stdout.first?.hasPrefix("usage: \(tool)") == true)
            let v = try CLIProcess(tool, ["--version"])
            #expect(v.waitForExit(seconds: 10) == 0)
            #expect(v.stdout.first == "\(tool) \(meshVersion)")
        }
    }

    @Test("A missing device gives one clear error and exit 1", .enabled(if: Rig.jack, "needs the ALSA rig config"))
    func missingDevice() throws {
        let paired = try PairedStates()
        let r = try CLIProcess("mesh-record", paired.hostArgs + ["--host", "--device", "pm_no_such_device", "--service", Rig.uniqueService()])
        #expect(r.waitForExit(seconds: 10) == 1)
        #expect(r.stderr.contains { $0.contains("pm_no_such_device") && $0.contains("arecord -L") }, "\(r.stderr)")
        let p = try CLIProcess("mesh-play", paired.playerArgs() + ["--connect", "127.0.0.1:9", "--device", "pm_no_such_device"])
        #expect(p.waitForExit(seconds: 10) == 1)
        #expect(p.stderr.contains { $0.contains("pm_no_such_device") && $0.contains("aplay -L") }, "\(p.stderr)")
        // alsa-lib's own words come inside ours, never as its raw "ALSA lib pcm.c:…" lines before them.
        for tool in [r, p] {
            #expect(!tool.stderr.contains { $0.hasPrefix("ALSA lib") }, "\(tool.stderr)")
            #expect(tool.stderr.contains { $0.contains("alsa-lib: Unknown PCM pm_no_such_device") }, "\(tool.stderr)")
        }
    }

    @Test("--connect to a closed port: a clear error after bounded retries")
    func connectClosedPort() throws {
        let out = Rig.tempPath("closed.wav")
        let paired = try PairedStates()
        let start = Date()
        let p = try CLIProcess("mesh-play", paired.playerArgs() + ["--connect", "127.0.0.1:9", "--output", out])
        let code = p.waitForExit(seconds: 20)
        let elapsed = Date().timeIntervalSince(start)
        #expect(code == 1)
        #expect(p.stderr.contains { $0.contains("cannot join 127.0.0.1:9") && $0.contains("Connection refused") && $0.contains("5 attempts") },
                "\(p.stderr)")
        #expect(elapsed < 10, "retries are bounded (took \(elapsed) s)")
    }
}

/// A deterministic PRNG for test signals.
typealias SplitMix = SeededRandom

/// Reads everything a source captures, on its own thread, until `stop()`.
final class SampleCollector: @unchecked Sendable { // samples are guarded by the lock
    private let lock = NSLock()
    private var samples: [Float] = []
    private let running = Mutex(true)
    private let done = DispatchSemaphore(value: 0)
    private let source: any AudioSource

    init(_ source: any AudioSource) {
        self.source = source
        Thread.detachNewThread { [self] in
            var buf = [Float](repeating: 0, count: source.periodFrames * source.format.channels)
            while running.withLock({ $0 }) {
                guard let info = buf.withUnsafeMutableBufferPointer({ source.read(into: $0, timeoutNanos: 100_000_000) }) else { continue }
                lock.lock()
                samples.append(contentsOf: buf[0..<(info.frames * source.format.channels)])
                lock.unlock()
            }
            done.signal()
        }
    }

    /// Stops the source and returns what it captured.
    func stop() -> [Float] {
        running.withLock { $0 = false }
        done.wait()
        source.stop()
        lock.lock()
        defer { lock.unlock() }
        return samples
    }
}

/// Renders a fixed array once, then silence.
final class ArrayRenderer: AudioRenderer, @unchecked Sendable { // position is only touched by the sink's one thread
    let samples: [Float]
    var position = 0
    init(_ s: [Float]) { samples = s }
    func render(into buffer: UnsafeMutableBufferPointer<Float>, context: RenderContext) {
        for i in 0..<context.frames {
            buffer[i] = position < samples.count ? samples[position] : 0
            position += 1
        }
    }
}

/// `seconds` of a deterministic, non-repeating signal (uniform in ±0.5, steps of 1/20 000), written to a Float32 WAV
/// file in the tests' directory: (samples, path).
func signalWAV(_ name: String, seconds: Int) throws -> ([Float], String) {
    var rng = SplitMix(seed: 7)
    let signal = (0..<(seconds * 44_100)).map { _ in Float(Int(rng.next() % 20_001) - 10_000) / 20_000 }
    let input = Rig.tempPath(name)
    let sink = try WAVFileSink(path: input, format: .default, periodFrames: 1024, realtime: false, maxFrames: signal.count)
    try sink.start(renderer: ArrayRenderer(signal))
    #expect(sink.waitUntilFinished(timeoutNanos: 5_000_000_000))
    sink.stop()
    return (signal, input)
}
