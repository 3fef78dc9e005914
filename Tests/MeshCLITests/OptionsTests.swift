import Testing
import MeshImpair
import PeerMesh
@testable import MeshCLI

@Suite("Command-line parsing")
struct OptionsTests {
    @Test("mesh-record defaults and flags")
    func record() throws {
        guard case .run(let d) = try RecordOptions.parse(["--host"]) else { Issue.record("no config"); return }
        #expect(d.service == "mesh-audio" && d.rate == 44_100 && d.channels == 1 && d.period == 128 && d.acceptAll)
        guard case .run(let o) = try RecordOptions.parse(["--host", "--name", "den", "--input", "tone:440", "--port", "7000",
                                                         "--max-peers", "8", "--accept", "ask", "--json", "--quiet"])
        else { Issue.record("no config"); return }
        #expect(o.name == "den" && o.input == .tone(440) && o.port == 7000 && o.maxPeers == 8 && !o.acceptAll && o.json && o.quiet)
        guard case .help = try RecordOptions.parse(["--help"]) else { Issue.record("help"); return }
        guard case .version = try RecordOptions.parse(["--version"]) else { Issue.record("version"); return }
    }

    @Test("mesh-record refuses bad flags with a message", arguments: [
        ["--host", "--bogus"], [], ["--host", "--rate", "abc"], ["--host", "--port", "0"], ["--host", "--accept", "maybe"],
        ["--host", "--input", "tone:-5"], ["--host", "--input", "tone:30000"], ["--host", "--service", "Bad_Type"],
        ["--host", "--name"], ["--host", "--channels", "9"],
    ])
    func recordBad(args: [String]) {
        #expect(throws: UsageError.self) { try RecordOptions.parse(args) }
    }

    @Test("mesh-play defaults and flags")
    func play() throws {
        guard case .run(let d) = try PlayOptions.parse(["--find"]) else { Issue.record("no config"); return }
        #expect(d.latency == .auto && d.output == .device("default") && d.hostName == nil && d.duration == nil)
        guard case .run(let o) = try PlayOptions.parse(["--find", "--host", "kitchen", "--output", "x.wav", "--latency", "low",
                                                       "--duration", "2.5", "--json"])
        else { Issue.record("no config"); return }
        #expect(o.hostName == "kitchen" && o.output == .file("x.wav") && o.latency == .low && o.duration == 2.5 && o.json)
        guard case .run(let c) = try PlayOptions.parse(["--connect", "127.0.0.1:7000", "--latency", "20"]) else { Issue.record("no config"); return }
        #expect(c.connect == PeerEndpoint(host: "127.0.0.1", port: 7000) && c.latency == .fixed(milliseconds: 20))
    }

    @Test("mesh-play refuses bad flags with a message", arguments: [
        ["--find", "--bogus"], [], ["--connect", "nohost"], ["--find", "--latency", "fast"], ["--find", "--duration", "-1"],
        ["--find", "--device", "hw:0", "--output", "a.wav"], ["--list", "--connect", "127.0.0.1:1"],
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
}
