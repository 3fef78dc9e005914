import PeerMesh

/// `mesh-bench` options: in-process measurements for scripts/bench.
package struct BenchOptions: CommandLineTool, Sendable, Equatable {
    package static let program = "mesh-bench"

    /// What to measure.
    package enum Mode: String, Sendable, Equatable {
        /// Datagram throughput: raw UDP against PeerMesh sessions (encrypted and, for reference, plaintext).
        case throughput
        /// N RelayPlayers in this process against one host.
        case fanout
        /// Makes a host's and a player's state directories trust each other (no PAKE: a bench shortcut).
        case pair
        /// A RelayHost serving a tone to anyone (encrypted, or plaintext with `--plaintext`), for the encryption-cost
        /// comparison; runs until SIGINT or SIGTERM.
        case serve
    }

    package var mode: Mode
    package var seconds: Double = 2
    package var rounds = 3
    package var payload = 1024
    package var connect: PeerEndpoint?
    package var players = 1
    package var latency = "auto"
    package var hostPID: Int32?
    package var hostState: String?
    package var playerState: String?
    package var port: UInt16 = 0
    /// `serve` and `fanout`: sessions without encryption (a measurement baseline only).
    package var plaintext = false

    package static let usage = """
        usage: mesh-bench throughput [--seconds S] [--rounds R] [--payload BYTES]
               mesh-bench fanout --connect HOST:PORT [--host-state DIR] --players N [--seconds S] [--latency auto|low|MS]
                                 [--host-pid PID] [--plaintext]
               mesh-bench pair --host-state DIR --player-state DIR
               mesh-bench serve --port PORT [--plaintext]
          throughput: PeerMesh unreliable send → receive between two sessions on 127.0.0.1 (encrypted, and plaintext
                      for reference) against a raw UDP pair with the same thread layout, alternating, R rounds of S s.
          fanout:     N RelayPlayer objects in this process, each with its own identity (trusted by the host whose state
                      directory is DIR; without it, any host), a null sink paced by CLOCK_MONOTONIC; per-player loss,
                      and the host's CPU.
          pair:       creates both identities if needed and makes each trust the other (files only).
          serve:      a host in this process serving a 440 Hz tone to every player (up to 32 from one address), with
                      a fresh identity; prints {"mode":"serve","port":P} once it listens, runs until SIGINT/SIGTERM.
          --plaintext (fanout, serve): no encryption, to measure what encryption costs. Never for real use.
          Prints one JSON object on stdout. Bad flags exit 2.
        """

    package static func parse(_ arguments: [String]) throws(UsageError) -> ParsedCommand<BenchOptions> {
        var cursor = ArgumentCursor(arguments)
        guard let first = cursor.next() else { throw UsageError("say which measurement: throughput, fanout, pair or serve") }
        if first == "--help" || first == "-h" { return .help }
        if first == "--version" { return .version }
        guard let mode = Mode(rawValue: first) else { throw UsageError("unknown measurement \"\(first)\"") }
        var o = BenchOptions(mode: mode)
        while let flag = cursor.next() {
            switch flag {
            case "--seconds": o.seconds = try cursor.number(for: flag, in: 0.1...3_600)
            case "--rounds": o.rounds = try cursor.int(for: flag, in: 1...100)
            case "--payload": o.payload = try cursor.int(for: flag, in: 1...Session.maximumDatagramSize)
            case "--connect":
                let v = try cursor.value(for: flag)
                guard let e = PeerEndpoint(parsing: v) else { throw UsageError("--connect takes HOST:PORT, got \"\(v)\"") }
                o.connect = e
            case "--players": o.players = try cursor.int(for: flag, in: 1...256)
            case "--latency": o.latency = try cursor.value(for: flag)
            case "--host-pid": o.hostPID = Int32(try cursor.int(for: flag, in: 1...Int(Int32.max)))
            case "--host-state": o.hostState = try cursor.value(for: flag)
            case "--player-state": o.playerState = try cursor.value(for: flag)
            case "--port": o.port = UInt16(try cursor.int(for: flag, in: 1...65_535))
            case "--plaintext": o.plaintext = true
            default: throw UsageError("unknown option \"\(flag)\"")
            }
        }
        switch mode {
        case .fanout:
            guard o.connect != nil else { throw UsageError("fanout needs --connect") }
        case .pair:
            guard o.hostState != nil, o.playerState != nil else { throw UsageError("pair needs --host-state and --player-state") }
        case .serve:
            guard o.port != 0 else { throw UsageError("serve needs --port") }
        case .throughput: break
        }
        return .run(o)
    }
}
