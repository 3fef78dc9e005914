import Foundation
import MeshCLI
import MeshTestSupport
import Testing

/// Whom `mesh-record ctl` believes: its own user's host, root's, and — as root — a service account's host in a
/// directory only that account controls (mesh-record.service runs as `peermesh` in `/run/peermesh`); never a socket
/// someone put in a shared directory. The host runs as `nobody` (uid 65534) through `setpriv`, as systemd's `User=`
/// would run it.
@Suite("mesh-record ctl: whose host it talks to", .serialized,
       .enabled(if: getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv"), "needs root and setpriv"))
struct ControlSocketOwnerTests {
    static let nobody: uid_t = 65_534

    /// A directory owned by `nobody`, mode 0700, inside `parent`.
    static func nobodysDirectory(in parent: String, _ name: String) throws -> String {
        let path = parent + "/" + name
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false,
                                                attributes: [.posixPermissions: 0o700])
        #expect(chown(path, nobody, nobody) == 0)
        return path
    }

    /// A parent only root can change (0755, root's), like `/run`.
    static func rootsDirectory() throws -> String {
        let path = Rig.tempPath("ctl-owner-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o755])
        return path
    }

    /// `mesh-record --host` run as nobody, with its state and control socket in `runtime`'s sibling directories.
    static func hostAsNobody(runtime: String, state: String, name: String) throws -> ChildProcess {
        try ChildProcess(URL(fileURLWithPath: "/usr/bin/setpriv"), [
            "--reuid=\(nobody)", "--regid=\(nobody)", "--clear-groups", "--",
            builtProduct("mesh-record").path, "--host", "--name", name, "--service", Rig.uniqueService(),
            "--input", "tone:440", "--state-dir", state, "--runtime-dir", runtime])
    }

    @Test("As root, ctl talks to a service account's host in a directory only it controls, inside one only root controls")
    func rootTalksToTheServiceAccountsHost() throws {
        let run = try Self.rootsDirectory()
        let runtime = try Self.nobodysDirectory(in: run, "peermesh")
        let state = try Self.nobodysDirectory(in: run, "state")
        let host = try Self.hostAsNobody(runtime: runtime, state: state, name: "service-host")
        defer { host.kill() }
        #expect(eventually(10) { FileManager.default.fileExists(atPath: runtime + "/mesh-record.sock") }, "\(host.stderr)")
        let status = try CLIProcess("mesh-record", ["ctl", "status", "--runtime-dir", runtime])
        #expect(status.waitForExit(seconds: 10) == 0, "\(status.stderr)")
        #expect(status.stdout.contains { $0.contains("service-host") }, "\(status.stdout)")
    }

    @Test("As root, ctl does not talk to another user's socket in a shared directory (/tmp-like: sticky, writable by all)")
    func rootIgnoresAPlantedSocket() throws {
        let shared = try Self.rootsDirectory()
        #expect(chmod(shared, 0o1777) == 0)
        let runtime = try Self.nobodysDirectory(in: shared, "peermesh")
        let state = try Self.nobodysDirectory(in: try Self.rootsDirectory(), "state")
        let host = try Self.hostAsNobody(runtime: runtime, state: state, name: "planted-host")
        defer { host.kill() }
        #expect(eventually(10) { FileManager.default.fileExists(atPath: runtime + "/mesh-record.sock") }, "\(host.stderr)")
        let status = try CLIProcess("mesh-record", ["ctl", "status", "--runtime-dir", runtime])
        #expect(status.waitForExit(seconds: 10) == 1, "\(status.stdout)")
        #expect(status.stderr.contains { $0.contains("belongs to uid 65534") && $0.contains("not talking to it") }, "\(status.stderr)")
        #expect(!status.stdout.contains { $0.contains("planted-host") })
    }

    @Test("The rule, directory by directory")
    func theRule() throws {
        let run = try Self.rootsDirectory()
        let own = try Self.nobodysDirectory(in: run, "own")
        #expect(ControlClient.serves(uid: 1_000, client: 1_000, in: "/anywhere"), "one's own host")
        #expect(ControlClient.serves(uid: 0, client: 1_000, in: "/anywhere"), "root's host")
        #expect(ControlClient.serves(uid: Self.nobody, client: 0, in: own))
        #expect(ControlClient.serves(uid: Self.nobody, client: 0, in: own + "/"))
        #expect(!ControlClient.serves(uid: Self.nobody, client: 1_000, in: own), "only root believes a service account")
        #expect(!ControlClient.serves(uid: 4_242, client: 0, in: own), "the directory is not the host's")
        #expect(chmod(own, 0o770) == 0)
        #expect(!ControlClient.serves(uid: Self.nobody, client: 0, in: own), "its group can change the directory")
        #expect(chmod(own, 0o700) == 0 && chmod(run, 0o775) == 0)
        #expect(!ControlClient.serves(uid: Self.nobody, client: 0, in: own), "the parent's group can replace the directory")
        #expect(!ControlClient.serves(uid: Self.nobody, client: 0, in: run + "/missing"))
    }
}
