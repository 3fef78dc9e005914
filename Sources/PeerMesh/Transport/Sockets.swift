#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The one place PeerMesh calls the socket API. Every call goes through `syscall(_:_:)`: a negative return
/// becomes a `PeerMeshError.transport` carrying the call's name and `strerror` text, and EINTR is retried.
enum Sys {
    @discardableResult
    static func syscall<T: BinaryInteger>(_ what: @autoclosure () -> String, _ body: () -> T) throws(PeerMeshError) -> T {
        while true {
            let r = body()
            if r >= 0 { return r }
            let e = errno
            if e == EINTR { continue }
            throw .transport("\(what()): \(String(cString: strerror(e)))")
        }
    }

    /// Like `syscall`, but EAGAIN/EWOULDBLOCK/EINPROGRESS come back as `nil` instead of an error.
    static func nonBlocking<T: BinaryInteger>(_ what: @autoclosure () -> String, _ body: () -> T) throws(PeerMeshError) -> T? {
        while true {
            let r = body()
            if r >= 0 { return r }
            let e = errno
            if e == EINTR { continue }
            if e == EAGAIN || e == EWOULDBLOCK || e == EINPROGRESS { return nil }
            throw .transport("\(what()): \(String(cString: strerror(e)))")
        }
    }

    static func setNonBlocking(_ fd: Int32) throws(PeerMeshError) {
        let flags = try syscall("fcntl(F_GETFL)") { fcntl(fd, F_GETFL) }
        try syscall("fcntl(F_SETFL)") { fcntl(fd, F_SETFL, flags | O_NONBLOCK) }
    }

    static func setOption(_ fd: Int32, _ level: Int32, _ name: Int32, _ value: Int32) throws(PeerMeshError) {
        var v = value
        try syscall("setsockopt(\(name))") { setsockopt(fd, level, name, &v, socklen_t(MemoryLayout<Int32>.size)) }
    }

    static func errorText(_ e: Int32) -> String { String(cString: strerror(e)) }
}

/// An IPv4 socket address.
struct SocketAddress: Hashable, Sendable {
    var raw: sockaddr_in

    init(_ raw: sockaddr_in) { self.raw = raw }

    /// Parses a numeric IPv4 address.
    init(host: String, port: UInt16) throws(PeerMeshError) {
        var a = sockaddr_in()
        a.sin_family = sa_family_t(AF_INET)
        a.sin_port = port.bigEndian
        guard inet_pton(AF_INET, host, &a.sin_addr) == 1 else {
            throw .invalidParameter("\"\(host)\" is not a numeric IPv4 address")
        }
        raw = a
    }

    var port: UInt16 { UInt16(bigEndian: raw.sin_port) }
    var ip: UInt32 { raw.sin_addr.s_addr }
    var host: String {
        var addr = raw.sin_addr
        var buf = [CChar](repeating: 0, count: Int(INET_ADDRSTRLEN))
        inet_ntop(AF_INET, &addr, &buf, socklen_t(buf.count))
        return String(decoding: buf.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    func withSockaddr<R, E: Error>(_ body: (UnsafePointer<sockaddr>, socklen_t) throws(E) -> R) throws(E) -> R {
        let p = UnsafeMutablePointer<sockaddr_in>.allocate(capacity: 1)
        defer { p.deallocate() }
        p.initialize(to: raw)
        return try p.withMemoryRebound(to: sockaddr.self, capacity: 1) { (sp) throws(E) -> R in
            try body(UnsafePointer(sp), socklen_t(MemoryLayout<sockaddr_in>.size))
        }
    }

    static func == (a: SocketAddress, b: SocketAddress) -> Bool { a.ip == b.ip && a.port == b.port }
    func hash(into h: inout Hasher) { h.combine(ip); h.combine(port) }
}

/// An owned file descriptor; closed exactly once, in `close()` or `deinit`.
final class FileDescriptor: @unchecked Sendable { // fd is immutable after init; close() is guarded by an atomic-free single owner (the driver thread or deinit)
    let fd: Int32
    private var closed = false

    init(_ fd: Int32) { self.fd = fd }

    func close() {
        guard !closed else { return }
        closed = true
        _ = Glibc.close(fd)
    }

    deinit { close() }

    // MARK: Factories

    /// A non-blocking TCP listener on `host:port` (port 0 picks one).
    static func tcpListener(host: String, port: UInt16) throws(PeerMeshError) -> FileDescriptor {
        let s = FileDescriptor(try Sys.syscall("socket(TCP)") { socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0) })
        try Sys.setOption(s.fd, SOL_SOCKET, SO_REUSEADDR, 1)
        let addr = try SocketAddress(host: host, port: port)
        try addr.withSockaddr { (p, l) throws(PeerMeshError) in
            try Sys.syscall("bind(TCP \(host):\(port))") { bind(s.fd, p, l) }
        }
        try Sys.syscall("listen") { listen(s.fd, 64) }
        try Sys.setNonBlocking(s.fd)
        return s
    }

    /// A non-blocking UDP socket bound to `host:port`.
    static func udpSocket(host: String, port: UInt16) throws(PeerMeshError) -> FileDescriptor {
        let s = FileDescriptor(try Sys.syscall("socket(UDP)") { socket(AF_INET, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0) })
        // Audio bursts and fan-out: room for a few hundred datagrams each way.
        try? Sys.setOption(s.fd, SOL_SOCKET, SO_RCVBUF, 1 << 20)
        try? Sys.setOption(s.fd, SOL_SOCKET, SO_SNDBUF, 1 << 20)
        let addr = try SocketAddress(host: host, port: port)
        try addr.withSockaddr { (p, l) throws(PeerMeshError) in
            try Sys.syscall("bind(UDP \(host):\(port))") { bind(s.fd, p, l) }
        }
        try Sys.setNonBlocking(s.fd)
        return s
    }

    /// Starts a non-blocking TCP connect; completion is seen as writability.
    static func tcpConnect(to addr: SocketAddress) throws(PeerMeshError) -> FileDescriptor {
        let s = FileDescriptor(try Sys.syscall("socket(TCP)") { socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0) })
        try Sys.setNonBlocking(s.fd)
        try? Sys.setOption(s.fd, Int32(IPPROTO_TCP), TCP_NODELAY, 1)
        _ = try addr.withSockaddr { (p, l) throws(PeerMeshError) in
            try Sys.nonBlocking("connect(\(addr.host):\(addr.port))") { connect(s.fd, p, l) }
        }
        return s
    }

    /// Accepts one pending connection, or `nil` when none is waiting.
    func accept() throws(PeerMeshError) -> (FileDescriptor, SocketAddress)? {
        var a = sockaddr_in()
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        let r = try withUnsafeMutablePointer(to: &a) { p throws(PeerMeshError) in
            try p.withMemoryRebound(to: sockaddr.self, capacity: 1) { sp throws(PeerMeshError) in
                try Sys.nonBlocking("accept") { Glibc.accept(fd, sp, &len) }
            }
        }
        guard let r else { return nil }
        let c = FileDescriptor(r)
        _ = fcntl(r, F_SETFD, FD_CLOEXEC)
        try Sys.setNonBlocking(r)
        try? Sys.setOption(c.fd, Int32(IPPROTO_TCP), TCP_NODELAY, 1)
        return (c, SocketAddress(a))
    }

    /// The locally bound address.
    func localAddress() throws(PeerMeshError) -> SocketAddress {
        var a = sockaddr_in()
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        try withUnsafeMutablePointer(to: &a) { p throws(PeerMeshError) in
            try p.withMemoryRebound(to: sockaddr.self, capacity: 1) { sp throws(PeerMeshError) in
                try Sys.syscall("getsockname") { getsockname(fd, sp, &len) }
            }
        }
        return SocketAddress(a)
    }

    /// The connected peer's address.
    func peerAddress() -> SocketAddress? {
        var a = sockaddr_in()
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        let r = withUnsafeMutablePointer(to: &a) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(fd, $0, &len) }
        }
        return r == 0 ? SocketAddress(a) : nil
    }

    /// The pending socket error (SO_ERROR), 0 when none.
    func pendingError() -> Int32 {
        var e: Int32 = 0
        var len = socklen_t(MemoryLayout<Int32>.size)
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len)
        return e
    }
}

/// Wakes a thread blocked in `poll`: a non-blocking self-pipe.
final class Waker: Sendable {
    /// The end to poll for readability.
    let fd: Int32
    private let writeFD: Int32

    init() throws(PeerMeshError) {
        var fds: [Int32] = [0, 0]
        try Sys.syscall("pipe") { pipe(&fds) }
        for f in fds {
            _ = fcntl(f, F_SETFD, FD_CLOEXEC)
            try Sys.setNonBlocking(f)
        }
        fd = fds[0]
        writeFD = fds[1]
    }

    func wake() {
        var one: UInt8 = 1
        _ = write(writeFD, &one, 1)
    }

    func drain() {
        var buf = (UInt64(0), UInt64(0), UInt64(0), UInt64(0))
        while withUnsafeMutableBytes(of: &buf, { read(fd, $0.baseAddress, $0.count) }) > 0 {}
    }

    deinit {
        close(fd)
        close(writeFD)
    }
}

/// Monotonic time in nanoseconds (`CLOCK_MONOTONIC`).
func monotonicNanos() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
}
