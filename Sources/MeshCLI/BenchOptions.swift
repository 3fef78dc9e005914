import MeshPipeline
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
        /// Resource transfer, the sending side: connects to a `resource-receiver` and sends one file `--rounds` times
        /// with `Session.sendResource`, encrypted (the default), timing each from the call to its completion.
        case resource
        /// Resource transfer, the receiving side: a session on 127.0.0.1 that accepts every invitation and stores
        /// resources in `--dir`; runs until SIGINT or SIGTERM.
        case resourceReceiver = "resource-receiver"
        /// Full-mesh join time: `--members` encrypted sessions in this process join a first one, one at a time
        /// and all at once, until every member's `connectedPeers` lists all the others.
        case meshjoin
    }

    package var mode: Mode
    package var seconds: Double = 2
    package var rounds = 3
    package var payload = 1024
    package var connect: PeerEndpoint?
    package var players = 1
    package var latency: JitterBuffer.Mode = .auto
    package var hostPID: Int32?
    package var hostState: String?
    package var playerState: String?
    package var port: UInt16 = 0
    /// `serve` and `fanout`: sessions without encryption (a measurement baseline only).
    package var plaintext = false
    /// `resource`: the file to send.
    package var file: String?
    /// `resource-receiver`: where received resources are written.
    package var directory: String?
    /// `meshjoin`: sessions in the mesh, the first included.
    package var members = 3
    /// `meshjoin`: how many meshes are formed each way.
    package var runs = 5

    package static let usage = """
        usage: mesh-bench throughput [--seconds S] [--rounds R] [--payload BYTES]
               mesh-bench fanout --connect HOST:PORT [--host-state DIR] --players N [--seconds S] [--latency auto|low|MS]
                                 [--host-pid PID] [--plaintext]
               mesh-bench pair --host-state DIR --player-state DIR
               mesh-bench serve --port PORT [--plaintext]
               mesh-bench resource-receiver --dir DIR [--port PORT]
               mesh-bench resource --connect HOST:PORT --file PATH [--rounds R]
               mesh-bench meshjoin [--members N] [--runs R]
          throughput: PeerMesh unreliable send → receive between two sessions on 127.0.0.1 (encrypted, and plaintext
                      for reference) against a raw UDP pair with the same thread layout, alternating, R rounds of S s.
          fanout:     N RelayPlayer objects in this process, each with its own identity (trusted by the host whose state
                      directory is DIR; without it, any host), a null sink paced by CLOCK_MONOTONIC; per-player loss,
                      and the host's CPU.
          pair:       creates both identities if needed and makes each trust the other (files only).
          serve:      a host in this process serving a 440 Hz tone to every player (up to 32 from one address), with
                      a fresh identity; prints {"mode":"serve","port":P} once it listens, runs until SIGINT/SIGTERM.
          resource-receiver: a session on 127.0.0.1 (encrypted) that accepts every invitation and writes the
                      resources it receives in DIR; prints {"mode":"resource-receiver","port":P} once it listens (PORT,
                      or one picked), runs until SIGINT/SIGTERM.
          resource:   connects to a resource-receiver and sends PATH R times (Session.sendResource, encrypted), one
                      after the other; each round is timed from the call to the completion handler (the receiver
                      has written the file and verified its SHA-256). Prints seconds and MB/s (10^6 bytes) per round.
          meshjoin:   N (2–8, a session's default peer limit; default 3) encrypted full-mesh sessions in this
                      process, member i on 127.0.0.(i+1); every member after the first connects to the first's
                      advertiser. R runs one at a time (each joins once the one before is in every view), R all at
                      once (default 5); the time until every member's connectedPeers lists all N-1 others.
          --plaintext (fanout, serve): no encryption, to measure what encryption costs. Never for real use.
          Prints one JSON object on stdout. Bad flags exit 2.
        """

    package static func parse(_ arguments: [String]) throws(UsageError) -> ParsedCommand<BenchOptions> {
        var cursor = ArgumentCursor(arguments)
        guard let first = try cursor.next() else {
            throw UsageError("say which measurement: throughput, fanout, pair, serve, resource, resource-receiver or meshjoin")
        }
        if first == "--help" || first == "-h" { return .help }
        if first == "--version" { return .version }
        guard let mode = Mode(rawValue: first) else { throw UsageError("unknown measurement \"\(first)\"") }
        var o = BenchOptions(mode: mode)
        while let flag = try cursor.next() {
            switch flag {
            case "--seconds": o.seconds = try cursor.number(for: flag, in: 0.1...3_600)
            case "--rounds": o.rounds = try cursor.int(for: flag, in: 1...100)
            case "--payload": o.payload = try cursor.int(for: flag, in: 1...Session.maximumDatagramSize)
            case "--connect":
                let v = try cursor.value(for: flag)
                guard let e = PeerEndpoint(parsing: v) else { throw UsageError("--connect takes HOST:PORT, got \"\(v)\"") }
                o.connect = e
            case "--players": o.players = try cursor.int(for: flag, in: 1...256)
            case "--latency": o.latency = try LatencyOption.parse(try cursor.value(for: flag))
            case "--host-pid": o.hostPID = Int32(try cursor.int(for: flag, in: 1...Int(Int32.max)))
            case "--host-state": o.hostState = try cursor.value(for: flag)
            case "--player-state": o.playerState = try cursor.value(for: flag)
            case "--port": o.port = UInt16(try cursor.int(for: flag, in: 1...65_535))
            case "--plaintext": o.plaintext = true
            case "--file": o.file = try cursor.value(for: flag)
            case "--dir": o.directory = try cursor.value(for: flag)
            case "--members": o.members = try cursor.int(for: flag, in: 2...8)
            case "--runs": o.runs = try cursor.int(for: flag, in: 1...100)
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
        case .resource:
            guard o.connect != nil, o.file != nil else { throw UsageError("resource needs --connect and --file") }
        case .resourceReceiver:
            guard o.directory != nil else { throw UsageError("resource-receiver needs --dir") }
        case .throughput, .meshjoin: break
        }
        return .run(o)
    }
}
