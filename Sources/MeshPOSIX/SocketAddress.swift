#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import CLinux

/// An IPv4 or IPv6 socket address (numeric host and port; IPv6 with its scope id).
///
/// Addresses that arrive as IPv4-mapped IPv6 (`::ffff:a.b.c.d`, from a dual-stack socket) are normalized to IPv4,
/// so one peer has one address whichever socket saw it. Equality and hashing cover the address, port and scope.
package struct SocketAddress: Hashable, Sendable, CustomStringConvertible {
    /// The address family.
    package enum Family: Sendable, Equatable {
        case v4, v6

        /// `AF_INET` or `AF_INET6`.
        package var domain: Int32 { self == .v4 ? AF_INET : AF_INET6 }
    }

    private enum Raw: Sendable {
        case v4(sockaddr_in)
        case v6(sockaddr_in6)
    }

    private var raw: Raw

    /// An IPv4 address.
    package init(_ v4: sockaddr_in) { raw = .v4(v4) }

    /// An IPv6 address (normalized to IPv4 when it is IPv4-mapped).
    package init(_ v6: sockaddr_in6) {
        // No array: this runs for every datagram a dual-stack socket receives (real-time threads included).
        let mapped = withUnsafeBytes(of: v6.sin6_addr) { b in b[0..<10].allSatisfy { $0 == 0 } && b[10] == 0xff && b[11] == 0xff }
        if mapped {
            let b = withUnsafeBytes(of: v6.sin6_addr) { ($0[12], $0[13], $0[14], $0[15]) }
            var v4 = sockaddr_in()
            v4.sin_family = sa_family_t(AF_INET)
            v4.sin_port = v6.sin6_port
            v4.sin_addr.s_addr = UInt32(b.0) | UInt32(b.1) << 8 | UInt32(b.2) << 16 | UInt32(b.3) << 24
            raw = .v4(v4)
        } else {
            raw = .v6(v6)
        }
    }

    /// Parses a numeric host: `a.b.c.d`, or an IPv6 literal with an optional `%scope` (`fe80::1%eth0`), with or
    /// without brackets. `nil` when it is not a numeric address (names need `resolve`).
    package init?(numericHost host: String, port: UInt16) {
        var h = Substring(host)
        if h.hasPrefix("["), h.hasSuffix("]") { h = h.dropFirst().dropLast() }
        var v4 = sockaddr_in()
        if inet_pton(AF_INET, String(h), &v4.sin_addr) == 1 {
            v4.sin_family = sa_family_t(AF_INET)
            v4.sin_port = port.bigEndian
            self = SocketAddress(v4)
            return
        }
        var scope: UInt32 = 0
        if let pct = h.firstIndex(of: "%") {
            let name = String(h[h.index(after: pct)...])
            h = h[..<pct]
            if let n = UInt32(name) { scope = n } else {
                scope = if_nametoindex(name)
                guard scope != 0 else { return nil }
            }
        }
        var v6 = sockaddr_in6()
        guard inet_pton(AF_INET6, String(h), &v6.sin6_addr) == 1 else { return nil }
        v6.sin6_family = sa_family_t(AF_INET6)
        v6.sin6_port = port.bigEndian
        v6.sin6_scope_id = scope
        self = SocketAddress(v6)
    }

    /// Reads a `sockaddr` the kernel filled in (`recvfrom`, `accept`, `getsockname`). `nil` for other families.
    package init?(_ p: UnsafeRawPointer, length: socklen_t) {
        let family = Int32(p.load(as: sockaddr.self).sa_family)
        if family == AF_INET, Int(length) >= MemoryLayout<sockaddr_in>.size {
            self = SocketAddress(p.loadUnaligned(as: sockaddr_in.self))
        } else if family == AF_INET6, Int(length) >= MemoryLayout<sockaddr_in6>.size {
            self = SocketAddress(p.loadUnaligned(as: sockaddr_in6.self))
        } else {
            return nil
        }
    }

    /// Parses a bind address: a numeric host, or `""`/`"*"` for every address — dual-stack `::` (IPv4 arrives
    /// IPv4-mapped) where the system has IPv6, else `0.0.0.0`.
    package static func bindAddress(_ host: String, port: UInt16) -> SocketAddress? {
        if host.isEmpty || host == "*" { return ipv6Available ? .any(.v6, port: port) : .any(.v4, port: port) }
        return SocketAddress(numericHost: host, port: port)
    }

    /// Whether the kernel has IPv6 (an IPv6 socket can be made).
    package static let ipv6Available: Bool = {
        let fd = socket(AF_INET6, Int32(SOCK_DGRAM.rawValue), 0)
        guard fd >= 0 else { return false }
        close(fd)
        return true
    }()

    /// The unspecified address of `family` (`0.0.0.0` or `::`) at `port`.
    package static func any(_ family: Family, port: UInt16) -> SocketAddress {
        family == .v4 ? SocketAddress(numericHost: "0.0.0.0", port: port)! : SocketAddress(numericHost: "::", port: port)!
    }

    package var family: Family { if case .v4 = raw { .v4 } else { .v6 } }

    package var port: UInt16 {
        get {
            switch raw {
            case .v4(let a): UInt16(bigEndian: a.sin_port)
            case .v6(let a): UInt16(bigEndian: a.sin6_port)
            }
        }
        set {
            switch raw {
            case .v4(var a): a.sin_port = newValue.bigEndian; raw = .v4(a)
            case .v6(var a): a.sin6_port = newValue.bigEndian; raw = .v6(a)
            }
        }
    }

    /// The address with another port.
    package func with(port: UInt16) -> SocketAddress {
        var a = self
        a.port = port
        return a
    }

    /// The IPv6 scope id (interface index), 0 for IPv4 and global addresses.
    package var scopeID: UInt32 { if case .v6(let a) = raw { a.sin6_scope_id } else { 0 } }

    /// The host part's bytes: 4 for IPv4, 16 for IPv6.
    package var hostBytes: [UInt8] {
        switch raw {
        case .v4(let a): withUnsafeBytes(of: a.sin_addr) { Array($0) }
        case .v6(let a): Self.bytes(of: a.sin6_addr)
        }
    }

    /// Whether `other` has the same host (address and scope), whatever the port.
    package func sameHost(as other: SocketAddress) -> Bool {
        switch (raw, other.raw) {
        case (.v4(let a), .v4(let b)): a.sin_addr.s_addr == b.sin_addr.s_addr
        case (.v6(let a), .v6(let b)):
            a.sin6_scope_id == b.sin6_scope_id
                && withUnsafeBytes(of: a.sin6_addr) { x in withUnsafeBytes(of: b.sin6_addr) { y in x.elementsEqual(y) } }
        default: false
        }
    }

    /// Loopback (`127/8` or `::1`).
    package var isLoopback: Bool {
        let b = hostBytes
        return b.count == 4 ? b[0] == 127 : (b[0..<15].allSatisfy { $0 == 0 } && b[15] == 1)
    }

    /// The numeric host, e.g. `127.0.0.1` or `fe80::1%2` (scope as an interface name when it has one).
    package var host: String {
        var buf = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN) + 1)
        switch raw {
        case .v4(var a):
            inet_ntop(AF_INET, &a.sin_addr, &buf, socklen_t(buf.count))
            return Self.string(buf)
        case .v6(var a):
            inet_ntop(AF_INET6, &a.sin6_addr, &buf, socklen_t(buf.count))
            var s = Self.string(buf)
            if a.sin6_scope_id != 0 {
                var name = [CChar](repeating: 0, count: Int(IF_NAMESIZE) + 1)
                s += "%" + (if_indextoname(a.sin6_scope_id, &name) != nil ? Self.string(name) : String(a.sin6_scope_id))
            }
            return s
        }
    }

    /// `1.2.3.4:5` or `[::1]:5`.
    package var description: String { family == .v4 ? "\(host):\(port)" : "[\(host)]:\(port)" }

    /// Calls `body` with a `sockaddr` for a socket of family `socketFamily`: an IPv4 address given to an IPv6
    /// (dual-stack) socket is passed IPv4-mapped.
    package func withSockaddr<R, E: Error>(for socketFamily: Family? = nil,
                                           _ body: (UnsafePointer<sockaddr>, socklen_t) throws(E) -> R) throws(E) -> R {
        switch raw {
        case .v4(let a) where socketFamily == .v6:
            var m = sockaddr_in6()
            m.sin6_family = sa_family_t(AF_INET6)
            m.sin6_port = a.sin_port
            withUnsafeMutableBytes(of: &m.sin6_addr) { b in
                b[10] = 0xff; b[11] = 0xff
                withUnsafeBytes(of: a.sin_addr) { v4 in for i in 0..<4 { b[12 + i] = v4[i] } }
            }
            return try Self.with(m, body)
        case .v4(let a): return try Self.with(a, body)
        case .v6(let a): return try Self.with(a, body)
        }
    }

    private static func with<S, R, E: Error>(_ value: S, _ body: (UnsafePointer<sockaddr>, socklen_t) throws(E) -> R) throws(E) -> R {
        var v = value
        return try withUnsafeBytes(of: &v) { (raw) throws(E) -> R in
            try body(raw.baseAddress!.assumingMemoryBound(to: sockaddr.self), socklen_t(MemoryLayout<S>.size))
        }
    }

    private static func bytes(of a: in6_addr) -> [UInt8] { withUnsafeBytes(of: a) { Array($0) } }

    private static func string(_ buf: [CChar]) -> String {
        String(decoding: buf.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    package static func == (a: SocketAddress, b: SocketAddress) -> Bool { a.sameHost(as: b) && a.port == b.port }

    package func hash(into h: inout Hasher) {
        switch raw {
        case .v4(let a): withUnsafeBytes(of: a.sin_addr) { h.combine(bytes: $0) }
        case .v6(let a): withUnsafeBytes(of: a.sin6_addr) { h.combine(bytes: $0) }
        }
        h.combine(port)
        h.combine(scopeID)
    }
}

/// Why a host name could not be turned into addresses.
package struct ResolveError: Error, Equatable, Sendable, CustomStringConvertible {
    package let host: String
    package let text: String
    /// Whether trying again later could help (`EAI_AGAIN`): a name that does not exist is permanent.
    package let isTemporary: Bool
    package var description: String { "cannot resolve \"\(host)\": \(text)" }
}

extension SocketAddress {
    /// Resolves `host` (a numeric address, `/etc/hosts`, DNS, or mDNS `.local` through nss-mdns where installed)
    /// with `getaddrinfo`. Numeric hosts never touch the resolver. IPv4 results come first.
    package static func resolve(host: String, port: UInt16) throws(ResolveError) -> [SocketAddress] {
        if let numeric = SocketAddress(numericHost: host, port: port) { return [numeric] }
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var list: UnsafeMutablePointer<addrinfo>?
        let rc = getaddrinfo(host, String(port), &hints, &list)
        guard rc == 0 else {
            let text = rc == EAI_SYSTEM ? Sys.errorText(errno) : String(cString: gai_strerror(rc))
            throw ResolveError(host: host, text: text, isTemporary: rc == EAI_AGAIN)
        }
        defer { freeaddrinfo(list) }
        var out: [SocketAddress] = []
        var node = list
        while let n = node {
            if let a = n.pointee.ai_addr, let s = SocketAddress(UnsafeRawPointer(a), length: n.pointee.ai_addrlen),
               !out.contains(s) {
                out.append(s)
            }
            node = n.pointee.ai_next
        }
        guard !out.isEmpty else { throw ResolveError(host: host, text: "no addresses", isTemporary: false) }
        return out.filter { $0.family == .v4 } + out.filter { $0.family == .v6 }
    }
}

extension SocketAddress {
    /// The addresses of this machine's interfaces that are up (`getifaddrs`), with `port`: IPv4 first, then IPv6
    /// (link-local ones with their scope id); loopback last.
    /// Whether this is an IPv6 link-local address (fe80::/10), meaningful only with its interface.
    package var isLinkLocalV6: Bool {
        guard case .v6(var a) = raw else { return false }
        return withUnsafeBytes(of: &a.sin6_addr) { $0[0] == 0xfe && ($0[1] & 0xc0) == 0x80 }
    }

    package static func localInterfaceAddresses(port: UInt16) -> [SocketAddress] {
        var list: UnsafeMutablePointer<ifaddrs>?
        guard getifaddrs(&list) == 0 else { return [] }
        defer { freeifaddrs(list) }
        var out: [SocketAddress] = []
        var node = list
        while let n = node {
            defer { node = n.pointee.ifa_next }
            guard n.pointee.ifa_flags & UInt32(IFF_UP) != 0, let a = n.pointee.ifa_addr else { continue }
            let family = Int32(a.pointee.sa_family)
            guard family == AF_INET || family == AF_INET6 else { continue }
            let length = socklen_t(family == AF_INET ? MemoryLayout<sockaddr_in>.size : MemoryLayout<sockaddr_in6>.size)
            guard var s = SocketAddress(UnsafeRawPointer(a), length: length), !out.contains(s) else { continue }
            s.port = port
            out.append(s)
        }
        let remote = out.filter { !$0.isLoopback }
        return remote.filter { $0.family == .v4 } + remote.filter { $0.family == .v6 } + out.filter(\.isLoopback)
    }
}
