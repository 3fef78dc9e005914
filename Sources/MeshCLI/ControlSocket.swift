import FoundationEssentials
import Glibc
import Synchronization
import MeshPOSIX

/// Where a running `mesh-record --host` keeps its control socket: `--runtime-dir DIR`, else systemd's
/// `$RUNTIME_DIRECTORY` (`RuntimeDirectory=peermesh`), else `$XDG_RUNTIME_DIR/peermesh`, else `/run/peermesh` for root
/// and `/tmp/peermesh-UID` for others. The directory is mode 0700 and the socket 0600.
package struct RuntimeDirectory: Sendable, Equatable {
    package var path: String

    package init(_ path: String) { self.path = path }

    package static var `default`: RuntimeDirectory {
        let env = ProcessInfo.processInfo.environment
        if let d = env["RUNTIME_DIRECTORY"]?.split(separator: ":").first, d.hasPrefix("/") { return RuntimeDirectory(String(d)) }
        if let x = env["XDG_RUNTIME_DIR"], x.hasPrefix("/") { return RuntimeDirectory(x + "/peermesh") }
        return RuntimeDirectory(getuid() == 0 ? "/run/peermesh" : "/tmp/peermesh-\(getuid())")
    }

    /// The host's control socket.
    package var socketPath: String { path + "/mesh-record.sock" }

    /// The lock file a host holds while it serves `socketPath` (left in place when it stops: removing a lock file
    /// lets two later hosts lock two different files).
    package var lockPath: String { socketPath + ".lock" }
}

/// `mesh-record ctl` commands, as they travel: one line, words separated by spaces.
package enum ControlCommand: Sendable, Equatable {
    case status
    case pair(timeoutSeconds: Double?)
    case paired
    case forget(String)
    case mute
    case unmute

    /// The words a person types after `mesh-record ctl`.
    package static func parse(_ words: [String]) -> ControlCommand? {
        guard let verb = words.first else { return nil }
        let rest = Array(words.dropFirst())
        switch (verb, rest.count) {
        case ("status", 0): return .status
        case ("pair", 0): return .pair(timeoutSeconds: nil)
        case ("pair", 1):
            guard let s = Double(rest[0]), s.isFinite, s >= 1, s <= 3_600 else { return nil }
            return .pair(timeoutSeconds: s)
        case ("paired", 0): return .paired
        case ("forget", _) where !rest.isEmpty: return .forget(rest.joined(separator: " "))
        case ("mute", 0): return .mute
        case ("unmute", 0): return .unmute
        default: return nil
        }
    }

    /// The request line.
    package var line: String {
        switch self {
        case .status: "status"
        case .pair(let t): t.map { "pair \(JSONObject.number($0))" } ?? "pair"
        case .paired: "paired"
        case .forget(let name): "forget \(name)"
        case .mute: "mute"
        case .unmute: "unmute"
        }
    }
}

/// A control reply: whether the command worked, and the lines to show.
package struct ControlReply: Sendable, Equatable {
    package var ok: Bool
    package var lines: [String]

    package init(ok: Bool, _ lines: [String]) {
        self.ok = ok
        self.lines = lines
    }

    /// As it travels: `ok` or `error`, then the lines; the server closes the connection after it.
    package var wire: String { ([ok ? "ok" : "error"] + lines).joined(separator: "\n") + "\n" }

    package static func parse(_ text: String) -> ControlReply? {
        var lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        if lines.last == "" { lines.removeLast() }
        guard let first = lines.first, first == "ok" || first == "error" else { return nil }
        return ControlReply(ok: first == "ok", Array(lines.dropFirst()))
    }
}

/// The listening end, in a running host: a `pm-ctl` thread that takes one connection at a time, admits only the
/// host's own user and root (`SO_PEERCRED`, on top of the socket's 0600 mode), reads one command line and answers.
package final class ControlServer: Sendable {
    package let path: String
    /// The claim on `path` (`mesh-record.sock.lock` beside it), held until `stop()`: of two hosts started in the same
    /// instant only one gets the socket. Without it both could find no host answering, and the second would unlink
    /// the first's socket and bind its own (and the first, stopping, would then unlink the second's).
    private let claim: FileLock
    private let listener: FileDescriptor
    private let handler: @Sendable (ControlCommand) -> ControlReply
    private let running = Atomic<Bool>(true)
    private let finished = WakeSignal()

    /// Listens at `directory.socketPath` (creating the directory 0700). Throws when another host holds it.
    package init(directory: RuntimeDirectory, handler: @escaping @Sendable (ControlCommand) -> ControlReply) throws {
        try PrivateFile.ensureDirectory(directory.path)
        path = directory.socketPath
        guard let claim = try FileLock(ifFree: directory.lockPath) else {
            throw SyscallError(call: "bind(\(path)) (another mesh-record host holds \(directory.lockPath))", code: EADDRINUSE)
        }
        self.claim = claim
        listener = try UnixSocket.listen(path: path)
        self.handler = handler
        OSThread.detach(name: "pm-ctl") { [self] in
            serve()
            finished.signal()
        }
    }

    private func serve() {
        let me = getuid()
        while running.load(ordering: .acquiring) {
            let accepted: FileDescriptor?
            do { accepted = try UnixSocket.accept(listener, timeoutMillis: 200) } catch {
                usleep(100_000)   // out of descriptors, say: do not spin on a connection that stays pending
                continue
            }
            guard let c = accepted else { continue }
            defer { c.close() }
            guard let uid = try? UnixSocket.peerUID(c), uid == me || uid == 0 else {
                try? UnixSocket.write(c, ControlReply(ok: false, ["not allowed: only the host's own user and root may control it"]).wire)
                continue
            }
            guard let line = try? UnixSocket.readLine(c, limit: 512, timeoutMillis: 2_000) else { continue }
            // The verb, then at most one argument, which may hold spaces (`forget Living Room`).
            let words = line.split(separator: " ", maxSplits: 1).map(String.init)
            let reply = ControlCommand.parse(words).map(handler)
                ?? ControlReply(ok: false, ["unknown command \"\(TerminalText.escape(line))\"; commands: status, pair [SECONDS], paired, forget NAME|FINGERPRINT, mute, unmute"])
            try? UnixSocket.write(c, reply.wire)
        }
    }

    /// Stops listening and removes the socket file.
    package func stop() {
        guard running.exchange(false, ordering: .acquiringAndReleasing) else { return }
        finished.wait()
        listener.close()
        unlink(path)   // still under the claim: the socket there is this host's own
        claim.unlock()
    }

    deinit { stop() }
}

/// The client end: `mesh-record ctl …`.
package enum ControlClient {
    /// Whether a client run by `client` may believe the host, run by `uid`, whose socket is in `directory`: a host of
    /// this user or of root; and, for root, the host of a service account in a directory only that account can
    /// change, inside one only root can change (`/run/peermesh` of mesh-record.service, run as `peermesh`). Nobody
    /// else could have put a socket there. Someone's socket in a shared directory (`/tmp`) is never believed.
    package static func serves(uid: uid_t, client: uid_t, in directory: String) -> Bool {
        if uid == client || uid == 0 { return true }
        guard client == 0 else { return false }
        var dir = directory
        while dir.count > 1, dir.hasSuffix("/") { dir.removeLast() }
        let parent = dir.split(separator: "/", omittingEmptySubsequences: false).dropLast().joined(separator: "/")
        var own = stat(), above = stat()
        guard lstat(dir, &own) == 0, own.st_mode & S_IFMT == S_IFDIR, own.st_uid == uid, own.st_mode & 0o022 == 0,
              stat(parent.isEmpty ? "/" : parent, &above) == 0, above.st_uid == 0, above.st_mode & 0o022 == 0 else { return false }
        return true
    }

    /// Why a command did not reach a host.
    package enum Failure: Error, CustomStringConvertible {
        case noHost(String)
        case refused(String)
        case garbled

        package var description: String {
            switch self {
            case .noHost(let path): "no mesh-record --host is running here (no control socket at \(path))"
            case .refused(let why): "cannot reach the running mesh-record: \(why)"
            case .garbled: "the running mesh-record sent an answer this ctl cannot read (another version?)"
            }
        }
    }

    package static func send(_ command: ControlCommand, to directory: RuntimeDirectory) throws(Failure) -> ControlReply {
        let path = directory.socketPath
        let s: FileDescriptor
        do {
            s = try UnixSocket.connect(path: path)
        } catch {
            if error.code == ENOENT || error.code == ECONNREFUSED { throw .noHost(path) }
            throw .refused(error.description)
        }
        defer { s.close() }
        // Only a host we can vouch for is told anything: a socket someone else put there is not ours.
        let uid: uid_t
        do { uid = try UnixSocket.peerUID(s) } catch { throw .refused("cannot tell who runs \(path): \(error)") }
        guard serves(uid: uid, client: getuid(), in: directory.path) else {
            throw .refused("the socket \(path) belongs to uid \(uid), not to this user, root, or an account that alone controls \(directory.path); not talking to it")
        }
        do {
            try UnixSocket.write(s, command.line + "\n")
            let bytes = try UnixSocket.readAll(s, timeoutMillis: 10_000)
            guard let reply = ControlReply.parse(String(decoding: bytes, as: UTF8.self)) else { throw Failure.garbled }
            return reply
        } catch let f as Failure {
            throw f
        } catch {
            throw .refused("\(error)")
        }
    }
}
