import MeshImpair

/// `mesh-impair` options: the proxy's configuration, and whether to print counters as JSON.
package struct ImpairOptions: CommandLineTool, Sendable, Equatable {
    package static let program = "mesh-impair"

    package var configuration: ImpairmentProxy.Configuration
    /// Print the counters as one JSON object per second on stdout.
    package var json = false

    package static let usage = """
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
    package static func probability(_ text: String, flag: String) throws(UsageError) -> Double {
        let percent = text.hasSuffix("%")
        let number = percent ? String(text.dropLast()) : text
        guard let v = Double(number), v.isFinite else { throw UsageError("\(flag): \"\(text)\" is not a number (use 0.05 or 5%)") }
        let p = percent ? v / 100 : v
        guard (0...1).contains(p) else {
            throw UsageError("\(flag): \(text) is out of range (use a fraction 0–1 such as 0.05, or a percentage such as 5%)")
        }
        return p
    }

    /// Parses `mesh-impair` arguments and validates the result (ranges and the network rule).
    package static func parse(_ arguments: [String]) throws(UsageError) -> ParsedCommand<ImpairOptions> {
        var listen = ImpairmentProxy.Endpoint(host: "127.0.0.1", port: 0)
        var target: ImpairmentProxy.Endpoint?
        var c = ImpairmentProxy.Configuration(target: ImpairmentProxy.Endpoint(host: "127.0.0.1", port: 1))
        var json = false
        var cursor = ArgumentCursor(arguments)
        func endpoint(_ flag: String, _ text: String) throws(UsageError) -> ImpairmentProxy.Endpoint {
            do throws(ImpairmentError) { return try ImpairmentProxy.Endpoint(parsing: text) } catch { throw UsageError("\(flag): \(error)") }
        }
        while let flag = try cursor.next() {
            switch flag {
            case "--help", "-h": return .help
            case "--version": return .version
            case "--json": json = true
            case "--listen": listen = try endpoint(flag, cursor.value(for: flag))
            case "--target": target = try endpoint(flag, cursor.value(for: flag))
            case "--loss": c.loss = try probability(cursor.value(for: flag), flag: flag)
            case "--duplicate": c.duplicate = try probability(cursor.value(for: flag), flag: flag)
            case "--reorder": c.reorder = try probability(cursor.value(for: flag), flag: flag)
            case "--delay-ms": c.delayMilliseconds = try cursor.number(for: flag, in: 0...600_000)
            case "--jitter-ms": c.jitterMilliseconds = try cursor.number(for: flag, in: 0...600_000)
            case "--seed":
                let v = try cursor.value(for: flag)
                guard let s = UInt64(v) else { throw UsageError("--seed: \"\(v)\" is not an unsigned integer") }
                c.seed = s
            case "--direction":
                let v = try cursor.value(for: flag)
                guard let d = ImpairmentProxy.Direction(rawValue: v) else {
                    throw UsageError("--direction: \"\(v)\" is not one of both, to-target, from-target")
                }
                c.direction = d
            default:
                throw UsageError("unknown option \"\(flag)\"")
            }
        }
        guard let target else { throw UsageError("--target HOST:PORT is required") }
        c.listen = listen
        c.target = target
        do throws(ImpairmentError) { try c.validate() } catch { throw UsageError(error.description) }
        return .run(ImpairOptions(configuration: c, json: json))
    }
}
