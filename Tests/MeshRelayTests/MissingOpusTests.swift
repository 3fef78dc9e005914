import Foundation
import MeshTestSupport
import Testing

/// The file libopus.so.0 resolves to, as the loader's cache names it (`ldconfig -p`); nil: not installed.
private let libopusFile: String? = {
    let ldconfig = Process(), out = Pipe()
    ldconfig.executableURL = URL(fileURLWithPath: "/sbin/ldconfig")
    ldconfig.arguments = ["-p"]
    ldconfig.standardOutput = out
    guard (try? ldconfig.run()) != nil else { return nil }
    let listing = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    ldconfig.waitUntilExit()
    // "	libopus.so.0 (libc6,x86-64) => /lib/x86_64-linux-gnu/libopus.so.0"
    guard let line = listing.split(separator: "\n").first(where: { $0.trimmingCharacters(in: .whitespaces).hasPrefix("libopus.so.0 ") }),
          let arrow = line.range(of: "=> ") else { return nil }
    return URL(fileURLWithPath: String(line[arrow.upperBound...])).resolvingSymlinksInPath().path
}()

/// libopus is loaded when the first Opus encoder or decoder is made, not at start. These tests run the CLIs where it is
/// missing: in a private mount namespace (`unshare -m`) in which /dev/null is bound over the library's file, so that
/// `dlopen` fails for them alone. The players play to the rig's `pm_play`: a sound file would need libsndfile, which
/// links libopus (for Ogg Opus files).
@Suite("The CLIs without libopus", .serialized,
       .enabled(if: getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/unshare")
                    && libopusFile != nil && Rig.jack,
                "needs root, unshare(1) and libopus0 to hide it in a private mount namespace, and the ALSA rig"))
struct MissingOpusTests {
    /// `product args…`, run where libopus cannot be loaded.
    func withoutLibopus(_ product: String, _ args: [String]) throws -> ChildProcess {
        let script = #"mount --bind /dev/null "$1" && shift && exec "$@""#
        return try ChildProcess(URL(fileURLWithPath: "/usr/bin/unshare"),
                                ["-m", "--propagation", "private", "/bin/sh", "-c", script, "sh", libopusFile!,
                                 builtProduct(product).path] + args)
    }

    /// A host on 127.0.0.1 sending `codec` (without libopus itself for PCM), and its port.
    func host(_ paired: PairedStates, codec: String) throws -> (ChildProcess, UInt16) {
        let port = freePort()
        let args = paired.hostArgs + ["--host", "--name", "no-opus", "--input", "tone:440", "--codec", codec,
                                      "--port", String(port), "--bind", "127.0.0.1"]
        let host = codec == "opus" ? try ChildProcess(product: "mesh-record", args) : try withoutLibopus("mesh-record", args)
        try #require(eventually(10) { host.stderr.contains { $0.contains("on port \(port)") } }, "\(host.stderr)")
        return (host, port)
    }

    @Test("Without libopus a PCM host serves and a player plays it; the player leaves an Opus host at once, saying what to install")
    func playerWithoutLibopus() throws {
        let paired = try PairedStates()
        let (pcmHost, pcmPort) = try host(paired, codec: "f32")
        defer { pcmHost.kill() }
        let pcm = try withoutLibopus("mesh-play", paired.playerArgs() + ["--connect", "127.0.0.1:\(pcmPort)", "--device", "pm_play",
                                                                         "--duration", "2"])
        defer { pcm.kill() }
        #expect(pcm.waitForExit(seconds: 20) == 0, "it received audio (else it exits 1): \(pcm.stderr)")

        let (opusHost, opusPort) = try host(paired, codec: "opus")
        defer { opusHost.kill() }
        let started = Date()
        let opus = try withoutLibopus("mesh-play", paired.playerArgs() + ["--connect", "127.0.0.1:\(opusPort)", "--device", "pm_play",
                                                                          "--duration", "30"])
        defer { opus.kill() }
        #expect(opus.waitForExit(seconds: 20) == 1, "\(opus.stderr)")
        #expect(Date().timeIntervalSince(started) < 15, "it ends when the first packets cannot be decoded, not at --duration")
        #expect(opus.stderr.contains { $0.contains("the host sends Opus, which this player cannot decode: opus: libopus is not available (")
                                       && $0.contains("install libopus0") }, "\(opus.stderr)")
        #expect(opusHost.isRunning, "\(opusHost.stderr)")
    }

    @Test("mesh-record --codec opus without libopus exits 1, saying what to install")
    func hostWithoutLibopus() throws {
        let paired = try PairedStates()
        let host = try withoutLibopus("mesh-record", paired.hostArgs + ["--host", "--name", "no-opus", "--input", "tone:440",
                                                                        "--codec", "opus", "--bind", "127.0.0.1"])
        defer { host.kill() }
        #expect(host.waitForExit(seconds: 20) == 1, "\(host.stderr)")
        #expect(host.stderr.contains { $0.contains("opus: libopus is not available (") && $0.contains("install libopus0") },
                "\(host.stderr)")
    }
}
