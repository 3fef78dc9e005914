import Foundation
import Testing
import MeshTestSupport

/// scripts/lib/avahi-rig.sh runs scripts from its directory as root and kills the PIDs it reads there: it must refuse
/// a directory another user could write in (a fixed name in /tmp that user made first), or a link, before it runs or
/// kills anything. Nothing here starts a daemon: each call is refused before the rig would.
@Suite("The Avahi rig refuses a directory it does not own",
       .enabled(if: getuid() == 0, "needs root (to give a directory to nobody, as another user would make it)"))
struct AvahiRigDirectoryTests {
    static let rigScript = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("../../scripts/lib/avahi-rig.sh").standardized.path

    /// A new directory of root's, 0700, in TMPDIR (the caller removes it).
    func freshDirectory() throws -> URL {
        let base = FileManager.default.temporaryDirectory.appendingPathComponent("pm-rigdir-\(getpid())-\(UInt32.random(in: 0...UInt32.max))")
        try FileManager.default.createDirectory(at: base, withIntermediateDirectories: false,
                                                attributes: [.posixPermissions: 0o700])
        return base
    }

    /// `avahi_rig_FUNCTION DIR` in bash, with its status and standard error.
    func rig(_ function: String, _ dir: String) throws -> (status: Int32, error: String) {
        let (status, error) = try AvahiRig.run("/bin/bash", ["-c", "source \"$0\"; avahi_rig_\(function) \"$1\"",
                                                            Self.rigScript, dir], standardError: true)
        return (status, error)
    }

    @Test("A directory of nobody's holding a planted avahi-ctl and a pid file: stop runs and kills nothing, start adds nothing")
    func foreignDirectory() throws {
        let base = try freshDirectory()
        defer { try? FileManager.default.removeItem(at: base) }
        let foreign = base.appendingPathComponent("rig").path
        let marker = base.appendingPathComponent("ran").path
        try FileManager.default.createDirectory(atPath: foreign, withIntermediateDirectories: false)
        // What that user would plant: a control script root runs, and a pid file naming a process to kill.
        try "#!/bin/sh\ntouch '\(marker)'\n".write(toFile: foreign + "/avahi-ctl", atomically: false, encoding: .utf8)
        #expect(chmod(foreign + "/avahi-ctl", 0o755) == 0)
        let victim = Process()
        victim.executableURL = URL(fileURLWithPath: "/bin/sleep")
        victim.arguments = ["30"]
        try victim.run()
        ChildLedger.record(victim.processIdentifier)
        defer { kill(victim.processIdentifier, SIGKILL); victim.waitUntilExit() }
        try "\(victim.processIdentifier)\n".write(toFile: foreign + "/dbus.pid", atomically: false, encoding: .utf8)
        let nobody = try #require(getpwnam("nobody"))
        #expect(chown(foreign, nobody.pointee.pw_uid, nobody.pointee.pw_gid) == 0)

        let stop = try rig("stop", foreign)
        #expect(stop.status == 1)
        #expect(stop.error.contains("is not a directory of root's that only it can write in"), "\(stop.error)")
        #expect(!FileManager.default.fileExists(atPath: marker), "the planted avahi-ctl ran")
        #expect(victim.isRunning, "the process named in the planted dbus.pid was killed")

        let before = try FileManager.default.contentsOfDirectory(atPath: foreign).sorted()
        let start = try rig("start", foreign)
        #expect(start.status == 1)
        #expect(try FileManager.default.contentsOfDirectory(atPath: foreign).sorted() == before)
        #expect(!FileManager.default.fileExists(atPath: marker))

        // Root's own directory, but writable by its group: refused too.
        #expect(chown(foreign, 0, 0) == 0 && chmod(foreign, 0o770) == 0)
        #expect(try rig("stop", foreign).status == 1)
        #expect(!FileManager.default.fileExists(atPath: marker))
    }

    @Test("A link to a directory of root's is refused; stop where there is no directory does nothing")
    func linkAndMissing() throws {
        let base = try freshDirectory()
        defer { try? FileManager.default.removeItem(at: base) }
        let link = base.appendingPathComponent("link").path
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: base.path)
        let start = try rig("start", link)
        #expect(start.status == 1)
        #expect(start.error.contains("\(link) is not a directory of root's"), "\(start.error)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: base.path) == ["link"])

        let missing = base.appendingPathComponent("none").path
        let stop = try rig("stop", missing)
        #expect(stop.status == 0 && stop.error.isEmpty, "\(stop.error)")
        #expect(!FileManager.default.fileExists(atPath: missing))
    }
}
