import CLinux
#if canImport(Glibc)
import Glibc
#endif

/// Local stream sockets (AF_UNIX): what a running `mesh-record` listens on for `mesh-record ctl`. Blocking, one
/// connection at a time; every call goes through the syscall funnel.
package enum UnixSocket {
    /// Longest path a `sockaddr_un` holds.
    package static let maximumPathBytes = MemoryLayout.size(ofValue: sockaddr_un().sun_path) - 1

    private static func withAddress<T>(_ path: String, _ body: (UnsafePointer<sockaddr>, socklen_t) throws(SyscallError) -> T) throws(SyscallError) -> T {
        guard path.utf8.count <= maximumPathBytes else {
            throw SyscallError(call: "socket path \(path) (longer than \(maximumPathBytes) bytes)", code: ENAMETOOLONG)
        }
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &addr.sun_path) { raw in
            for (i, b) in path.utf8.enumerated() { raw[i] = b }
        }
        return try withUnsafePointer(to: &addr) { (p) throws(SyscallError) -> T in
            try p.withMemoryRebound(to: sockaddr.self, capacity: 1) { (sp) throws(SyscallError) -> T in
                try body(sp, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
    }

    private static func streamSocket(_ what: String) throws(SyscallError) -> FileDescriptor {
        let fd = try Sys.call("socket(AF_UNIX \(what))") { socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0) }
        return FileDescriptor(fd)
    }

    /// Listens at `path` with mode 0600. A socket file left there by a process that died is replaced; one that
    /// still answers is not (`EADDRINUSE`: another host runs).
    package static func listen(path: String) throws(SyscallError) -> FileDescriptor {
        if (try? connect(path: path)) != nil { throw SyscallError(call: "bind(\(path))", code: EADDRINUSE) }
        unlink(path)
        let s = try streamSocket(path)
        // Created 0600 from the start (Linux gives the socket file the socket inode's mode, less the umask): no window
        // in which another user could connect, and no change to the process-wide umask.
        try Sys.call("fchmod(\(path))") { fchmod(s.fd, 0o600) }
        _ = try withAddress(path) { (p, l) throws(SyscallError) in try Sys.call("bind(\(path))") { bind(s.fd, p, l) } }
        try Sys.call("listen(\(path))") { Glibc.listen(s.fd, 16) }
        return s
    }

    /// Connects to the socket at `path`.
    package static func connect(path: String) throws(SyscallError) -> FileDescriptor {
        let s = try streamSocket(path)
        _ = try withAddress(path) { (p, l) throws(SyscallError) in try Sys.call("connect(\(path))") { Glibc.connect(s.fd, p, l) } }
        return s
    }

    /// Waits up to `timeoutMillis` for a connection (nil when none came).
    package static func accept(_ listener: FileDescriptor, timeoutMillis: Int32) throws(SyscallError) -> FileDescriptor? {
        guard try wait(listener, events: Int16(POLLIN), timeoutMillis: timeoutMillis) else { return nil }
        let fd = try Sys.nonBlocking("accept(AF_UNIX)") { accept4(listener.fd, nil, nil, Int32(SOCK_CLOEXEC.rawValue)) }
        return fd.map { FileDescriptor($0) }
    }

    /// The uid of the process at the other end.
    package static func peerUID(_ s: FileDescriptor) throws(SyscallError) -> UInt32 {
        var uid: UInt32 = 0
        try Sys.call("getsockopt(SO_PEERCRED)") { pm_peer_uid(s.fd, &uid) }
        return uid
    }

    /// Reads one line (without its newline), at most `limit` bytes, waiting up to `timeoutMillis` in all.
    package static func readLine(_ s: FileDescriptor, limit: Int = 1024, timeoutMillis: Int32) throws(SyscallError) -> String? {
        var bytes: [UInt8] = []
        var byte: UInt8 = 0
        let deadline = MonotonicClock.nowNanos() + UInt64(timeoutMillis) * 1_000_000
        while bytes.count < limit {
            let now = MonotonicClock.nowNanos()
            guard now < deadline, try wait(s, events: Int16(POLLIN), timeoutMillis: Int32((deadline - now) / 1_000_000) + 1) else { return nil }
            let n = try Sys.call("read(AF_UNIX)") { read(s.fd, &byte, 1) }
            if n == 0 { break }
            if byte == UInt8(ascii: "\n") { return String(decoding: bytes, as: UTF8.self) }
            bytes.append(byte)
        }
        return bytes.isEmpty ? nil : String(decoding: bytes, as: UTF8.self)
    }

    /// Reads everything until the other end closes (at most `limit` bytes).
    package static func readAll(_ s: FileDescriptor, limit: Int = 1 << 20, timeoutMillis: Int32) throws(SyscallError) -> [UInt8] {
        var out: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while out.count < limit {
            guard try wait(s, events: Int16(POLLIN), timeoutMillis: timeoutMillis) else { break }
            let n = try Sys.call("read(AF_UNIX)") { buffer.withUnsafeMutableBytes { read(s.fd, $0.baseAddress, $0.count) } }
            if n == 0 { break }
            out += buffer[0..<n]
        }
        return out
    }

    /// Writes all of `text`.
    package static func write(_ s: FileDescriptor, _ text: String) throws(SyscallError) {
        let bytes = Array(text.utf8)
        var at = 0
        while at < bytes.count {
            // MSG_NOSIGNAL: a client that hung up costs an EPIPE, never a SIGPIPE that would end the process.
            let n = try Sys.call("send(AF_UNIX)") {
                bytes.withUnsafeBytes { Glibc.send(s.fd, $0.baseAddress! + at, $0.count - at, Int32(MSG_NOSIGNAL)) }
            }
            at += n
        }
    }

    private static func wait(_ s: FileDescriptor, events: Int16, timeoutMillis: Int32) throws(SyscallError) -> Bool {
        var p = pollfd(fd: s.fd, events: events, revents: 0)
        return try Sys.call("poll(AF_UNIX)") { poll(&p, 1, max(0, timeoutMillis)) } > 0
    }
}
