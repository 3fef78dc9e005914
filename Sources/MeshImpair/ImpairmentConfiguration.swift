#if canImport(Glibc)
import Glibc
#endif
import MeshPOSIX

/// Why the impairment proxy refused a configuration, a command line or a socket operation.
public enum ImpairmentError: Error, Equatable, Sendable, CustomStringConvertible {
    /// `role` ("listen" or "target") names an address outside what the project's network rule allows.
    case addressNotAllowed(role: String, address: String)
    /// A configuration value is out of range or malformed.
    case invalidArgument(String)
    /// A socket call failed; carries the call and the `strerror` text.
    case system(String)

    init(_ e: SyscallError) { self = .system(e.description) }

    /// Addresses the proxy may bind to or forward to: the project's network rule.
    public static let networkRule =
        "only 127.0.0.0/8 (loopback) and 198.18.0.0/15 (the project's test namespaces) are allowed (project network rule: traffic only to loopback or the project's own namespaces)"

    public var description: String {
        switch self {
        case .addressNotAllowed(let role, let address): "\(role) address \(address) refused: \(Self.networkRule)"
        case .invalidArgument(let s): s
        case .system(let s): s
        }
    }
}

extension ImpairmentProxy {
    /// A numeric IPv4 host and a port. `localhost` is accepted as 127.0.0.1.
    public struct Endpoint: Hashable, Sendable, CustomStringConvertible {
        /// The numeric IPv4 host.
        public var host: String
        /// The port (0 to listen on a free one).
        public var port: UInt16

        /// `host` (`localhost` becomes 127.0.0.1) and `port`.
        public init(host: String, port: UInt16) {
            self.host = host == "localhost" ? "127.0.0.1" : host
            self.port = port
        }

        /// Parses `HOST:PORT` (IPv4, numeric or `localhost`).
        public init(parsing text: String) throws(ImpairmentError) {
            guard let colon = text.lastIndex(of: ":"), let port = UInt16(text[text.index(after: colon)...]) else {
                throw .invalidArgument("\"\(text)\" is not HOST:PORT (for example 127.0.0.1:7000)")
            }
            self.init(host: String(text[..<colon]), port: port)
            _ = try ipv4()
        }

        public var description: String { "\(host):\(port)" }

        /// The address in host byte order.
        func ipv4() throws(ImpairmentError) -> UInt32 {
            var a = in_addr()
            guard inet_pton(AF_INET, host, &a) == 1 else {
                throw .invalidArgument("\"\(host)\" is not a numeric IPv4 address")
            }
            return UInt32(bigEndian: a.s_addr)
        }

        /// The socket address.
        func socketAddress() throws(ImpairmentError) -> SocketAddress {
            guard let a = SocketAddress(numericHost: host, port: port), a.family == .v4 else {
                throw .invalidArgument("\"\(host)\" is not a numeric IPv4 address")
            }
            return a
        }

        /// Whether the host is in 127.0.0.0/8 or 198.18.0.0/15.
        func isAllowed() throws(ImpairmentError) -> Bool {
            let ip = try ipv4()
            return ip & 0xff00_0000 == 0x7f00_0000 || ip & 0xfffe_0000 == 0xc612_0000
        }
    }

    /// Which direction the impairments apply to; the other direction is forwarded clean.
    public enum Direction: String, Sendable, CaseIterable {
        /// Both directions are impaired (each with its own random stream).
        case both
        /// Only client → target datagrams are impaired.
        case toTarget = "to-target"
        /// Only target → client datagrams are impaired.
        case fromTarget = "from-target"
    }

    /// What the proxy listens on, where it forwards, and how it damages UDP traffic.
    ///
    /// Per datagram in an impaired direction, four uniform draws are taken from that direction's seeded stream
    /// (loss, duplicate, reorder, jitter), whatever the outcome, so the drop pattern depends only on the seed and
    /// the datagram's position. Added delay is `delay + U(-jitter, +jitter)`, clamped at 0 (uniform jitter).
    /// A reordered datagram is held back until the next datagram of the same client and direction has been
    /// scheduled, then sent right after it; when none comes within `reorderHoldMilliseconds` it is sent alone
    /// (and not counted as reordered). A duplicate is an extra copy sent right after the original.
    public struct Configuration: Sendable, Equatable {
        /// Where to listen for UDP and TCP (same port number); port 0 picks a free one.
        public var listen: Endpoint
        /// Where to forward UDP and TCP (same port number).
        public var target: Endpoint
        /// Seed of the impairment's random choices: the same seed and the same input give the same impairments.
        public var seed: UInt64
        /// Probability (0–1) a datagram is dropped.
        public var loss: Double
        /// Probability (0–1) a datagram is sent twice.
        public var duplicate: Double
        /// Probability (0–1) a datagram is held back and sent after the next one.
        public var reorder: Double
        /// Delay added to every datagram.
        public var delayMilliseconds: Double
        /// Half-width of the uniform jitter around `delayMilliseconds`.
        public var jitterMilliseconds: Double
        /// Which datagrams are impaired: both ways, or one way (the other passes clean).
        public var direction: Direction
        /// Longest a reordered datagram waits for a successor.
        public var reorderHoldMilliseconds: Double
        /// A UDP client silent this long loses its session (and upstream socket).
        public var udpSessionIdleSeconds: Double

        public init(listen: Endpoint = Endpoint(host: "127.0.0.1", port: 0), target: Endpoint, seed: UInt64 = 1,
                    loss: Double = 0, duplicate: Double = 0, reorder: Double = 0,
                    delayMilliseconds: Double = 0, jitterMilliseconds: Double = 0, direction: Direction = .both,
                    reorderHoldMilliseconds: Double = 50, udpSessionIdleSeconds: Double = 60) {
            self.listen = listen; self.target = target; self.seed = seed
            self.loss = loss; self.duplicate = duplicate; self.reorder = reorder
            self.delayMilliseconds = delayMilliseconds; self.jitterMilliseconds = jitterMilliseconds
            self.direction = direction; self.reorderHoldMilliseconds = reorderHoldMilliseconds
            self.udpSessionIdleSeconds = udpSessionIdleSeconds
        }

        /// Checks ranges and the network rule. Never touches the network.
        public func validate() throws(ImpairmentError) {
            guard try listen.isAllowed() else { throw .addressNotAllowed(role: "listen", address: listen.description) }
            guard try target.isAllowed() else { throw .addressNotAllowed(role: "target", address: target.description) }
            guard target.port != 0 else { throw .invalidArgument("target port must not be 0") }
            if listen.port != 0, try listen.ipv4() == target.ipv4(), listen.port == target.port {
                throw .invalidArgument("listen and target are both \(listen); the proxy would forward to itself")
            }
            for (name, p) in [("loss", loss), ("duplicate", duplicate), ("reorder", reorder)] where !(0...1).contains(p) {
                throw .invalidArgument("\(name) must be between 0 and 1 (or 0% and 100%), got \(p)")
            }
            for (name, v) in [("delay", delayMilliseconds), ("jitter", jitterMilliseconds),
                              ("reorder hold", reorderHoldMilliseconds)] where !(v.isFinite && v >= 0 && v <= 600_000) {
                throw .invalidArgument("\(name) must be between 0 and 600000 ms, got \(v)")
            }
            guard udpSessionIdleSeconds.isFinite, udpSessionIdleSeconds > 0 else {
                throw .invalidArgument("UDP session idle time must be positive")
            }
        }

        func impairs(_ way: Way) -> Bool {
            switch direction {
            case .both: true
            case .toTarget: way == .toTarget
            case .fromTarget: way == .fromTarget
            }
        }
    }
}
