import Foundation
import Testing
import MeshTestSupport
import PeerMesh

/// A user whose account may not use real-time scheduling (no `rtprio` limit, no `CAP_SYS_NICE`: most desktop
/// accounts out of the box) still gets audio, and is told why it may break up and what to do. Before, the device
/// threads fell back to normal scheduling without a word.
@Suite("Device threads refused real-time priority", .serialized,
       .enabled(if: Rig.jack, "needs scripts/test's ALSA rig config"),
       .enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv"), "needs setpriv (util-linux)"))
struct RealtimePriorityTests {
    /// `product` with `arguments`, in a process that may not use `SCHED_FIFO`: without `CAP_SYS_NICE` (dropped from
    /// the bounding set, so not even root gets it back at exec) and with an `rtprio` limit of 0.
    static func unprivileged(_ product: String, _ arguments: [String]) throws -> ChildProcess {
        try ChildProcess(URL(fileURLWithPath: "/usr/bin/setpriv"),
                         ["--bounding-set", "-sys_nice", "--inh-caps", "-sys_nice", "/usr/bin/prlimit", "--rtprio=0",
                          builtProduct(product).path] + arguments)
    }

    /// A paired host on `pm_cap` and a player on `pm_play`, each started by `launch` (product, arguments), once the
    /// player has played half a second (or tried for 15 s): whether it played, and both processes (killed by the
    /// caller).
    static func relay(_ launch: (String, [String]) throws -> ChildProcess) throws -> (played: Bool, host: ChildProcess, player: ChildProcess) {
        let paired = try PairedStates()
        let port = freePort()
        let host = try launch("mesh-record", paired.hostArgs + ["--host", "--name", "rtprio", "--device", "pm_cap",
                                                               "--port", String(port), "--bind", "127.0.0.1"])
        guard eventually(10, { host.stderr.contains { $0.contains("on port \(port)") } }) else {
            host.kill()
            throw PeerMeshError.transport("mesh-record did not serve: \(host.stderr)")
        }
        let player = try launch("mesh-play", paired.playerArgs() + ["--connect", "127.0.0.1:\(port)", "--device", "pm_play", "--json"])
        let played = eventually(15) { (player.jsonObjects.last?["receivedFrames"] as? Int ?? 0) > 44_100 / 2 }
        return (played, host, player)
    }

    @Test("mesh-record and mesh-play say once that their device thread runs without real-time priority, and why, and the audio plays")
    func refusedPriorityIsReported() throws {
        let (playing, host, player) = try Self.relay(Self.unprivileged)
        defer { host.kill(); player.kill() }
        #expect(playing, "the relay plays without real-time priority: \(player.stderr) \(host.stderr)")
        func notes(_ process: ChildProcess, _ thread: String) -> [String] {
            process.stderr.filter { $0.contains("\(thread) runs without real-time priority (SCHED_FIFO: Operation not permitted)") }
        }
        #expect(notes(host, "pm-capture").count == 1, "\(host.stderr)")
        #expect(notes(player, "pm-playback").count == 1, "\(player.stderr)")
        #expect(notes(player, "pm-playback").first?.contains("rtprio") == true, "it says what to do")
    }

    @Test("With real-time priority allowed (root's CAP_SYS_NICE), nothing is said", .enabled(if: geteuid() == 0, "needs root"))
    func grantedPriorityIsQuiet() throws {
        let (playing, host, player) = try Self.relay { product, arguments in try ChildProcess(product: product, arguments) }
        defer { host.kill(); player.kill() }
        #expect(playing, "\(player.stderr)")
        #expect(!(host.stderr + player.stderr).contains { $0.contains("without real-time priority") })
    }
}
