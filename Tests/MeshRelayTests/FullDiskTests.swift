import Foundation
import MeshTestSupport
import Testing

/// `mesh-play --output` on a filesystem that fills up: the player must not go on "playing" into a file that no longer
/// grows. A tmpfs of 64 KiB, mounted in a private mount namespace (`unshare -m`) so that nobody else sees it and it
/// goes away with the player, holds under a second of audio.
@Suite("mesh-play --output on a disk that fills up", .serialized,
       .enabled(if: getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/unshare"),
                "needs root and unshare(1) to mount a small tmpfs in a private mount namespace"))
struct FullDiskTests {
    @Test("The player stops when a write fails, names the error, and exits 1; the host serves on")
    func playerExitsWhenItsDiskIsFull() throws {
        let paired = try PairedStates()
        let port = freePort()
        let host = try ChildProcess(product: "mesh-record", paired.hostArgs + ["--host", "--name", "full", "--input", "tone:440",
                                                                           "--port", String(port), "--bind", "127.0.0.1"])
        defer { host.kill() }
        try #require(eventually(10) { host.stderr.contains { $0.contains("on port \(port)") } }, "\(host.stderr)")
        let mountPoint = Rig.tempPath("full-\(port)")
        try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: mountPoint) }
        // sh mounts the tmpfs inside the new namespace, then becomes mesh-play.
        let script = #"mount -t tmpfs -o size=64k pmfull "$1" && shift && exec "$@""#
        let player = try ChildProcess(URL(fileURLWithPath: "/usr/bin/unshare"),
                                      ["-m", "--propagation", "private", "/bin/sh", "-c", script, "sh", mountPoint,
                                       builtProduct("mesh-play").path]
                                          + paired.playerArgs() + ["--connect", "127.0.0.1:\(port)", "--output",
                                                                   mountPoint + "/out.wav"])
        defer { player.kill() }
        #expect(player.waitForExit(seconds: 20) == 1, "\(player.stderr)")
        #expect(player.stderr.contains { $0.contains("joined") }, "it played first: \(player.stderr)")
        #expect(player.stderr.contains { $0.contains("playback ended: \(mountPoint)/out.wav: cannot write: no space left on device") },
                "\(player.stderr)")
        #expect(host.isRunning, "one player's full disk is not the host's problem: \(host.stderr)")
        #expect(!FileManager.default.fileExists(atPath: mountPoint + "/out.wav"), "the tmpfs stayed in the player's namespace")
    }
}
