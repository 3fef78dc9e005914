import Foundation
import Testing
import MeshTestSupport

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

    @Test("mesh-record and mesh-play say once that their device thread runs without real-time priority, and why, and the audio plays")
    func refusedPriorityIsReported() throws {
        let paired = try PairedStates()
        let port = freePort()
        let host = try Self.unprivileged("mesh-record", paired.hostArgs + ["--host", "--name", "rtprio", "--device", "pm_cap",
                                                                          "--port", String(port), "--bind", "127.0.0.1"])
        defer { host.kill() }
        try #require(eventually(10) { host.stderr.contains { $0.contains("on port \(port)") } }, "\(host.stderr)")
        let player = try Self.unprivileged("mesh-play", paired.playerArgs() + ["--connect", "127.0.0.1:\(port)", "--device", "pm_play",
                                                                             "--json"])
        defer { player.kill() }
        let playing = eventually(15) { (player.jsonObjects.last?["receivedFrames"] as? Int ?? 0) > 44_100 / 2 }
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
        let paired = try PairedStates()
        let port = freePort()
        let host = try ChildProcess(product: "mesh-record", paired.hostArgs + ["--host", "--name", "rtprio", "--device", "pm_cap",
                                                                              "--port", String(port), "--bind", "127.0.0.1"])
        defer { host.kill() }
        try #require(eventually(10) { host.stderr.contains { $0.contains("on port \(port)") } }, "\(host.stderr)")
        let player = try ChildProcess(product: "mesh-play", paired.playerArgs() + ["--connect", "127.0.0.1:\(port)", "--device", "pm_play",
                                                                                 "--json"])
        defer { player.kill() }
        #expect(eventually(15) { (player.jsonObjects.last?["receivedFrames"] as? Int ?? 0) > 44_100 / 2 }, "\(player.stderr)")
        #expect(!(host.stderr + player.stderr).contains { $0.contains("without real-time priority") })
    }
}
