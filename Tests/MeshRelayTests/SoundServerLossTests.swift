import Foundation
import MeshTestSupport
import Testing

/// The sound server under both tools dies (a killed `jackd`, as when JACK or PipeWire crashes or restarts): its
/// devices then neither move nor fail. Before the device watchdog both tools went on forever, serving and playing
/// nothing, and a Ctrl-C hung in the device's last wait.
@Suite("A sound server that dies under mesh-record and mesh-play", .serialized,
       .enabled(if: Rig.jack, "needs scripts/test's ALSA rig config"))
struct SoundServerLossTests {
    /// A JACK dummy server of this test's own, which the test may kill: the shared rig's server stays untouched.
    final class PrivateJackServer {
        let name = "pmloss\(getpid())x\(UInt16.random(in: 0...UInt16.max))"
        let process: ChildProcess

        init() throws {
            process = try ChildProcess(URL(fileURLWithPath: "/usr/bin/jackd"),
                                       ["-n", name, "-d", "dummy", "-r", "44100", "-p", "128", "-C", "2", "-P", "2"],
                                       environment: ["JACK_NO_AUDIO_RESERVATION": "1"], discardOutput: true)
            let ready = eventually(10) {
                guard let probe = try? ChildProcess(URL(fileURLWithPath: "/usr/bin/jack_lsp"), [], environment: environment,
                                                    discardOutput: true) else { return false }
                return probe.waitForExit(seconds: 5) == 0
            }
            try #require(ready, "jackd \(name) did not come up")
        }

        /// What a client of this server needs in its environment.
        var environment: [String: String] { ["JACK_DEFAULT_SERVER": name, "JACK_NO_START_SERVER": "1"] }

        /// Kills the server the way a crash ends it (no goodbye to its clients), then frees the slot it leaves in
        /// JACK's machine-wide registry of eight (the rig's own reclaim rule: only slots whose PID is gone).
        func crash() {
            process.stop()
            let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
                .deletingLastPathComponent()
            let reclaim = try? ChildProcess(URL(fileURLWithPath: "/usr/bin/python3"),
                                            [root.appendingPathComponent("scripts/lib/jack_registry.py").path, "reclaim"],
                                            discardOutput: true)
            reclaim?.waitForExit(seconds: 10)
        }
    }

    /// A paired host capturing from the private server's `pm_cap` and a player playing into its `pm_play`, joined
    /// directly and playing.
    struct Relay {
        let server: PrivateJackServer
        let host: ChildProcess
        let player: ChildProcess

        init() throws {
            let server = try PrivateJackServer()
            let paired = try PairedStates()
            let port = freePort()
            let host = try ChildProcess(product: "mesh-record", paired.hostArgs + ["--host", "--name", "loss", "--device", "pm_cap",
                                                                               "--port", String(port), "--bind", "127.0.0.1"],
                                        environment: server.environment)
            try #require(eventually(10) { host.stderr.contains { $0.contains("on port \(port)") } }, "\(host.stderr)")
            let player = try ChildProcess(product: "mesh-play", paired.playerArgs() + ["--connect", "127.0.0.1:\(port)", "--device", "pm_play",
                                                                                   "--json"],
                                          environment: server.environment)
            let playing = eventually(15) { (player.jsonObjects.last?["receivedFrames"] as? Int ?? 0) > 44_100 / 2 }
            try #require(playing, "the relay never played: \(player.stderr) \(host.stderr)")
            (self.server, self.host, self.player) = (server, host, player)
        }

        /// Waits up to `seconds` for each tool to end: their exit statuses (nil: still running), and how long it took.
        func exits(within seconds: Double) -> (host: Int32?, player: Int32?, took: TimeInterval) {
            let started = Date()
            let codes = (host.waitForExit(seconds: seconds), player.waitForExit(seconds: seconds))
            return (codes.0, codes.1, Date().timeIntervalSince(started))
        }
    }

    @Test("Both tools notice within seconds, say what to do, and exit 1 (a service is restarted)")
    func bothNoticeAndExit() throws {
        let relay = try Relay()
        relay.server.crash()
        let ended = relay.exits(within: 15)
        #expect(ended.host == 1, "mesh-record: \(relay.host.stderr)")
        #expect(ended.player == 1, "mesh-play: \(relay.player.stderr)")
        #expect(ended.took < 12, "both ended \(ended.took) s after the crash")
        #expect(relay.host.stderr.contains { $0.contains("capture ended: ALSA device 'pm_cap' stopped moving") && $0.contains("no audio for")
                && $0.contains("sound server") }, "\(relay.host.stderr)")
        #expect(relay.player.stderr.contains { $0.contains("playback ended: ALSA device 'pm_play' stopped moving") && $0.contains("no audio for")
                && $0.contains("sound server") }, "\(relay.player.stderr)")
    }

    @Test("Ctrl-C while the device is stalled ends each tool at once, as on a live device")
    func interruptWhileStalled() throws {
        let relay = try Relay()
        relay.server.crash()
        // Both devices are stalled now, and neither tool has noticed yet (that takes 4 s).
        usleep(500_000)
        relay.player.signal(SIGINT)
        relay.host.signal(SIGINT)
        let ended = relay.exits(within: 10)
        #expect(ended.player == 0, "mesh-play played before the crash, so its run did its job: \(relay.player.stderr)")
        #expect(ended.host == 0, "mesh-record: \(relay.host.stderr)")
        #expect(ended.took < 3, "both ended \(ended.took) s after SIGINT")
    }
}
