#if canImport(Glibc)
import Glibc
#endif

/// The one place the impairment proxy calls the socket API: a negative return becomes
/// `ImpairmentError.system` with the call's name and `strerror` text; EINTR is retried.
enum ProxySys {
    @discardableResult
    static func call<T: BinaryInteger>(_ what: @autoclosure () -> String, _ body: () -> T) throws(ImpairmentError) -> T {
        while true {
            let r = body()
            if r >= 0 { return r }
            let e = errno
            if e == EINTR { continue }
            throw .system("\(what()): \(errorText(e))")
        }
    }

    /// Like `call`, but "would block" comes back as `nil`.
    static func nonBlocking<T: BinaryInteger>(_ what: @autoclosure () -> String, _ body: () -> T) throws(ImpairmentError) -> T? {
        while true {
            let r = body()
            if r >= 0 { return r }
            let e = errno
            if e == EINTR { continue }
            if e == EAGAIN || e == EWOULDBLOCK || e == EINPROGRESS { return nil }
            throw .system("\(what()): \(errorText(e))")
        }
    }

    static func errorText(_ e: Int32) -> String { String(cString: strerror(e)) }

    static func setOption(_ fd: Int32, _ level: Int32, _ name: Int32, _ value: Int32) {
        var v = value
        _ = setsockopt(fd, level, name, &v, socklen_t(MemoryLayout<Int32>.size))
    }
}

/// An IPv4 socket address, hashable by address and port.
struct ProxyAddress: Hashable, Sendable {
    var raw: sockaddr_in

    init(_ raw: sockaddr_in) { self.raw = raw }

    init(_ e: ImpairmentProxy.Endpoint) throws(ImpairmentError) {
        var a = sockaddr_in()
        a.sin_family = sa_family_t(AF_INET)
        a.sin_port = e.port.bigEndian
        a.sin_addr.s_addr = try e.ipv4().bigEndian
        raw = a
    }

    var port: UInt16 { UInt16(bigEndian: raw.sin_port) }

    func withSockaddr<R, E: Error>(_ body: (UnsafePointer<sockaddr>, socklen_t) throws(E) -> R) throws(E) -> R {
        let p = UnsafeMutablePointer<sockaddr_in>.allocate(capacity: 1)
        defer { p.deallocate() }
        p.initialize(to: raw)
        return try p.withMemoryRebound(to: sockaddr.self, capacity: 1) { (sp) throws(E) -> R in
            try body(UnsafePointer(sp), socklen_t(MemoryLayout<sockaddr_in>.size))
        }
    }

    static func == (a: ProxyAddress, b: ProxyAddress) -> Bool {
        a.raw.sin_addr.s_addr == b.raw.sin_addr.s_addr && a.raw.sin_port == b.raw.sin_port
    }

    func hash(into h: inout Hasher) { h.combine(raw.sin_addr.s_addr); h.combine(raw.sin_port) }
}

/// An owned socket or pipe end, closed exactly once in `deinit`. Immutable, so it can be shared: datagrams
/// waiting in the delay queue keep their socket open until they are sent or discarded.
final class ProxySocket: Sendable {
    let fd: Int32

    init(_ fd: Int32) { self.fd = fd }

    deinit { _ = Glibc.close(fd) }

    private static func make(_ type: Int32, _ what: String) throws(ImpairmentError) -> ProxySocket {
        let s = ProxySocket(try ProxySys.call("socket(\(what))") {
            socket(AF_INET, type | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        })
        return s
    }

    /// A non-blocking UDP socket bound to `address` with 4 MB buffers (capped by the kernel).
    static func udp(bind address: ProxyAddress) throws(ImpairmentError) -> ProxySocket {
        let s = try make(Int32(SOCK_DGRAM.rawValue), "UDP")
        ProxySys.setOption(s.fd, SOL_SOCKET, SO_RCVBUF, 4 << 20)
        ProxySys.setOption(s.fd, SOL_SOCKET, SO_SNDBUF, 4 << 20)
        _ = try address.withSockaddr { (p, l) throws(ImpairmentError) in
            try ProxySys.call("bind(UDP port \(address.port))") { bind(s.fd, p, l) }
        }
        return s
    }

    /// A non-blocking UDP socket connected to `target` (an ephemeral loopback port, chosen by the kernel).
    static func udp(connect target: ProxyAddress) throws(ImpairmentError) -> ProxySocket {
        let s = try make(Int32(SOCK_DGRAM.rawValue), "UDP")
        ProxySys.setOption(s.fd, SOL_SOCKET, SO_RCVBUF, 4 << 20)
        ProxySys.setOption(s.fd, SOL_SOCKET, SO_SNDBUF, 4 << 20)
        _ = try target.withSockaddr { (p, l) throws(ImpairmentError) in
            try ProxySys.call("connect(UDP port \(target.port))") { connect(s.fd, p, l) }
        }
        return s
    }

    /// A non-blocking TCP listener.
    static func tcpListener(bind address: ProxyAddress) throws(ImpairmentError) -> ProxySocket {
        let s = try make(Int32(SOCK_STREAM.rawValue), "TCP")
        ProxySys.setOption(s.fd, SOL_SOCKET, SO_REUSEADDR, 1)
        _ = try address.withSockaddr { (p, l) throws(ImpairmentError) in
            try ProxySys.call("bind(TCP port \(address.port))") { bind(s.fd, p, l) }
        }
        try ProxySys.call("listen") { listen(s.fd, 64) }
        return s
    }

    /// Starts a non-blocking TCP connect; completion shows as writability (check `pendingError`).
    static func tcpConnect(to target: ProxyAddress) throws(ImpairmentError) -> ProxySocket {
        let s = try make(Int32(SOCK_STREAM.rawValue), "TCP")
        ProxySys.setOption(s.fd, Int32(IPPROTO_TCP), TCP_NODELAY, 1)
        _ = try target.withSockaddr { (p, l) throws(ImpairmentError) in
            try ProxySys.nonBlocking("connect(TCP port \(target.port))") { connect(s.fd, p, l) }
        }
        return s
    }

    /// Accepts one pending connection (non-blocking), or `nil` when none waits.
    func accept() throws(ImpairmentError) -> ProxySocket? {
        guard let fd = try ProxySys.nonBlocking("accept", { Glibc.accept(self.fd, nil, nil) }) else { return nil }
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        ProxySys.setOption(fd, Int32(IPPROTO_TCP), TCP_NODELAY, 1)
        return ProxySocket(fd)
    }

    func localAddress() throws(ImpairmentError) -> ProxyAddress {
        var a = sockaddr_in()
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = try withUnsafeMutablePointer(to: &a) { p throws(ImpairmentError) in
            try p.withMemoryRebound(to: sockaddr.self, capacity: 1) { sp throws(ImpairmentError) in
                try ProxySys.call("getsockname") { getsockname(fd, sp, &len) }
            }
        }
        return ProxyAddress(a)
    }

    func pendingError() -> Int32 {
        var e: Int32 = 0
        var len = socklen_t(MemoryLayout<Int32>.size)
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len)
        return e
    }
}

/// Wakes a thread blocked in `poll`: a non-blocking self-pipe.
final class ProxyWaker: Sendable {
    let readEnd: ProxySocket
    private let writeEnd: ProxySocket

    init() throws(ImpairmentError) {
        var fds: [Int32] = [0, 0]
        try ProxySys.call("pipe") { pipe(&fds) }
        for f in fds {
            _ = fcntl(f, F_SETFD, FD_CLOEXEC)
            _ = fcntl(f, F_SETFL, fcntl(f, F_GETFL) | O_NONBLOCK)
        }
        readEnd = ProxySocket(fds[0])
        writeEnd = ProxySocket(fds[1])
    }

    func wake() {
        var b: UInt8 = 1
        _ = write(writeEnd.fd, &b, 1)
    }

    func drain() {
        var buf = [UInt8](repeating: 0, count: 64)
        while read(readEnd.fd, &buf, buf.count) > 0 {}
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds.
func proxyNowNanos() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) &* 1_000_000_000 &+ UInt64(ts.tv_nsec)
}
