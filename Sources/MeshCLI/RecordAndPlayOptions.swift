import FoundationEssentials
import Glibc
import MeshPOSIX
import MeshAudio
import MeshPipeline
import PeerMesh

/// Where a CLI keeps its identity and paired devices: `--state-dir DIR`, else `$XDG_CONFIG_HOME/peermesh`, else
/// `~/.config/peermesh`. The directory is mode 0700 and the files 0600.
package struct StateDirectory: Sendable, Equatable {
    package var path: String

    package init(_ path: String) { self.path = path }

    /// The default for this user.
    package static var `default`: StateDirectory {
        let env = ProcessInfo.processInfo.environment
        if let xdg = env["XDG_CONFIG_HOME"], xdg.hasPrefix("/") { return StateDirectory(xdg + "/peermesh") }
        return StateDirectory((env["HOME"] ?? "/root") + "/.config/peermesh")
    }

    package var identityPath: String { path + "/identity.json" }
    package var trustPath: String { path + "/paired.json" }
}

/// What a command line names as audio input: a capture device, a test tone or a sound file.
package enum AudioInput: Sendable, Equatable {
    case device(String)
    case tone(Double)
    case file(String)

    /// `device:NAME`, `tone:HZ`, `file:PATH`, or a path ending in `.wav`, `.flac` or `.ogg` (any case).
    package static func parse(_ text: String, flag: String = "--input") throws(UsageError) -> AudioInput {
        if text.hasPrefix("device:") {
            let name = String(text.dropFirst(7))
            guard !name.isEmpty else { throw UsageError("\(flag) device: needs a device name (list them with arecord -L)") }
            return .device(name)
        }
        if text.hasPrefix("tone:") {
            guard let hz = Double(text.dropFirst(5)), hz.isFinite, hz > 0 else {
                throw UsageError("\(flag) tone:HZ needs a positive frequency, got \"\(text)\"")
            }
            return .tone(hz)
        }
        if text.hasPrefix("file:") {
            let path = String(text.dropFirst(5))
            guard !path.isEmpty else { throw UsageError("\(flag) file: needs a path") }
            return .file(path)
        }
        let lower = text.lowercased()
        if [".wav", ".flac", ".ogg"].contains(where: { lower.hasSuffix($0) }) { return .file(text) }
        throw UsageError("\(flag) takes device:NAME, tone:HZ, file:PATH or a .wav/.flac/.ogg file, got \"\(text)\"")
    }

    /// Opens the source this names. A file's format comes from the file (looped); the others use `format`.
    package func makeSource(format: AudioFormat, periodFrames: Int) throws -> any AudioSource {
        switch self {
        case .device(let name): try Recorder(device: name, format: format, periodFrames: periodFrames)
        case .tone(let hz): try ToneSource(frequency: hz, format: format, periodFrames: periodFrames)
        case .file(let path): try WAVFileSource(path: path, periodFrames: periodFrames, loop: true)
        }
    }
}

/// Who a host lets listen (`--accept`).
package enum AcceptMode: String, Sendable, Equatable {
    /// Only paired players (the default).
    case paired
    /// Ask on the terminal about unpaired players.
    case ask
    /// Anyone on the network.
    case all
}

/// `mesh-record --host` options.
package struct RecordOptions: CommandLineTool, Sendable, Equatable {
    package static let program = "mesh-record"

    /// What the run does.
    package enum Action: Sendable, Equatable {
        /// Serve (`--host`).
        case host
        /// List the paired players and exit (`--paired`).
        case listPaired
        /// Forget a paired player and exit (`--forget`).
        case forget(String)
        /// Send a command to the running host (`mesh-record ctl …`) and exit.
        case control(ControlCommand)
    }

    package var action: Action = .host
    /// Where the running host's control socket is (`--runtime-dir`).
    package var runtime = RuntimeDirectory.default
    /// Whether `--runtime-dir` was given (otherwise `ctl` also looks where the service keeps it, /run/peermesh).
    package var runtimeGiven = false
    /// `--name`, if given; otherwise the saved identity's name (on first run, the host name).
    package var name: String?
    package var state = StateDirectory.default
    package var service = "mesh-audio"
    package var input: AudioInput = .device("default")
    package var rate = 44_100
    package var channels = 1
    package var period = 128
    package var codec: SampleEncoding = .float32
    /// `--bitrate`, in bits per second (Opus only).
    package var opusBitrate: Int = Packetizer.defaultOpusBitrate
    package var port: UInt16 = 0
    package var bind = ""
    package var maxPeers = 32
    package var maxPerAddress = 4
    package var accept: AcceptMode = .paired
    package var pair = false
    package var pairTimeout: Double = 30
    package var quiet = false
    package var json = false
    /// `--clips DIR`: keep a pre-roll and write clips there when players ask (`capture`).
    package var clips: String?
    package var clipPreroll: Double = 10
    package var clipLength: Double = 10
    /// Talkback from the players: played on this device, or written to this sound file; nil takes none.
    package var talkOutput: PlayOptions.Output?
    /// `--talk-duplex full`: a talker keeps hearing the host.
    package var talkFullDuplex = false

    /// The host name, cut to a display name.
    package static var defaultName: String {
        let name = String(decoding: ProcessInfo.processInfo.hostName.utf8.prefix(PeerID.maximumDisplayNameBytes), as: UTF8.self)
        return name.isEmpty ? "peermesh" : name
    }

    package static let usage = """
    usage: mesh-record --host [options]
           mesh-record --paired | --forget NAME|FINGERPRINT
           mesh-record ctl status|pair [SECONDS]|paired|forget NAME|FP|mute|unmute [--runtime-dir DIR]
      Captures audio and serves it, encrypted, to the players paired with this host.
      Pair a player once:  mesh-record --host --pair   (shows a code)   then on the player: mesh-play --pair CODE
      --pair              open a pairing window: prints a code (and a QR code on a terminal)
      --pair-timeout S    how long the window stays open (default 30)
      --accept MODE       who may listen: paired (default), ask (ask on the terminal about others), or all
                          (anyone on the network can listen)
      --paired            list the paired players, then exit
      --forget NAME|FP    forget a paired player (a connected one is disconnected at once), then exit
      --state-dir DIR     identity and paired devices (default $XDG_CONFIG_HOME/peermesh or ~/.config/peermesh)
      --name NAME         name players see (saved; default: host name)
      --service TYPE      DNS-SD service type (default mesh-audio)
      --device DEV        ALSA capture device (default "default"; list with arecord -L)
      --input SRC         device:NAME, tone:HZ, file:PATH or a .wav/.flac/.ogg file (looped) instead of --device
      --rate HZ           sample rate (default 44100)
      --channels N        channels (default 1)
      --period FRAMES     capture period = packet size (default 128, 2.9 ms)
      --codec f32|s16|opus  how samples travel: f32 (default, lossless), s16 (dithered 16-bit, half the bandwidth)
                          or opus (48 kHz, 2.5 ms frames, --bitrate); players follow what arrives
      --bitrate KBIT      Opus bitrate in kbit/s, 6-510 (default 96)
      --port N            TCP+UDP port (default: any free port)
      --bind ADDR         listen on this address only (default: every address, IPv4 and IPv6)
      --max-peers N       most players at once (default 32)
      --max-per-address N most players from one address (default 4)
      --runtime-dir DIR   where the control socket lives (default $RUNTIME_DIRECTORY, $XDG_RUNTIME_DIR/peermesh,
                          /run/peermesh for root, else /tmp/peermesh-UID)
      --clips DIR         keep a pre-roll of the capture; a player's "capture" writes DIR/<name>-<time>.wav
      --clip-preroll S    seconds kept before the press (default 10)
      --clip-length S     longest part after the press (default 10)
      --talk-device DEV   take push-to-talk from players and play it on this ALSA device
      --talk-output FILE  the same, written to a .wav/.flac/.ogg file instead
      --talk-duplex half|full  half (default): a talking player does not hear the host meanwhile (no echo)
      --quiet             no status line or event lines (errors are still printed)
      --json              one JSON status object per second on stdout
      --help, --version
      Keys on a terminal: m = mute/unmute the microphone. Off a terminal (or with --accept ask, whose questions read
      lines), stdin takes one command a line: mute, unmute, or m (toggle); a question waiting for its answer comes first.
      ctl                 talk to the host running here: status, pair (opens a window; prints the code and QR),
                          paired, forget NAME|FP (disconnects it), mute, unmute
    """

    package init() {}

    package static func parse(_ arguments: [String]) throws(UsageError) -> ParsedCommand<RecordOptions> {
        var o = RecordOptions()
        if arguments.first == "ctl" { return try parseControl(Array(arguments.dropFirst())) }
        var cursor = ArgumentCursor(arguments)
        var sawHost = false, sawDevice = false, sawInput = false, sawPaired = false, sawBitrate = false, forget: String?
        while let a = try cursor.next() {
            switch a {
            case "--host": sawHost = true
            case "--help", "-h": return .help
            case "--version": return .version
            case "--name":
                let name = try cursor.value(for: a)
                do { try PeerID.validate(displayName: name) } catch { throw UsageError("--name: \(error)") }
                o.name = name
            case "--state-dir": o.state = StateDirectory(try cursor.directory(for: a))
            case "--service":
                o.service = try cursor.value(for: a)
                do { try DiscoveryValidation.validate(serviceType: o.service) } catch { throw UsageError("--service: \(error)") }
            case "--device":
                o.input = .device(try cursor.value(for: a))
                sawDevice = true
            case "--input":
                sawInput = true
                o.input = try AudioInput.parse(try cursor.value(for: a))
            case "--rate": o.rate = try cursor.int(for: a, in: 8_000...192_000)
            case "--channels": o.channels = try cursor.int(for: a, in: 1...8)
            case "--period": o.period = try cursor.int(for: a, in: 16...8_192)
            case "--codec":
                let v = try cursor.value(for: a)
                guard let codec = SampleEncoding(name: v) else { throw UsageError("--codec takes f32, s16 or opus, got \"\(v)\"") }
                o.codec = codec
            case "--bitrate":
                o.opusBitrate = try cursor.int(for: a, in: 6...510) * 1000
                sawBitrate = true
            case "--port": o.port = UInt16(try cursor.int(for: a, in: 1...65_535))
            case "--bind":
                o.bind = try cursor.value(for: a)
                guard SocketAddressCheck.isNumeric(o.bind) else { throw UsageError("--bind takes a numeric IPv4 or IPv6 address, got \"\(o.bind)\"") }
            case "--max-peers": o.maxPeers = try cursor.int(for: a, in: 1...255)
            case "--max-per-address": o.maxPerAddress = try cursor.int(for: a, in: 1...255)
            case "--accept":
                let v = try cursor.value(for: a)
                guard let m = AcceptMode(rawValue: v) else { throw UsageError("--accept takes paired, ask or all, got \"\(v)\"") }
                o.accept = m
            case "--pair": o.pair = true
            case "--pair-timeout": o.pairTimeout = try cursor.number(for: a, in: 1...3_600)
            case "--clips": o.clips = try cursor.value(for: a)
            case "--clip-preroll": o.clipPreroll = try cursor.number(for: a, in: 0...600)
            case "--clip-length": o.clipLength = try cursor.number(for: a, in: 0.1...3_600)
            case "--talk-device":
                guard o.talkOutput == nil else { throw UsageError("--talk-device and --talk-output are exclusive") }
                o.talkOutput = .device(try cursor.value(for: a))
            case "--talk-output":
                guard o.talkOutput == nil else { throw UsageError("--talk-device and --talk-output are exclusive") }
                let path = try cursor.value(for: a)
                guard let encoding = SoundFileEncoding.forPath(path) else {
                    throw UsageError("--talk-output takes a .wav, .flac or .ogg file, got \"\(path)\"")
                }
                o.talkOutput = .file(path, encoding)
            case "--talk-duplex":
                let v = try cursor.value(for: a)
                guard v == "half" || v == "full" else { throw UsageError("--talk-duplex takes half or full, got \"\(v)\"") }
                o.talkFullDuplex = v == "full"
            case "--paired": sawPaired = true
            case "--forget": forget = try cursor.value(for: a)
            case "--runtime-dir": o.runtime = RuntimeDirectory(try cursor.directory(for: a))
            case "--quiet": o.quiet = true
            case "--json": o.json = true
            default: throw UsageError("unknown option \"\(a)\"")
            }
        }
        let actions = [sawHost, sawPaired, forget != nil].filter { $0 }.count
        guard actions == 1 else {
            throw UsageError(actions == 0 ? "say what to do: --host, --paired or --forget NAME" : "--host, --paired and --forget are exclusive")
        }
        if sawPaired { o.action = .listPaired }
        if let forget { o.action = .forget(forget) }
        if sawDevice, sawInput { throw UsageError("--device and --input are exclusive") }
        if sawBitrate, o.codec != .opus { throw UsageError("--bitrate applies to --codec opus only") }
        if o.codec == .opus, o.channels > 2 { throw UsageError("--codec opus carries 1 or 2 channels, not \(o.channels)") }
        if case .tone(let hz) = o.input, hz >= Double(o.rate) / 2 {
            throw UsageError("--input tone:\(hz) is at or above the Nyquist frequency, \(o.rate / 2) Hz at --rate \(o.rate)")
        }
        return .run(o)
    }

    /// `mesh-record ctl COMMAND [ARG] [--runtime-dir DIR]`.
    static func parseControl(_ arguments: [String]) throws(UsageError) -> ParsedCommand<RecordOptions> {
        var o = RecordOptions()
        var words: [String] = []
        var cursor = ArgumentCursor(arguments)
        while let a = try cursor.next() {
            switch a {
            case "--help", "-h": return .help
            case "--version": return .version
            case "--runtime-dir":
                o.runtime = RuntimeDirectory(try cursor.directory(for: a))
                o.runtimeGiven = true
            default:
                guard !a.hasPrefix("--") else { throw UsageError("ctl: unknown option \"\(a)\"") }
                words.append(a)
            }
        }
        guard let command = ControlCommand.parse(words) else {
            throw UsageError("ctl takes status, pair [SECONDS], paired, forget NAME|FINGERPRINT, mute or unmute"
                + (words.isEmpty ? "" : ", got \"\(words.joined(separator: " "))\""))
        }
        o.action = .control(command)
        return .run(o)
    }
}

/// `mesh-play` options.
package struct PlayOptions: CommandLineTool, Sendable, Equatable {
    package static let program = "mesh-play"

    /// Where audio goes.
    package enum Output: Sendable, Equatable {
        case device(String)
        /// A sound file, in the encoding its extension (and `--sample-format`) chose.
        case file(String, SoundFileEncoding)
    }

    /// What the run does.
    package enum Action: Sendable, Equatable {
        /// Find a host (or connect to one) and play.
        case play
        /// Print the hosts found and exit.
        case list
        /// Pair with a host and exit.
        case pair(code: String, fingerprint: String?)
        /// List paired hosts and exit.
        case listPaired
        /// Forget a paired host and exit.
        case forget(String)
    }

    package var action: Action = .play
    package var hostName: String?
    package var connect: PeerEndpoint?
    package var service = "mesh-audio"
    package var output: Output = .device("default")
    package var latency: JitterBuffer.Mode = .auto
    package var duration: Double?
    package var quiet = false
    package var json = false
    /// `--name`, if given; otherwise the saved identity's name (on first run, the host name).
    package var name: String?
    package var state = StateDirectory.default
    /// The starting volume, dB (−60…+12).
    package var volume: Double = 0
    /// A short local beep confirms a saved clip.
    package var beep = true
    /// `--buttons PATH`: headset and media buttons (a Linux input device).
    package var buttons: String?
    /// Push-to-talk input (`--talk-device DEV` or `--talk-input SRC`); nil: no talk.
    package var talkInput: AudioInput?

    package static let usage = """
    usage: mesh-play --find [--host NAME] [options]      find a paired host, join it and play
           mesh-play --connect HOST:PORT [options]       join a paired host at an address, without DNS-SD
           mesh-play --pair CODE [--host NAME]           pair with the host showing CODE (mesh-record --host --pair)
           mesh-play --list | --paired | --forget NAME|FINGERPRINT
      --host NAME|FP      only this host: the name it was paired under (any case; with --pair, the name it
                          advertises) or a prefix of its key fingerprint (4 characters or more)
      --connect HOST:PORT a host name, IPv4 address or [IPv6] address, and the host's --port
      --pair CODE|URI     the code the host shows (or the peermesh://pair URI of its QR code), then exit
      --list              print the hosts found in 2 s (paired or not; --duration S: in S), then exit
      --paired            list the paired hosts, then exit
      --forget NAME|FP    forget a paired host, then exit
      --state-dir DIR     identity and paired devices (default $XDG_CONFIG_HOME/peermesh or ~/.config/peermesh)
      --name NAME         this player's name (saved; default: host name)
      --service TYPE      DNS-SD service type (default mesh-audio)
      --device DEV        ALSA playback device (default "default"; list with aplay -L)
      --output FILE       write a sound file instead of playing: .wav, .flac or .ogg (the extension decides)
      --sample-format F   sample format of a .wav output: s16 (default), s24 or f32
      --latency auto|low|MS  jitter buffer: adaptive (default), pinned to the minimum, or fixed ms
      --duration SECONDS  stop after this long
      --volume DB         starting volume, -60…+12 dB (default 0)
      --no-beep           no local beep when a clip is saved
      --talk-device DEV   push-to-talk from this ALSA capture device (talk on: space, "talk on", the mic-mute key)
      --talk-input SRC    the same from tone:HZ or a 44.1 kHz mono sound file (tests)
      --buttons DEV       headset/media buttons (/dev/input/eventN): play/pause = pause/resume, long press = capture,
                          volume keys = volume, mic-mute = talk
      --quiet             no status line or event lines (errors are still printed)
      --json              one JSON status object per second on stdout
      --help, --version
      Keys on a terminal: p = pause/resume, m = mute, + / - = volume by 3 dB, c = capture a clip,
      space = talk (with --talk-device or --talk-input). Off a terminal, stdin takes one command a line: pause,
      resume, mute, unmute, volume DB, capture [begin|end|cancel] [secondary], talk on|off.
    """

    package init() {}

    package static func parse(_ arguments: [String]) throws(UsageError) -> ParsedCommand<PlayOptions> {
        var o = PlayOptions()
        var cursor = ArgumentCursor(arguments)
        var sawFind = false, sawDevice = false, sawOutput = false, sawList = false, sawPaired = false
        var pair: String?, forget: String?, outputPath: String?, sampleFormat: String?
        while let a = try cursor.next() {
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
                guard let e = PeerEndpoint(parsing: v) else {
                    throw UsageError("--connect takes HOST:PORT (a name, an IPv4 address or [IPv6]), got \"\(v)\"")
                }
                o.connect = e
            case "--pair": pair = try cursor.value(for: a)
            case "--list": sawList = true
            case "--paired": sawPaired = true
            case "--forget": forget = try cursor.value(for: a)
            case "--state-dir": o.state = StateDirectory(try cursor.directory(for: a))
            case "--service":
                o.service = try cursor.value(for: a)
                do { try DiscoveryValidation.validate(serviceType: o.service) } catch { throw UsageError("--service: \(error)") }
            case "--device":
                o.output = .device(try cursor.value(for: a))
                sawDevice = true
            case "--output":
                outputPath = try cursor.value(for: a)
                sawOutput = true
            case "--sample-format":
                let v = try cursor.value(for: a)
                guard ["s16", "s24", "f32"].contains(v) else { throw UsageError("--sample-format takes s16, s24 or f32, got \"\(v)\"") }
                sampleFormat = v
            case "--latency": o.latency = try LatencyOption.parse(try cursor.value(for: a))
            case "--duration":
                let v = try cursor.value(for: a)
                guard let d = Double(v), d.isFinite, d > 0 else { throw UsageError("--duration takes positive seconds, got \"\(v)\"") }
                o.duration = d
            case "--name":
                let name = try cursor.value(for: a)
                do { try PeerID.validate(displayName: name) } catch { throw UsageError("--name: \(error)") }
                o.name = name
            case "--volume": o.volume = try cursor.number(for: a, in: OutputControls.volumeRange)
            case "--no-beep": o.beep = false
            case "--buttons": o.buttons = try cursor.value(for: a)
            case "--talk-device", "--talk-input":
                guard o.talkInput == nil else { throw UsageError("--talk-device and --talk-input are exclusive") }
                let v = try cursor.value(for: a)
                o.talkInput = a == "--talk-device" ? .device(v) : try AudioInput.parse(v, flag: a)
            case "--quiet": o.quiet = true
            case "--json": o.json = true
            default: throw UsageError("unknown option \"\(a)\"")
            }
        }
        let playing = sawFind || o.connect != nil
        let chosen = [playing, sawList, pair != nil, sawPaired, forget != nil].filter { $0 }.count
        guard chosen >= 1 else { throw UsageError("say what to do: --find, --connect HOST:PORT, --pair CODE, --list, --paired or --forget") }
        if sawFind, o.connect != nil { throw UsageError("--find and --connect are exclusive") }
        if pair != nil, sawFind { throw UsageError("--pair and --find are exclusive (pair first, then --find)") }
        if chosen > 1, !(pair != nil && o.connect != nil && chosen == 2) {
            throw UsageError("--find/--connect, --list, --pair, --paired and --forget are exclusive")
        }
        if sawDevice, sawOutput { throw UsageError("--device and --output are exclusive") }
        if let path = outputPath {
            guard let encoding = SoundFileEncoding.forPath(path, sampleFormat: sampleFormat ?? "s16") else {
                throw UsageError("--output takes a .wav, .flac or .ogg file (the extension chooses the format), got \"\(path)\"")
            }
            if sampleFormat != nil, !path.lowercased().hasSuffix(".wav") {
                throw UsageError("--sample-format applies to .wav output only")
            }
            o.output = .file(path, encoding)
        } else if sampleFormat != nil {
            throw UsageError("--sample-format needs --output FILE.wav")
        }
        if sawList { o.action = .list }
        if sawPaired { o.action = .listPaired }
        if let forget { o.action = .forget(forget) }
        if let pair { o.action = try parsePairing(pair) }
        return .run(o)
    }

    /// A pairing code, or a `peermesh://pair?code=…&fp=…` URI from a QR code.
    static func parsePairing(_ text: String) throws(UsageError) -> Action {
        if text.hasPrefix("peermesh://pair?") {
            var code: String?, fp: String?
            for item in text.dropFirst("peermesh://pair?".count).split(separator: "&") {
                let kv = item.split(separator: "=", maxSplits: 1).map(String.init)
                guard kv.count == 2 else { continue }
                if kv[0] == "code" { code = kv[1] }
                if kv[0] == "fp" { fp = kv[1] }
            }
            guard let code, Pairing.normalize(code).count == 8 else { throw UsageError("--pair: the URI carries no 8-digit code") }
            return .pair(code: code, fingerprint: fp)
        }
        guard Pairing.normalize(text).count == 8, text.allSatisfy({ $0.isNumber || $0 == "-" || $0 == " " }) else {
            throw UsageError("--pair takes the 8-digit code the host shows (like 4821-0937), got \"\(text)\"")
        }
        return .pair(code: text, fingerprint: nil)
    }
}

/// A numeric-address check for `--bind` (the library resolves the rest).
package enum SocketAddressCheck {
    package static func isNumeric(_ s: String) -> Bool {
        var a4 = in_addr(), a6 = in6_addr()
        let h = s.hasPrefix("[") && s.hasSuffix("]") ? String(s.dropFirst().dropLast()) : s
        return inet_pton(AF_INET, h, &a4) == 1 || inet_pton(AF_INET6, h, &a6) == 1
    }
}

/// `--latency auto|low|MS` (mesh-play, mesh-bench fanout): the jitter buffer's mode.
package enum LatencyOption {
    package static func parse(_ v: String) throws(UsageError) -> JitterBuffer.Mode {
        switch v {
        case "auto": return .auto
        case "low": return .low
        default:
            guard let ms = Double(v), ms.isFinite, ms >= 0, ms <= 2_000 else {
                throw UsageError("--latency takes auto, low or milliseconds (0–2000), got \"\(v)\"")
            }
            return .fixed(milliseconds: ms)
        }
    }
}

/// Names for the further files of one `--output` (a host that changed format gets a new file, never a truncated one).
package enum OutputFiles {
    /// `dir/take.wav`, 2 → `dir/take-2.wav`; a name without an extension gets the number at its end.
    package static func numbered(_ path: String, _ n: Int) -> String {
        let slash = path.lastIndex(of: "/")
        if let dot = path.lastIndex(of: "."), slash.map({ dot > $0 }) ?? true, dot != path.startIndex {
            return "\(path[..<dot])-\(n)\(path[dot...])"
        }
        return "\(path)-\(n)"
    }

    /// Whether there is anything at `path`, a link included (even one that leads nowhere: `lstat`, not `stat`).
    package static func isTaken(_ path: String) -> Bool {
        var info = stat()
        return lstat(path, &info) == 0
    }
}
