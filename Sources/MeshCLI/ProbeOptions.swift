import PeerMesh

/// `peermesh-probe` options: a small PeerMesh peer for tests and for trying the library by hand.
package struct ProbeOptions: CommandLineTool, Sendable, Equatable {
    package static let program = "peermesh-probe"

    /// What the probe does.
    package enum Mode: Sendable, Equatable {
        /// Advertise, accept every invitation, echo what arrives.
        case host
        /// Find (or connect to) a host, send messages and datagrams, count the echoes.
        case join
    }

    package var mode: Mode
    package var service = "peermesh-probe"
    package var name = RecordOptions.defaultName
    package var port: UInt16 = 0
    package var duration: Double = 3600
    package var connect: PeerEndpoint?
    package var reliable = 10
    package var datagrams = 100
    package var timeout: Double = 10
    package var peerTimeout: Double = 2
    /// Skip DNS-SD: reachable only with --connect.
    package var direct = false
    /// The files of out-of-band mode (no DNS-SD at all): the joiner writes its peer ID to `peerFile`; the host
    /// answers with connection data for it in `dataFile`; the joiner connects with that.
    package struct OfferFiles: Sendable, Equatable {
        package var peerFile: String
        package var dataFile: String
    }
    /// Host `--offer-for` / join `--offer`: out-of-band mode (no advertiser, browser or DNS-SD).
    package var offer: OfferFiles?

    package static let usage = """
        usage: peermesh-probe host --service TYPE [--name NAME] [--port N] [--direct] [--duration S] [--peer-timeout S]
               peermesh-probe join --service TYPE [--name NAME] [--connect HOST:PORT] [--reliable N] [--datagrams N] [--timeout S]
               peermesh-probe host --offer-for PEERFILE DATAFILE [--name NAME] [--duration S]
               peermesh-probe join --offer PEERFILE DATAFILE [--name NAME] [--reliable N] [--datagrams N] [--timeout S]
          host: advertises, accepts every invitation, echoes reliable messages and datagrams back.
          join: finds the first host (or connects directly), sends N reliable messages and N datagrams, waits for the
                echoes and prints one JSON summary line; exit 0 on success, 1 on failure.
          Discovery goes through avahi-daemon unless --connect (join) or --direct (host) is given.
          --offer-for / --offer: out of band, no DNS-SD at all: the joiner writes its peer ID to PEERFILE, the host
                answers with connection data (nearbyConnectionData) in DATAFILE, the joiner connects with it.
          Events go to stdout as JSON lines; diagnostics to stderr. Bad flags exit 2.
        """

    package static func parse(_ arguments: [String]) throws(UsageError) -> ParsedCommand<ProbeOptions> {
        var cursor = ArgumentCursor(arguments)
        var o: ProbeOptions
        switch try cursor.next() {
        case "host": o = ProbeOptions(mode: .host)
        case "join": o = ProbeOptions(mode: .join)
        case "--help", "-h": return .help
        case "--version": return .version
        case let other: throw UsageError("the first argument must be host or join, got \"\(other ?? "")\"")
        }
        while let flag = try cursor.next() {
            switch flag {
            case "--help", "-h": return .help
            case "--service":
                o.service = try cursor.value(for: flag)
                do { try DiscoveryValidation.validate(serviceType: o.service) } catch { throw UsageError("--service: \(error)") }
            case "--name": o.name = try cursor.value(for: flag)
            case "--port": o.port = UInt16(try cursor.int(for: flag, in: 0...65_535))
            case "--duration": o.duration = try cursor.number(for: flag, in: 0...1e9)
            case "--connect":
                let v = try cursor.value(for: flag)
                guard let e = PeerEndpoint(parsing: v) else { throw UsageError("--connect takes HOST:PORT, got \"\(v)\"") }
                o.connect = e
            case "--reliable": o.reliable = try cursor.int(for: flag, in: 0...1_000_000)
            case "--datagrams": o.datagrams = try cursor.int(for: flag, in: 0...10_000_000)
            case "--timeout": o.timeout = try cursor.number(for: flag, in: 0.001...86_400)
            case "--peer-timeout": o.peerTimeout = try cursor.number(for: flag, in: 0.2...3_600)
            case "--avahi": break // the default
            case "--direct": o.direct = true
            case "--offer-for", "--offer":
                let files = OfferFiles(peerFile: try cursor.value(for: flag), dataFile: try cursor.value(for: flag))
                guard (flag == "--offer-for") == (o.mode == .host) else {
                    throw UsageError(o.mode == .host ? "host takes --offer-for, not --offer" : "join takes --offer, not --offer-for")
                }
                o.offer = files
            default: throw UsageError("unknown option \"\(flag)\"")
            }
        }
        return .run(o)
    }
}
