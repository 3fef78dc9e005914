import Foundation
import MeshAudio
import MeshPipeline
import PeerMesh

/// `mesh-record --host` options.
package struct RecordOptions: CommandLineTool, Sendable, Equatable {
    package static let program = "mesh-record"

    /// Where audio comes from.
    package enum Input: Sendable, Equatable {
        case device(String)
        case tone(Double)
        case file(String)
    }

    package var name: String = RecordOptions.defaultName
    package var service = "mesh-audio"
    package var input: Input = .device("default")
    package var rate = 44_100
    package var channels = 1
    package var period = 128
    package var port: UInt16 = 0
    package var maxPeers = 32
    package var acceptAll = true
    package var quiet = false
    package var json = false

    package static var defaultName: String {
        String(decoding: ProcessInfo.processInfo.hostName.utf8.prefix(PeerID.maximumDisplayNameBytes), as: UTF8.self)
    }

    package static let usage = """
    usage: mesh-record --host [options]
      Captures audio and serves it to every mesh-play that joins (zero-config, over DNS-SD).
      --name NAME         name players see (default: host name)
      --service TYPE      DNS-SD service type (default mesh-audio)
      --device DEV        ALSA capture device (default "default"; list with arecord -L)
      --input SRC         tone:HZ or FILE.wav instead of a device
      --rate HZ           sample rate (default 44100)
      --channels N        channels (default 1)
      --period FRAMES     capture period = packet size (default 128, 2.9 ms)
      --port N            TCP+UDP port (default: any free port)
      --max-peers N       most players at once (default 32)
      --accept all|ask    accept every player, or ask on the terminal (default all)
      --quiet             no status line or event lines
      --json              one JSON status object per second on stdout
      --help, --version
    """

    package init() {}

    package static func parse(_ arguments: [String]) throws(UsageError) -> ParsedCommand<RecordOptions> {
        var o = RecordOptions()
        var cursor = ArgumentCursor(arguments)
        var sawHost = false
        var sawDevice = false
        var sawInput = false
        while let a = cursor.next() {
            switch a {
            case "--host": sawHost = true
            case "--help", "-h": return .help
            case "--version": return .version
            case "--name":
                o.name = try cursor.value(for: a)
                do { try PeerID.validate(displayName: o.name) } catch { throw UsageError("--name: \(error)") }
            case "--service":
                o.service = try cursor.value(for: a)
                do { try DiscoveryValidation.validate(serviceType: o.service) } catch { throw UsageError("--service: \(error)") }
            case "--device":
                o.input = .device(try cursor.value(for: a))
                sawDevice = true
            case "--input":
                sawInput = true
                let v = try cursor.value(for: a)
                if v.hasPrefix("tone:") {
                    guard let hz = Double(v.dropFirst(5)), hz.isFinite, hz > 0 else {
                        throw UsageError("--input tone:HZ needs a positive frequency, got \"\(v)\"")
                    }
                    o.input = .tone(hz)
                } else {
                    o.input = .file(v)
                }
            case "--rate": o.rate = try cursor.int(for: a, in: 8_000...192_000)
            case "--channels": o.channels = try cursor.int(for: a, in: 1...8)
            case "--period": o.period = try cursor.int(for: a, in: 16...8_192)
            case "--port": o.port = UInt16(try cursor.int(for: a, in: 1...65_535))
            case "--max-peers": o.maxPeers = try cursor.int(for: a, in: 1...255)
            case "--accept":
                switch try cursor.value(for: a) {
                case "all": o.acceptAll = true
                case "ask": o.acceptAll = false
                case let v: throw UsageError("--accept takes all or ask, got \"\(v)\"")
                }
            case "--quiet": o.quiet = true
            case "--json": o.json = true
            default: throw UsageError("unknown option \"\(a)\"")
            }
        }
        guard sawHost else { throw UsageError("mesh-record needs --host") }
        if sawDevice, sawInput { throw UsageError("--device and --input are exclusive") }
        if case .tone(let hz) = o.input, hz >= Double(o.rate) / 2 {
            throw UsageError("--input tone:\(hz) is above the Nyquist frequency of \(o.rate) Hz")
        }
        return .run(o)
    }
}

/// `mesh-play --find` options.
package struct PlayOptions: CommandLineTool, Sendable, Equatable {
    package static let program = "mesh-play"

    /// Where audio goes.
    package enum Output: Sendable, Equatable {
        case device(String)
        case file(String)
    }

    package var hostName: String?
    package var connect: PeerEndpoint?
    package var list = false
    package var service = "mesh-audio"
    package var output: Output = .device("default")
    package var latency: JitterBuffer.Mode = .auto
    package var duration: Double?
    package var quiet = false
    package var json = false
    package var name = "mesh-play"

    package static let usage = """
    usage: mesh-play --find [options]
      Finds a mesh-record host on the LAN, joins it and plays.
      --host NAME         join only this host (default: the first found; the choice is printed)
      --connect HOST:PORT join this address without DNS-SD
      --list              print the hosts found, then exit
      --service TYPE      DNS-SD service type (default mesh-audio)
      --device DEV        ALSA playback device (default "default"; list with aplay -L)
      --output FILE.wav   write a WAV file instead of playing
      --latency auto|low|MS  jitter buffer: adaptive (default), pinned to the minimum, or fixed ms
      --duration SECONDS  stop after this long
      --name NAME         this player's name (default mesh-play)
      --quiet             no status line or event lines
      --json              one JSON status object per second on stdout
      --help, --version
    """

    package init() {}

    package static func parse(_ arguments: [String]) throws(UsageError) -> ParsedCommand<PlayOptions> {
        var o = PlayOptions()
        var cursor = ArgumentCursor(arguments)
        var sawFind = false
        var sawDevice = false
        var sawOutput = false
        while let a = cursor.next() {
            switch a {
            case "--find": sawFind = true
            case "--help", "-h": return .help
            case "--version": return .version
            case "--host":
                let v = try cursor.value(for: a)
                do { try PeerID.validate(displayName: v) } catch { throw UsageError("--host: \(error)") }
                o.hostName = v
            case "--connect":
                let v = try cursor.value(for: a)
                guard let e = PeerEndpoint(parsing: v) else { throw UsageError("--connect takes HOST:PORT, got \"\(v)\"") }
                o.connect = e
            case "--list": o.list = true
            case "--service":
                o.service = try cursor.value(for: a)
                do { try DiscoveryValidation.validate(serviceType: o.service) } catch { throw UsageError("--service: \(error)") }
            case "--device":
                o.output = .device(try cursor.value(for: a))
                sawDevice = true
            case "--output":
                o.output = .file(try cursor.value(for: a))
                sawOutput = true
            case "--latency":
                let v = try cursor.value(for: a)
                switch v {
                case "auto": o.latency = .auto
                case "low": o.latency = .low
                default:
                    guard let ms = Double(v), ms.isFinite, ms >= 0, ms <= 2_000 else {
                        throw UsageError("--latency takes auto, low or milliseconds (0–2000), got \"\(v)\"")
                    }
                    o.latency = .fixed(milliseconds: ms)
                }
            case "--duration":
                let v = try cursor.value(for: a)
                guard let d = Double(v), d.isFinite, d > 0 else { throw UsageError("--duration takes positive seconds, got \"\(v)\"") }
                o.duration = d
            case "--name":
                o.name = try cursor.value(for: a)
                do { try PeerID.validate(displayName: o.name) } catch { throw UsageError("--name: \(error)") }
            case "--quiet": o.quiet = true
            case "--json": o.json = true
            default: throw UsageError("unknown option \"\(a)\"")
            }
        }
        guard sawFind || o.connect != nil || o.list else { throw UsageError("mesh-play needs --find, --connect HOST:PORT or --list") }
        if sawDevice, sawOutput { throw UsageError("--device and --output are exclusive") }
        if o.list, o.connect != nil { throw UsageError("--list and --connect are exclusive") }
        return .run(o)
    }
}
