import CLinux
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Small files that must be private and never half-written: identities, trust stores.
package enum PrivateFile {
    /// Creates `path` as a directory with mode 0700, or checks that it is one; an existing one readable by others
    /// has its mode tightened to 0700 if it holds only files (one that holds directories is refused, `EPERM`). Missing parents are created with the usual 0755 (less the umask); existing
    /// parents are never touched (`/tmp`, `~/.config` and `/var/lib` keep their modes).
    ///
    /// A path that is a symbolic link, a directory owned by another user, or a shared one (sticky or writable by
    /// all, like `/tmp`) is refused (`EPERM`): keys and control sockets need a directory of their own.
    package static func ensureDirectory(_ given: String) throws(SyscallError) {
        var path = given
        while path.count > 1, path.hasSuffix("/") { path.removeLast() }
        var st = stat()
        if lstat(path, &st) != 0 {
            try ensureParents(of: path)
            if mkdir(path, 0o700) != 0, errno != EEXIST { throw SyscallError(call: "mkdir(\(path))", code: errno) }
            guard lstat(path, &st) == 0 else { throw SyscallError(call: "stat(\(path))", code: errno) }
        }
        guard st.st_mode & S_IFMT == S_IFDIR else {
            throw SyscallError(call: "mkdir(\(path)) (not a directory\(st.st_mode & S_IFMT == S_IFLNK ? ": a symbolic link" : ""))", code: ENOTDIR)
        }
        guard st.st_uid == geteuid() else { throw SyscallError(call: "use \(path) (owned by uid \(st.st_uid))", code: EPERM) }
        guard st.st_mode & (S_ISVTX | 0o002) == 0 else {
            throw SyscallError(call: "use \(path) (a shared directory, mode \(String(st.st_mode & 0o7777, radix: 8)): give one of its own)", code: EPERM)
        }
        if st.st_mode & 0o077 != 0 {
            // Tightened only if it holds files, as PeerMesh's own directory does: one that holds directories is a
            // tree of someone else's (`/`, `/var/lib`, a home), and is never taken over.
            guard !holdsDirectories(path) else {
                throw SyscallError(call: "use \(path) (open to others, mode \(String(st.st_mode & 0o7777, radix: 8)), and it holds directories: give a directory of its own)", code: EPERM)
            }
            try Sys.call("chmod(\(path), 0700)") { chmod(path, 0o700) }
        }
    }

    /// Whether the directory `path` holds a directory (unreadable counts as yes: nothing is changed then).
    private static func holdsDirectories(_ path: String) -> Bool {
        guard let dir = opendir(path) else { return true }
        defer { closedir(dir) }
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            guard name != ".", name != ".." else { continue }
            var st = stat()
            if lstat(path + "/" + name, &st) != 0 || st.st_mode & S_IFMT == S_IFDIR { return true }
        }
        return false
    }

    /// Creates the missing directories above `path` (0755 less the umask), leaving existing ones as they are.
    private static func ensureParents(of path: String) throws(SyscallError) {
        let parent = path.split(separator: "/", omittingEmptySubsequences: false).dropLast().joined(separator: "/")
        guard !parent.isEmpty, parent != path else { return }
        var st = stat()
        if stat(parent, &st) == 0 {
            guard st.st_mode & S_IFMT == S_IFDIR else { throw SyscallError(call: "mkdir(\(parent))", code: ENOTDIR) }
            return
        }
        try ensureParents(of: parent)
        if mkdir(parent, 0o755) != 0, errno != EEXIST { throw SyscallError(call: "mkdir(\(parent))", code: errno) }
    }

    /// Writes `bytes` to `path` atomically with mode 0600: a temporary file in the same directory, `fsync`, then
    /// `rename` over the old one, and `fsync` of the directory (best effort) so that the rename itself survives a power
    /// cut (a pairing is not undone). Readers see the old file or the new one, never a mixture.
    package static func write(_ bytes: [UInt8], to path: String) throws(SyscallError) {
        let tmp = "\(path).tmp.\(getpid()).\(UInt32.random(in: 0...UInt32.max))"
        let fd = try Sys.call("open(\(tmp))") { open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600) }
        var ok = false
        defer {
            close(fd)
            if !ok { unlink(tmp) }
        }
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { raw in Glibc.write(fd, raw.baseAddress! + offset, raw.count - offset) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { throw SyscallError(call: "write(\(tmp))", code: n < 0 ? errno : EIO) }
            offset += n
        }
        try Sys.call("fsync(\(tmp))") { fsync(fd) }
        try Sys.call("rename(\(tmp), \(path))") { rename(tmp, path) }
        ok = true
        // Best effort: the new file is in place either way, and a file system that cannot sync a directory has
        // nothing better to offer.
        let parent = path.contains("/") ? String(path[..<path.lastIndex(of: "/")!]) : "."
        let dir = open(parent.isEmpty ? "/" : parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if dir >= 0 {
            _ = fsync(dir)
            close(dir)
        }
    }

    /// The contents of `path` (at most `limit` bytes; a larger file is an error, not a truncation).
    ///
    /// For a file that holds a secret, pass `wipe` (the caller's wipe, one the optimiser keeps): every buffer the
    /// bytes pass through that is released here — the read buffer, a result outgrown, or one dropped on an error — is
    /// handed to it first. The array returned is the caller's to wipe.
    package static func read(_ path: String, limit: Int = 1 << 20,
                             wipingWith wipe: ((UnsafeMutableRawBufferPointer) -> Void)? = nil) throws(SyscallError) -> [UInt8] {
        let fd = try Sys.call("open(\(path))") { open(path, O_RDONLY | O_CLOEXEC) }
        defer { close(fd) }
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16_384)
        var returned = false
        defer {
            if let wipe {
                chunk.withUnsafeMutableBytes(wipe)
                if !returned { out.withUnsafeMutableBytes(wipe) }
            }
        }
        while true {
            let n = chunk.withUnsafeMutableBytes { raw in Glibc.read(fd, raw.baseAddress!, raw.count) }
            if n < 0, errno == EINTR { continue }
            if n < 0 { throw SyscallError(call: "read(\(path))", code: errno) }
            if n == 0 {
                returned = true
                return out
            }
            if let wipe, out.count + n > out.capacity {
                // Grown by hand: `append` would release the outgrown storage unwiped.
                var grown: [UInt8] = []
                grown.reserveCapacity(2 * (out.count + n))
                grown += out
                out.withUnsafeMutableBytes(wipe)
                out = grown
            }
            out.append(contentsOf: chunk[0..<n])
            if out.count > limit { throw SyscallError(call: "read(\(path))", code: EFBIG) }
        }
    }

    /// Whether `path` exists.
    package static func exists(_ path: String) -> Bool { access(path, F_OK) == 0 }

    /// What tells one version of a file from another without reading it: device, inode, size, and the times of the
    /// last change to its contents and to its inode (nanoseconds). A file replaced by `write` (a rename) gets a new
    /// inode; one changed in place, a new change time. Nil when `path` cannot be `stat`ed.
    package struct Stamp: Equatable, Sendable {
        let device: UInt64, inode: UInt64, size: Int64
        let modified: (Int, Int), changed: (Int, Int)

        package static func == (a: Stamp, b: Stamp) -> Bool {
            a.device == b.device && a.inode == b.inode && a.size == b.size && a.modified == b.modified && a.changed == b.changed
        }

        /// Whether the contents or the inode changed less than `seconds` ago (wall clock): a later change could
        /// then fall in the same tick of the file system's clock and leave the stamp as it is.
        package func isRecent(seconds: Int) -> Bool {
            var now = timespec()
            clock_gettime(CLOCK_REALTIME, &now)
            // In seconds and nanoseconds apart, never multiplied out: a time set centuries away must not overflow.
            func isRecent(_ t: (Int, Int)) -> Bool {
                let (wholeSeconds, overflow) = now.tv_sec.subtractingReportingOverflow(t.0)
                if overflow || wholeSeconds < 0 { return true }  // in the future (or past the range): not settled
                return wholeSeconds < seconds || (wholeSeconds == seconds && now.tv_nsec < t.1)
            }
            return isRecent(modified) || isRecent(changed)
        }
    }

    /// `path`'s `Stamp` now, or nil.
    package static func stamp(_ path: String) -> Stamp? {
        var st = stat()
        guard stat(path, &st) == 0 else { return nil }
        return Stamp(device: UInt64(st.st_dev), inode: UInt64(st.st_ino), size: Int64(st.st_size),
                     modified: (st.st_mtim.tv_sec, st.st_mtim.tv_nsec), changed: (st.st_ctim.tv_sec, st.st_ctim.tv_nsec))
    }

    /// The permission bits of `path`.
    package static func mode(_ path: String) -> mode_t? {
        var st = stat()
        return stat(path, &st) == 0 ? st.st_mode & 0o7777 : nil
    }

    /// Why nobody but this user may rely on the file at `path`, or nil when only this user (or root) can change it:
    /// it is writable by its group or by all, or owned by another user.
    package static func openToOthers(_ path: String) -> String? {
        var st = stat()
        guard stat(path, &st) == 0 else { return nil }
        if st.st_uid != geteuid() && st.st_uid != 0 { return "it is owned by uid \(st.st_uid), not by this user" }
        if st.st_mode & 0o022 != 0 { return "others can change it (mode \(String(st.st_mode & 0o7777, radix: 8))); run chmod 600 \(path)" }
        return nil
    }
}

/// An exclusive advisory lock (`flock`) on a lock file, held until `unlock()` or release: serializes
/// read-modify-write of a shared file across processes, or claims a resource (a control socket's path) for as long as
/// a process lives. The kernel drops it when the process dies, so a crash never leaves it held.
package final class FileLock: Sendable {
    private let descriptor: FileDescriptor

    /// Opens (creating, mode 0600) `path` and waits for the exclusive lock.
    package init(path: String) throws(SyscallError) {
        descriptor = try Self.open(path)
        try Sys.call("flock(\(path))") { flock(descriptor.fd, LOCK_EX) }
    }

    /// Opens (creating, mode 0600) `path` and takes the exclusive lock only if nobody holds it: nil when another open
    /// of the file (another process, or another `FileLock` in this one) holds it.
    package init?(ifFree path: String) throws(SyscallError) {
        descriptor = try Self.open(path)
        guard try Sys.nonBlocking("flock(\(path))", { flock(descriptor.fd, LOCK_EX | LOCK_NB) }) != nil else {
            descriptor.close()
            return nil
        }
    }

    /// The lock file itself: never through a symbolic link, so a planted link cannot make it create or lock a file
    /// elsewhere.
    private static func open(_ path: String) throws(SyscallError) -> FileDescriptor {
        FileDescriptor(try Sys.call("open(\(path))") { Glibc.open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600) })
    }

    /// Releases the lock by closing the file (the lock belongs to that open file; every descriptor of it is
    /// close-on-exec, so no child keeps it). Later calls do nothing: never an `flock` on a number that may since
    /// name another file.
    package func unlock() {
        descriptor.close()
    }

    deinit { unlock() }
}

/// A regular file read or written front to back (resource transfers): owned, closed on release.
package final class SequentialFile: Sendable {
    /// Where it is.
    package let path: String
    private let descriptor: FileDescriptor

    private init(path: String, fd: Int32) {
        self.path = path
        descriptor = FileDescriptor(fd)
    }

    /// Opens `path` for reading; it must be a regular file (not a directory, device or FIFO).
    package static func openForReading(_ path: String) throws(SyscallError) -> SequentialFile {
        let fd = try Sys.call("open(\(path))") { open(path, O_RDONLY | O_CLOEXEC) }
        let file = SequentialFile(path: path, fd: fd)
        var st = stat()
        try Sys.call("stat(\(path))") { fstat(fd, &st) }
        guard st.st_mode & S_IFMT == S_IFREG else { throw SyscallError(call: "open(\(path)) (not a regular file)", code: EINVAL) }
        return file
    }

    /// Creates `path`, which must not exist, for writing with mode 0600.
    package static func create(_ path: String) throws(SyscallError) -> SequentialFile {
        let fd = try Sys.call("create(\(path))") { open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600) }
        return SequentialFile(path: path, fd: fd)
    }

    /// The file's size now.
    package func size() throws(SyscallError) -> UInt64 {
        var st = stat()
        try Sys.call("stat(\(path))") { fstat(descriptor.fd, &st) }
        return UInt64(st.st_size)
    }

    /// Reads up to `buffer.count` bytes; 0 means the end of the file.
    package func read(into buffer: UnsafeMutableRawBufferPointer) throws(SyscallError) -> Int {
        try Sys.call("read(\(path))") { Glibc.read(descriptor.fd, buffer.baseAddress, buffer.count) }
    }

    /// Writes all of `bytes`.
    package func write(_ bytes: UnsafeRawBufferPointer) throws(SyscallError) {
        var offset = 0
        while offset < bytes.count {
            let n = try Sys.call("write(\(path))") { Glibc.write(descriptor.fd, bytes.baseAddress! + offset, bytes.count - offset) }
            guard n > 0 else { throw SyscallError(call: "write(\(path))", code: EIO) }
            offset += n
        }
    }

    /// Renames `from` to `to` (replacing it), atomically.
    package static func rename(_ from: String, to: String) throws(SyscallError) {
        try Sys.call("rename(\(from), \(to))") { Glibc.rename(from, to) }
    }

    /// Flushes the file to the disk.
    package func sync() throws(SyscallError) { try Sys.call("fsync(\(path))") { fsync(descriptor.fd) } }

    /// Closes it now (release does the same).
    package func close() { descriptor.close() }
}

/// Directories of one's own for files that arrive.
package enum TemporaryDirectory {
    /// The system's temporary directory: `$TMPDIR`, else `/tmp`.
    package static var system: String {
        if let t = getenv("TMPDIR"), t.pointee != 0 { return String(cString: t) }
        return "/tmp"
    }

    /// Creates a new directory with mode 0700 in `parent`, named `prefix` and six random characters (`mkdtemp`).
    package static func make(in parent: String, prefix: String) throws(SyscallError) -> String {
        var template = Array("\(parent)/\(prefix)XXXXXX".utf8CString)
        let made = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        guard made != nil else { throw SyscallError(call: "mkdtemp(\(parent)/\(prefix)…)", code: errno) }
        return String(decoding: template.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Removes `directory` with the files directly in it (no recursion: it only ever holds files we wrote).
    package static func remove(_ directory: String) {
        if let dir = opendir(directory) {
            while let entry = readdir(dir) {
                let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                    String(cString: raw.bindMemory(to: CChar.self).baseAddress!)
                }
                if name != ".", name != ".." { unlink("\(directory)/\(name)") }
            }
            closedir(dir)
        }
        rmdir(directory)
    }
}

/// What a filesystem has room for, and moving files within one or across two.
package enum FileSystem {
    /// Bytes an unprivileged process may still write on the filesystem that holds `path` (`statvfs`'s `f_bavail`
    /// blocks: without the part kept for root).
    package static func availableBytes(at path: String) throws(SyscallError) -> UInt64 {
        var fs = statvfs()
        try Sys.call("statvfs(\(path))") { statvfs(path, &fs) }
        let (bytes, overflow) = UInt64(fs.f_bavail).multipliedReportingOverflow(by: UInt64(fs.f_frsize))
        return overflow ? .max : bytes
    }

    /// Moves the file at `from` to the first of `candidates` that nothing holds — no file, directory or symbolic link
    /// (even one that leads nowhere) — and returns that path; nil, with nothing changed, when every one is taken.
    /// Never a check, then a move: the check is the move (`renameat2`'s `RENAME_NOREPLACE`, else a hard link, else
    /// an `O_EXCL` file made to hold the name), so nothing that appears at a candidate meanwhile is replaced or
    /// written through.
    ///
    /// From another file system the bytes are copied once, into a new file (`O_EXCL`, mode 0600, named
    /// `.partial-…`) beside the first candidate, synced, and only then put in place the same way, name by name: a
    /// candidate never names a partial copy (a crash may leave the hidden `.partial-…` file). `from` goes once the
    /// file is in place (if it cannot be removed, it is left: the move has happened either way).
    package static func moveWithoutReplacing(_ from: String, toFirstFreeOf candidates: [String]) throws(SyscallError) -> String? {
        for (n, candidate) in candidates.enumerated() {
            switch place(from, at: candidate) {
            case 0: return candidate
            case EEXIST: continue
            case EXDEV: return try copyThenPlace(from, atFirstFreeOf: Array(candidates[n...]))
            case let code: throw SyscallError(call: "rename(\(from), \(candidate))", code: code)
            }
        }
        return nil
    }

    /// `moveWithoutReplacing` to one path: whether the file went there.
    package static func moveWithoutReplacing(_ from: String, to: String) throws(SyscallError) -> Bool {
        try moveWithoutReplacing(from, toFirstFreeOf: [to]) != nil
    }

    /// Puts the file at `from` at `to` unless something is there, on one file system: 0, or the `errno` (`EEXIST`:
    /// something is there; `EXDEV`: another file system). `renameat2` with `RENAME_NOREPLACE`; where the file system
    /// has no such flag, a hard link (just as exclusive), then `from` removed; where it has no hard links either, an
    /// empty `O_EXCL` file claims the name and `rename` puts the file over that claim (rename replaces the entry, and
    /// never writes through it).
    private static func place(_ from: String, at to: String) -> Int32 {
        let renamed = outcome(renameat2(AT_FDCWD, from, AT_FDCWD, to, pm_rename_noreplace))
        guard renamed == EINVAL || renamed == ENOSYS else { return renamed }
        let linked = outcome(link(from, to))
        if linked == 0 { unlink(from) }
        guard linked == EPERM || linked == EOPNOTSUPP || linked == ENOSYS || linked == EMLINK else { return linked }
        var claim: Int32 = -1
        repeat { claim = open(to, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600) } while claim < 0 && errno == EINTR
        guard claim >= 0 else { return errno }
        close(claim)
        let moved = outcome(rename(from, to))
        if moved != 0 { unlink(to) }
        return moved
    }

    /// 0 for a call that succeeded, else its `errno` (`EINTR` retried by calling again).
    private static func outcome(_ call: @autoclosure () -> Int32) -> Int32 {
        while true {
            if call() == 0 { return 0 }
            if errno != EINTR { return errno }
        }
    }

    /// The cross-file-system half of `moveWithoutReplacing`: one copy, then placed at the first free candidate; nil,
    /// with nothing changed, when every one is taken.
    private static func copyThenPlace(_ from: String, atFirstFreeOf candidates: [String]) throws(SyscallError) -> String? {
        guard let first = candidates.first else { return nil }
        let directory = first.contains("/") ? String(first[..<first.lastIndex(of: "/")!]) : "."
        let partial = "\(directory.isEmpty ? "" : directory)/.partial-\(getpid())-\(UInt64.random(in: 0...UInt64.max))"
        let source = try SequentialFile.openForReading(from)
        let target = try SequentialFile.create(partial)
        do {
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
            defer { buffer.deallocate() }
            while case let n = try source.read(into: buffer), n > 0 {
                try target.write(UnsafeRawBufferPointer(rebasing: buffer[0..<n]))
            }
            try target.sync()
        } catch {
            unlink(partial)
            throw error
        }
        target.close()
        for candidate in candidates {
            switch place(partial, at: candidate) {
            case 0:
                unlink(from)
                return candidate
            case EEXIST:
                continue
            case let code:
                unlink(partial)
                throw SyscallError(call: "rename(\(partial), \(candidate))", code: code)
            }
        }
        unlink(partial)
        return nil
    }
}
