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
    /// A command-line flag is unknown, missing its value, or has a bad value (the CLI exits 2).
    case usage(String)
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
        case .usage(let s): s
        case .system(let s): s
        }
    }

    /// The exit code a command-line tool should use for this error: 2 for usage errors, 1 otherwise.
    public var exitCode: Int32 {
        if case .usage = self { return 2 }
        return 1
    }
}

extension ImpairmentProxy {
    /// A numeric IPv4 host and a port. `localhost` is accepted as 127.0.0.1.
    public struct Endpoint: Hashable, Sendable, CustomStringConvertible {
        public var host: String
        public var port: UInt16

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
        public var seed: UInt64
        /// Probability (0–1) a datagram is dropped.
        public var loss: Double
        /// Probability (0–1) a datagram is sent twice.
        public var duplicate: Double
        /// Probability (0–1) a datagram is held back and sent after the next one.
        public var reorder: Double
        public var delayMilliseconds: Double
        /// Half-width of the uniform jitter around `delayMilliseconds`.
        public var jitterMilliseconds: Double
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

    /// What a `mesh-impair` command line asks for.
    public enum Invocation: Sendable, Equatable {
        /// Run the proxy; `jsonReports` prints counters as JSON on stdout every second.
        case run(Configuration, jsonReports: Bool)
        case help
        case version
    }

    /// The version `mesh-impair --version` prints.
    public static let version = "0.1.0"

    /// `mesh-impair` usage text.
    public static let usage = """
        usage: mesh-impair --target HOST:PORT [--listen HOST:PORT] [options]

        A user-space impairment proxy for PeerMesh sessions. Listens on one port number for both TCP and UDP and
        forwards to the target's same port number: TCP is passed through clean, UDP is impaired.
        Peers connect to the proxy (for example --connect 127.0.0.1:PORT).

          --listen HOST:PORT      where to listen (default 127.0.0.1:0 = pick a port)
          --target HOST:PORT      the host's advertiser address (required)
          --loss P                drop probability: 0.05 or 5% (default 0)
          --duplicate P           duplicate probability (default 0)
          --reorder P             probability a datagram is sent after the next one (default 0)
          --delay-ms MS           added delay (default 0)
          --jitter-ms MS          uniform jitter, +/- MS around the delay (default 0)
          --seed N                random seed (default 1); same seed + same input = same impairments
          --direction D           both | to-target | from-target (default both)
          --json                  print counters as one JSON object per second on stdout
          --help, --version

        Addresses: only 127.0.0.0/8 and 198.18.0.0/15 (the project's test namespaces).
        Prints "listening HOST:PORT" on stderr when ready; on SIGINT/SIGTERM prints the final counters as one
        JSON line on stdout and exits 0. Bad flags exit 2.
        """

    /// Parses probability text: `0.05` or `5%`.
    public static func parseProbability(_ text: String, flag: String) throws(ImpairmentError) -> Double {
        let percent = text.hasSuffix("%")
        let number = percent ? String(text.dropLast()) : text
        guard let v = Double(number), v.isFinite else { throw .usage("\(flag): \"\(text)\" is not a number (use 0.05 or 5%)") }
        let p = percent ? v / 100 : v
        guard (0...1).contains(p) else {
            throw .usage("\(flag): \(text) is out of range (use a fraction 0–1 such as 0.05, or a percentage such as 5%)")
        }
        return p
    }
}

extension ImpairmentProxy.Configuration {
    /// Parses `mesh-impair` arguments (without the program name) into a typed invocation.
    /// Accepts `--flag value` and `--flag=value`. Throws `.usage` for anything malformed; validates the result.
    public static func parse(arguments: [String]) throws(ImpairmentError) -> ImpairmentProxy.Invocation {
        var listen = ImpairmentProxy.Endpoint(host: "127.0.0.1", port: 0)
        var target: ImpairmentProxy.Endpoint?
        var c = ImpairmentProxy.Configuration(target: ImpairmentProxy.Endpoint(host: "127.0.0.1", port: 1))
        var json = false
        var i = 0
        func number(_ flag: String, _ text: String) throws(ImpairmentError) -> Double {
            guard let v = Double(text), v.isFinite, v >= 0 else { throw .usage("\(flag): \"\(text)\" is not a non-negative number") }
            return v
        }
        func endpoint(_ flag: String, _ text: String) throws(ImpairmentError) -> ImpairmentProxy.Endpoint {
            do throws(ImpairmentError) { return try ImpairmentProxy.Endpoint(parsing: text) }
            catch { throw .usage("\(flag): \(error)") }
        }
        while i < arguments.count {
            var flag = arguments[i]
            var inline: String?
            if flag.hasPrefix("--"), let eq = flag.firstIndex(of: "=") {
                inline = String(flag[flag.index(after: eq)...])
                flag = String(flag[..<eq])
            }
            i += 1
            func value() throws(ImpairmentError) -> String {
                if let inline { return inline }
                guard i < arguments.count else { throw .usage("\(flag) needs a value") }
                defer { i += 1 }
                return arguments[i]
            }
            switch flag {
            case "--help", "-h": return .help
            case "--version": return .version
            case "--json": json = true
            case "--listen": listen = try endpoint(flag, value())
            case "--target": target = try endpoint(flag, value())
            case "--loss": c.loss = try ImpairmentProxy.parseProbability(value(), flag: flag)
            case "--duplicate": c.duplicate = try ImpairmentProxy.parseProbability(value(), flag: flag)
            case "--reorder": c.reorder = try ImpairmentProxy.parseProbability(value(), flag: flag)
            case "--delay-ms": c.delayMilliseconds = try number(flag, value())
            case "--jitter-ms": c.jitterMilliseconds = try number(flag, value())
            case "--seed":
                let v = try value()
                guard let s = UInt64(v) else { throw .usage("--seed: \"\(v)\" is not an unsigned integer") }
                c.seed = s
            case "--direction":
                let v = try value()
                guard let d = ImpairmentProxy.Direction(rawValue: v) else {
                    throw .usage("--direction: \"\(v)\" is not one of both, to-target, from-target")
                }
                c.direction = d
            default:
                throw .usage("unknown argument \"\(flag)\"")
            }
        }
        guard let target else { throw .usage("--target HOST:PORT is required") }
        c.listen = listen
        c.target = target
        do throws(ImpairmentError) { try c.validate() }
        catch { throw .usage(error.description) }
        return .run(c, jsonReports: json)
    }
}
