import Testing
import Foundation
import MeshAudio
import MeshImpair
import MeshPipeline
import PeerMesh
@testable import MeshCLI

@Suite("Command-line parsing")
struct OptionsTests {
    @Test("mesh-record defaults and flags")
    func record() throws {
        guard case .run(let d) = try RecordOptions.parse(["--host"]) else { Issue.record("no config"); return }
        #expect(d.action == .host && d.service == "mesh-audio" && d.rate == 44_100 && d.channels == 1 && d.period == 128)
        #expect(d.accept == .paired, "paired only, by default")
        #expect(!d.pair && d.pairTimeout == 30 && d.state == StateDirectory.default && d.maxPerAddress == 4)
        #expect(d.codec == .float32, "lossless Float32 unless asked")
        guard case .run(let c) = try RecordOptions.parse(["--host", "--codec", "s16"]) else { Issue.record("no config"); return }
        #expect(c.codec == .int16)
        guard case .run(let op) = try RecordOptions.parse(["--host", "--codec", "opus"]),
              case .run(let ob) = try RecordOptions.parse(["--host", "--codec", "opus", "--bitrate", "48", "--channels", "2"])
        else { Issue.record("no config"); return }
        #expect(op.codec == .opus && op.opusBitrate == 96_000, "96 kbit/s unless asked")
        #expect(ob.opusBitrate == 48_000 && ob.channels == 2)
        guard case .run(let o) = try RecordOptions.parse(["--host", "--name", "den", "--input", "tone:440", "--port", "7000",
                                                         "--max-peers", "8", "--accept", "ask", "--json", "--quiet", "--pair",
                                                         "--pair-timeout", "12", "--state-dir", "/tmp/s", "--bind", "::1"])
        else { Issue.record("no config"); return }
        #expect(o.name == "den" && o.input == .tone(440) && o.port == 7000 && o.maxPeers == 8 && o.accept == .ask && o.json && o.quiet)
        #expect(o.pair && o.pairTimeout == 12 && o.state.path == "/tmp/s" && o.bind == "::1")
        guard case .run(let l) = try RecordOptions.parse(["--paired"]), case .run(let f) = try RecordOptions.parse(["--forget", "kitchen"])
        else { Issue.record("no config"); return }
        #expect(l.action == .listPaired && f.action == .forget("kitchen"))
        guard case .help = try RecordOptions.parse(["--help"]) else { Issue.record("help"); return }
        guard case .version = try RecordOptions.parse(["--version"]) else { Issue.record("version"); return }
    }

    @Test("--input takes device:, tone:, file: or a sound file; anything else is a usage error")
    func inputs() throws {
        #expect(try AudioInput.parse("device:plug:hw:0") == .device("plug:hw:0"))
        #expect(try AudioInput.parse("tone:440") == .tone(440))
        #expect(try AudioInput.parse("file:/tmp/x") == .file("/tmp/x"))
        for f in ["take1.WAV", "a.flac", "b.Ogg"] { #expect(try AudioInput.parse(f) == .file(f)) }
        for bad in ["mic", "take.mp3", "tone:", "tone:0", "tone:-3", "device:", "file:"] {
            #expect(throws: UsageError.self, "\(bad)") { try AudioInput.parse(bad) }
        }
    }

    @Test("mesh-record refuses bad flags with a message", arguments: [
        ["--host", "--bogus"], [], ["--host", "--rate", "abc"], ["--host", "--port", "0"], ["--host", "--accept", "maybe"],
        ["--host", "--codec", "mp3"], ["--host", "--codec"],
        ["--host", "--bitrate", "64"], ["--host", "--codec", "opus", "--bitrate", "5"], ["--host", "--codec", "opus", "--bitrate", "600"],
        ["--host", "--codec", "opus", "--channels", "3"],
        ["--host", "--input", "tone:-5"], ["--host", "--input", "tone:30000"], ["--host", "--service", "Bad_Type"],
        ["--host", "--name"], ["--host", "--channels", "9"], ["--host", "--input", "mic"], ["--host", "--paired"],
        ["--paired", "--forget", "x"], ["--host", "--bind", "kitchen"], ["--host", "--device", "x", "--input", "tone:440"],
    ])
    func recordBad(args: [String]) {
        #expect(throws: UsageError.self) { try RecordOptions.parse(args) }
    }

    @Test("A flag that takes no value refuses one, in every tool: --quiet=no is not --quiet")
    func flagsWithoutValuesRefuseOne() {
        for args in [["--host", "--quiet=no"], ["--host", "--pair=1234-5678"], ["--host=kitchen"], ["--paired=no"],
                     ["--host", "--json=false"]] {
            #expect(throws: UsageError("\(args.last!.split(separator: "=")[0]) takes no value"), "mesh-record \(args)") {
                try RecordOptions.parse(args)
            }
        }
        for args in [["--find", "--quiet=no"], ["--find=kitchen"], ["--list=yes"], ["--find", "--no-beep=false"]] {
            #expect(throws: UsageError.self, "mesh-play \(args)") { try PlayOptions.parse(args) }
        }
        // A flag that takes a value still takes it either way.
        guard case .run(let o) = try? RecordOptions.parse(["--host", "--name=kitchen", "--rate", "48000"]) else {
            Issue.record("--name=kitchen refused"); return
        }
        #expect(o.name == "kitchen" && o.rate == 48_000)
    }

    @Test("An empty or root --state-dir or --runtime-dir (an unset variable, say) is refused: it would take over /")
    func stateAndRuntimeDirectoriesOfTheirOwn() {
        for dir in ["", "/", "//"] {
            #expect(throws: UsageError.self) { try RecordOptions.parse(["--host", "--state-dir", dir]) }
            #expect(throws: UsageError.self) { try RecordOptions.parse(["--host", "--runtime-dir", dir]) }
            #expect(throws: UsageError.self) { try RecordOptions.parse(["ctl", "status", "--runtime-dir", dir]) }
            #expect(throws: UsageError.self) { try PlayOptions.parse(["--find", "--state-dir", dir]) }
            #expect(throws: UsageError.self) { try ChatOptions.parse(["--name", "a", "--state-dir", dir]) }
        }
        #expect(throws: Never.self) { try RecordOptions.parse(["--host", "--state-dir", "/var/lib/peermesh"]) }
        #expect(throws: UsageError.self, "ctl has no --json: its status carries the JSON already") {
            try RecordOptions.parse(["ctl", "status", "--json"])
        }
    }

    @Test("peermesh-probe: --offer-for is the host's, --offer the joiner's, each with two files")
    func probeOfferFlags() throws {
        guard case .run(let h) = try ProbeOptions.parse(["host", "--offer-for", "g.json", "o.json"]),
              case .run(let j) = try ProbeOptions.parse(["join", "--offer", "g.json", "o.json"])
        else { Issue.record("no config"); return }
        #expect(h.offer == ProbeOptions.OfferFiles(peerFile: "g.json", dataFile: "o.json") && h.mode == .host)
        #expect(j.offer == h.offer && j.mode == .join)
        for bad in [["host", "--offer", "a", "b"], ["join", "--offer-for", "a", "b"], ["join", "--offer", "a"]] {
            #expect(throws: UsageError.self, "\(bad)") { try ProbeOptions.parse(bad) }
        }
    }

    @Test("The Nyquist message names half the rate")
    func nyquist() {
        do { _ = try RecordOptions.parse(["--host", "--input", "tone:30000"]) } catch {
            #expect(error.description.contains("22050 Hz"), "\(error)")
        }
    }

    @Test("mesh-play defaults and flags")
    func play() throws {
        guard case .run(let d) = try PlayOptions.parse(["--find"]) else { Issue.record("no config"); return }
        #expect(d.action == .play && d.latency == .auto && d.output == .device("default") && d.hostName == nil && d.duration == nil)
        #expect(d.name == nil, "without --name the saved identity keeps its name (a new one takes the host name)")
        guard case .run(let o) = try PlayOptions.parse(["--find", "--host", "kitchen", "--output", "x.wav", "--latency", "low",
                                                       "--duration", "2.5", "--json"])
        else { Issue.record("no config"); return }
        #expect(o.hostName == "kitchen" && o.output == .file("x.wav", .pcm16) && o.latency == .low && o.duration == 2.5 && o.json)
        guard case .run(let c) = try PlayOptions.parse(["--connect", "127.0.0.1:7000", "--latency", "20"]) else { Issue.record("no config"); return }
        #expect(c.connect == PeerEndpoint(host: "127.0.0.1", port: 7000) && c.latency == .fixed(milliseconds: 20))
        guard case .run(let n) = try PlayOptions.parse(["--connect", "kitchen.local:7000"]),
              case .run(let v6) = try PlayOptions.parse(["--connect", "[::1]:7000"]) else { Issue.record("no config"); return }
        #expect(n.connect == PeerEndpoint(host: "kitchen.local", port: 7000) && v6.connect == PeerEndpoint(host: "::1", port: 7000))
        guard case .run(let p) = try PlayOptions.parse(["--pair", "4821-0937", "--host", "kitchen"]) else { Issue.record("no config"); return }
        #expect(p.action == .pair(code: "4821-0937", fingerprint: nil) && p.hostName == "kitchen")
        guard case .run(let u) = try PlayOptions.parse(["--pair", "peermesh://pair?code=48210937&fp=abcd-efgh"]) else { Issue.record("no config"); return }
        #expect(u.action == .pair(code: "48210937", fingerprint: "abcd-efgh"))
        guard case .run(let pc) = try PlayOptions.parse(["--pair", "4821 0937", "--connect", "127.0.0.1:1"]) else { Issue.record("no config"); return }
        #expect(pc.action == .pair(code: "4821 0937", fingerprint: nil) && pc.connect != nil)
    }

    @Test("mesh-play --output: the extension chooses the encoding; .wav is 16-bit unless --sample-format says otherwise")
    func outputEncodings() throws {
        let cases: [([String], PlayOptions.Output)] = [
            (["--output", "a.wav"], .file("a.wav", .pcm16)),
            (["--output", "A.WAV", "--sample-format", "s24"], .file("A.WAV", .pcm24)),
            (["--sample-format", "f32", "--output", "a.wav"], .file("a.wav", .float32)),
            (["--output", "a.flac"], .file("a.flac", .flac)),
            (["--output", "a.ogg"], .file("a.ogg", .oggVorbis)),
        ]
        for (args, expected) in cases {
            guard case .run(let o) = try PlayOptions.parse(["--find"] + args) else { Issue.record("no config for \(args)"); continue }
            #expect(o.output == expected, "\(args)")
        }
    }

    @Test("mesh-play refuses bad flags with a message", arguments: [
        ["--find", "--bogus"], [], ["--connect", "nohost"], ["--find", "--latency", "fast"], ["--find", "--duration", "-1"],
        ["--find", "--device", "hw:0", "--output", "a.wav"], ["--list", "--connect", "127.0.0.1:1"],
        ["--find", "--connect", "127.0.0.1:1"], ["--pair", "123"], ["--pair", "1234-5678", "--find"], ["--paired", "--list"],
        ["--pair", "peermesh://pair?fp=x"], ["--find", "--output", "x.mp3"], ["--find", "--output", "noextension"],
        ["--find", "--output", "x.flac", "--sample-format", "s16"], ["--find", "--sample-format", "s24"],
        ["--find", "--output", "x.wav", "--sample-format", "u8"],
    ])
    func playBad(args: [String]) {
        #expect(throws: UsageError.self) { try PlayOptions.parse(args) }
    }

    @Test("mesh-impair: flags, percentages; bad flags are usage errors (exit 2)")
    func parser() throws {
        let ok = try ImpairOptions.parse([
            "--listen", "127.0.0.1:7000", "--target=127.0.0.1:7001", "--loss", "5%", "--duplicate", "0.01",
            "--reorder", "2.5%", "--delay-ms", "5", "--jitter-ms", "1.5", "--seed", "9", "--direction", "to-target", "--json",
        ])
        guard case .run(let o) = ok else { Issue.record("not a run: \(ok)"); return }
        let c = o.configuration
        #expect(o.json)
        #expect(c.listen == .init(host: "127.0.0.1", port: 7000) && c.target == .init(host: "127.0.0.1", port: 7001))
        #expect(abs(c.loss - 0.05) < 1e-12 && abs(c.reorder - 0.025) < 1e-12 && c.duplicate == 0.01)
        #expect(c.delayMilliseconds == 5 && c.jitterMilliseconds == 1.5 && c.seed == 9 && c.direction == .toTarget)
        #expect(try ImpairOptions.parse(["--help"]) == .help)
        #expect(try ImpairOptions.parse(["--version"]) == .version)
        let bad: [[String]] = [
            [], ["--target"], ["--target", "127.0.0.1"], ["--target", "127.0.0.1:7001", "--loss", "5"],
            ["--target", "127.0.0.1:7001", "--loss", "-1%"], ["--target", "127.0.0.1:7001", "--direction", "up"],
            ["--target", "127.0.0.1:7001", "--bogus"], ["--target", "127.0.0.1:7001", "--seed", "x"],
            ["--target", "8.8.8.8:1"], ["--target", "127.0.0.1:7001", "--listen", "8.8.8.8:1"],
        ]
        for args in bad {
            #expect(throws: UsageError.self, "\(args)") { try ImpairOptions.parse(args) }
        }
    }

    /// Before, fanout kept the text and turned it into a Double later: "nan" passed, and the jitter buffer trapped.
    @Test("mesh-bench fanout --latency takes what mesh-play --latency takes; nan, inf, -1 and 2001 are usage errors")
    func benchFanoutLatency() throws {
        let base = ["fanout", "--connect", "127.0.0.1:7000", "--players", "2"]
        for (text, mode) in [("auto", JitterBuffer.Mode.auto), ("low", .low), ("40", .fixed(milliseconds: 40))] {
            guard case .run(let b) = try BenchOptions.parse(base + ["--latency", text]),
                  case .run(let p) = try PlayOptions.parse(["--find", "--latency", text])
            else { Issue.record("no config for \(text)"); continue }
            #expect(b.latency == mode && p.latency == mode, "\(text)")
        }
        guard case .run(let d) = try BenchOptions.parse(base) else { Issue.record("no config"); return }
        #expect(d.latency == .auto)
        for text in ["nan", "inf", "-1", "2001", "fast", ""] {
            #expect(throws: UsageError.self, "\(text)") { try BenchOptions.parse(base + ["--latency", text]) }
            #expect(throws: UsageError.self, "\(text)") { try PlayOptions.parse(["--find", "--latency", text]) }
        }
    }

    @Test("mesh-bench resource, resource-receiver and meshjoin: required flags, ranges; bad flags are usage errors")
    func benchResourceAndMeshJoin() throws {
        guard case .run(let r) = try BenchOptions.parse(["resource", "--connect", "127.0.0.1:7000", "--file", "/tmp/f", "--rounds", "2"]),
              case .run(let rx) = try BenchOptions.parse(["resource-receiver", "--dir", "/tmp/d", "--port", "7000"]),
              case .run(let m) = try BenchOptions.parse(["meshjoin", "--members", "8", "--runs", "3"]),
              case .run(let md) = try BenchOptions.parse(["meshjoin"])
        else { Issue.record("no config"); return }
        #expect(r.mode == .resource && r.connect == .init(host: "127.0.0.1", port: 7000) && r.file == "/tmp/f" && r.rounds == 2)
        #expect(rx.mode == .resourceReceiver && rx.directory == "/tmp/d" && rx.port == 7000)
        #expect(m.mode == .meshjoin && m.members == 8 && m.runs == 3)
        #expect(md.members == 3 && md.runs == 5)
        let bad: [[String]] = [
            ["resource"], ["resource", "--file", "/tmp/f"], ["resource", "--connect", "127.0.0.1:7000"],
            ["resource-receiver"], ["meshjoin", "--members", "1"], ["meshjoin", "--members", "9"], ["meshjoin", "--runs", "0"],
            ["meshjoin", "--bogus"],
        ]
        for args in bad {
            #expect(throws: UsageError.self, "\(args)") { try BenchOptions.parse(args) }
        }
    }
}

@Suite struct OutputFileNameTests {
    @Test("A numbered output name is taken by anything there, a link that leads nowhere included")
    func takenNames() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("pm-taken-\(getpid())").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        #expect(!OutputFiles.isTaken(dir + "/take-2.wav"))
        #expect(symlink(dir + "/nowhere", dir + "/take-2.wav") == 0)
        #expect(OutputFiles.isTaken(dir + "/take-2.wav"), "a dangling link (which fileExists calls absent) takes the name")
        #expect(OutputFiles.isTaken(dir))
    }

    @Test("Further output files are numbered before the extension")
    func numbered() {
        #expect(OutputFiles.numbered("take.wav", 2) == "take-2.wav")
        #expect(OutputFiles.numbered("/tmp/a.b/take.flac", 3) == "/tmp/a.b/take-3.flac")
        #expect(OutputFiles.numbered("/tmp/a.b/take", 2) == "/tmp/a.b/take-2")
        #expect(OutputFiles.numbered(".hidden", 2) == ".hidden-2")
    }
}
