#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import Synchronization
import CLinux

/// An owned file descriptor, closed exactly once: by `close()` (from any thread) or by `deinit`.
///
/// The close is an atomic exchange, so two threads racing to close (the I/O loop and a `stop()`) never close the
/// number twice — which could close a descriptor some other part of the process has been handed meanwhile.
package final class FileDescriptor: Sendable {
    /// The descriptor number. Valid until `close()`.
    package let fd: Int32
    /// The socket's address family, when it is a socket this type made.
    package let family: SocketAddress.Family?
    private let closed = Atomic<Bool>(false)

    package init(_ fd: Int32, family: SocketAddress.Family? = nil) {
        self.fd = fd
        self.family = family
    }

    /// Closes the descriptor; later calls do nothing.
    package func close() {
        guard !closed.exchange(true, ordering: .acquiringAndReleasing) else { return }
        _ = Glibc.close(fd)
    }

    /// Whether `close()` has run.
    package var isClosed: Bool { closed.load(ordering: .acquiring) }

    deinit { close() }

    // MARK: Sockets

    private static func socket(_ family: SocketAddress.Family, _ type: __socket_type, _ what: String) throws(SyscallError) -> FileDescriptor {
        let fd = try Sys.call("socket(\(what))") {
            Glibc.socket(family.domain, Int32(type.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        }
        let s = FileDescriptor(fd, family: family)
        if family == .v6 {
            // Dual stack: an IPv6 socket bound to `::` also takes IPv4 (as IPv4-mapped addresses).
            try? Sys.setOption(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, 0)
        }
        return s
    }

    /// A non-blocking TCP listener on `address` (port 0 picks one), with a backlog of `backlog`.
    package static func tcpListener(_ address: SocketAddress, backlog: Int32 = 128) throws(SyscallError) -> FileDescriptor {
        let s = try socket(address.family, SOCK_STREAM, "TCP")
        try Sys.setOption(s.fd, SOL_SOCKET, SO_REUSEADDR, 1)
        _ = try address.withSockaddr { (p, l) throws(SyscallError) in
            try Sys.call("bind(TCP \(address))") { bind(s.fd, p, l) }
        }
        try Sys.call("listen(\(address))") { listen(s.fd, backlog) }
        return s
    }

    /// A non-blocking UDP socket bound to `address`, with `buffer` bytes of send and receive buffer.
    package static func udpSocket(_ address: SocketAddress, buffer: Int32 = 1 << 20) throws(SyscallError) -> FileDescriptor {
        let s = try udp(address.family, buffer: buffer)
        _ = try address.withSockaddr { (p, l) throws(SyscallError) in
            try Sys.call("bind(UDP \(address))") { bind(s.fd, p, l) }
        }
        return s
    }

    /// A non-blocking UDP socket connected to `target` (from an ephemeral port).
    package static func udpConnected(to target: SocketAddress, buffer: Int32 = 1 << 20) throws(SyscallError) -> FileDescriptor {
        let s = try udp(target.family, buffer: buffer)
        _ = try target.withSockaddr { (p, l) throws(SyscallError) in
            try Sys.call("connect(UDP \(target))") { connect(s.fd, p, l) }
        }
        return s
    }

    /// A non-blocking UDP socket of `family` with `buffer` bytes of send and receive buffer (best effort: the
    /// kernel caps it at `net.core.[rw]mem_max`).
    private static func udp(_ family: SocketAddress.Family, buffer: Int32) throws(SyscallError) -> FileDescriptor {
        let s = try socket(family, SOCK_DGRAM, "UDP")
        try? Sys.setOption(s.fd, SOL_SOCKET, SO_RCVBUF, buffer)
        try? Sys.setOption(s.fd, SOL_SOCKET, SO_SNDBUF, buffer)
        return s
    }

    /// Starts a non-blocking TCP connect to `target` (from `source`'s address, when given and of the same family);
    /// completion shows as writability (then check `pendingError`).
    package static func tcpConnect(to target: SocketAddress, from source: SocketAddress? = nil) throws(SyscallError) -> FileDescriptor {
        let s = try socket(target.family, SOCK_STREAM, "TCP")
        try? Sys.setOption(s.fd, Int32(IPPROTO_TCP), TCP_NODELAY, 1)
        if let source, source.family == target.family, !source.hostBytes.allSatisfy({ $0 == 0 }) {
            _ = try source.with(port: 0).withSockaddr { (p, l) throws(SyscallError) in
                try Sys.call("bind(TCP \(source.host))") { bind(s.fd, p, l) }
            }
        }
        _ = try target.withSockaddr { (p, l) throws(SyscallError) in
            try Sys.nonBlocking("connect(\(target))") { connect(s.fd, p, l) }
        }
        return s
    }

    /// A connected pair of non-blocking, close-on-exec Unix stream sockets: a byte pipe both ways that looks like a
    /// TCP connection to whoever reads and writes it (a relayed PeerMesh link runs its connection over one).
    package static func streamPair() throws(SyscallError) -> (FileDescriptor, FileDescriptor) {
        var fds: [Int32] = [-1, -1]
        _ = try Sys.call("socketpair(AF_UNIX)") {
            socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue),
                       0, &fds)
        }
        return (FileDescriptor(fds[0]), FileDescriptor(fds[1]))
    }

    /// What one non-blocking read or write of a stream socket did.
    package enum StreamIO: Equatable, Sendable {
        /// This many bytes moved (never 0).
        case moved(Int)
        /// Nothing now: wait for readiness.
        case wouldBlock
        /// The other end closed (reads only).
        case endOfStream
        /// The socket failed; the system's text.
        case failed(String)
    }

    /// Reads what is there, up to `buffer.count` bytes, retrying on EINTR.
    package func readSome(into buffer: UnsafeMutableRawBufferPointer) -> StreamIO {
        while true {
            let n = recv(fd, buffer.baseAddress, buffer.count, 0)
            if n > 0 { return .moved(n) }
            if n == 0 { return .endOfStream }
            if errno == EINTR { continue }
            if errno == EAGAIN || errno == EWOULDBLOCK { return .wouldBlock }
            return .failed(Sys.errorText(errno))
        }
    }

    /// Writes what the socket takes of `bytes` now, retrying on EINTR; never raises SIGPIPE.
    package func writeSome(_ bytes: UnsafeRawBufferPointer) -> StreamIO {
        while true {
            let n = Glibc.send(fd, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL))
            if n > 0 { return .moved(n) }
            if n < 0, errno == EINTR { continue }
            if n < 0, errno == EAGAIN || errno == EWOULDBLOCK { return .wouldBlock }
            return .failed(Sys.errorText(n < 0 ? errno : EPIPE))
        }
    }

    /// Accepts one pending connection (non-blocking, close-on-exec, `TCP_NODELAY`), or `nil` when none waits.
    package func accept() throws(SyscallError) -> (FileDescriptor, SocketAddress?)? {
        var storage = sockaddr_storage()
        var len = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let r = try withUnsafeMutableBytes(of: &storage) { (raw) throws(SyscallError) -> Int32? in
            try Sys.nonBlocking("accept") {
                accept4(fd, raw.baseAddress!.assumingMemoryBound(to: sockaddr.self), &len,
                        Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue))
            }
        }
        guard let r else { return nil }
        let c = FileDescriptor(r, family: family)
        try? Sys.setOption(r, Int32(IPPROTO_TCP), TCP_NODELAY, 1)
        let remote = withUnsafeBytes(of: &storage) { SocketAddress($0.baseAddress!, length: len) }
        return (c, remote)
    }

    /// The locally bound address.
    package func localAddress() throws(SyscallError) -> SocketAddress {
        var storage = sockaddr_storage()
        var len = socklen_t(MemoryLayout<sockaddr_storage>.size)
        _ = try withUnsafeMutableBytes(of: &storage) { (raw) throws(SyscallError) in
            try Sys.call("getsockname") { getsockname(fd, raw.baseAddress!.assumingMemoryBound(to: sockaddr.self), &len) }
        }
        guard let a = withUnsafeBytes(of: &storage, { SocketAddress($0.baseAddress!, length: len) }) else {
            throw SyscallError(call: "getsockname", code: EAFNOSUPPORT)
        }
        return a
    }

    /// The connected peer's address, or `nil`.
    package func peerAddress() -> SocketAddress? {
        var storage = sockaddr_storage()
        var len = socklen_t(MemoryLayout<sockaddr_storage>.size)
        return withUnsafeMutableBytes(of: &storage) { raw -> SocketAddress? in
            guard getpeername(fd, raw.baseAddress!.assumingMemoryBound(to: sockaddr.self), &len) == 0 else { return nil }
            return SocketAddress(raw.baseAddress!, length: len)
        }
    }

    /// The pending socket error (`SO_ERROR`), 0 when none.
    package func pendingError() -> Int32 {
        var e: Int32 = 0
        var len = socklen_t(MemoryLayout<Int32>.size)
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len)
        return e
    }

    /// Sends one datagram to `address` (mapped for a dual-stack socket). Returns bytes sent or -1 (errno set).
    @inline(__always)
    package func send(_ bytes: UnsafeRawBufferPointer, to address: SocketAddress) -> Int {
        address.withSockaddr(for: family) { sa, len in sendto(fd, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL), sa, len) }
    }

    /// Receives one datagram into `buffer` without blocking: its length and source, or `nil` when none waits.
    @inline(__always)
    package func receive(into buffer: UnsafeMutableRawBufferPointer) -> (Int, SocketAddress?)? {
        var storage = sockaddr_storage()
        var len = socklen_t(MemoryLayout<sockaddr_storage>.size)
        while true {
            let n = withUnsafeMutableBytes(of: &storage) { raw in
                recvfrom(fd, buffer.baseAddress, buffer.count, Int32(MSG_DONTWAIT),
                         raw.baseAddress!.assumingMemoryBound(to: sockaddr.self), &len)
            }
            if n >= 0 { return (n, withUnsafeBytes(of: &storage) { SocketAddress($0.baseAddress!, length: len) }) }
            if errno == EINTR { continue }
            return nil
        }
    }
}
