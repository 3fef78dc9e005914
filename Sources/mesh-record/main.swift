// mesh-record --host: captures the microphone (or a tone or a sound file) and serves it, encrypted, to the players
// paired with this host.
import Dispatch
import FoundationEssentials
import Glibc
import MeshAudio
import MeshCLI
import MeshPOSIX
import MeshRelay
import PeerMesh
import Synchronization

let options = RecordOptions.configurationFromCommandLine()
let terminal = Terminal(program: RecordOptions.program, quiet: options.quiet)

switch options.action {
case .listPaired: DeviceState.listPaired(options.state, what: "player", terminal: terminal, json: options.json)
case .forget(let name): DeviceState.forget(name, options.state, what: "player", terminal: terminal)
case .control(let command): control(command)
case .host: break
}

/// `mesh-record ctl …`: one command to the host running here; its answer on stdout (a QR code too, for `pair`, on a
/// terminal); exit 0 when it worked, 1 when not or when no host runs.
func control(_ command: ControlCommand) -> Never {
    // The default place, then (unless --runtime-dir was given) the service's: `sudo mesh-record ctl pair` from a
    // login shell whose XDG_RUNTIME_DIR points elsewhere still finds mesh-record.service's host.
    var places = [options.runtime]
    let service = RuntimeDirectory("/run/peermesh")
    if !options.runtimeGiven, options.runtime != service { places.append(service) }
    do {
        var reply: ControlReply?
        for (i, place) in places.enumerated() where reply == nil {
            do { reply = try ControlClient.send(command, to: place) } catch {
                if case .noHost = error, i + 1 < places.count { continue }
                throw error
            }
        }
        guard let reply else { terminal.fail("no mesh-record --host is running here") }
        for line in reply.lines { terminal.stdout(line) }
        if reply.ok, case .pair = command, terminal.isTTY,
           let uri = reply.lines.first(where: { $0.hasPrefix("peermesh://pair?") }), let qr = QRCode.lines(for: uri) {
            terminal.raw(qr.joined(separator: "\n") + "\n")
        }
        exit(reply.ok ? 0 : 1)
    } catch {
        terminal.fail("\(error)")
    }
}

let device = DeviceState.open(options.state, name: options.name, terminal: terminal)

let format = AudioFormat(sampleRate: options.rate, channels: options.channels)
let source: any AudioSource
do {
    source = try options.input.makeSource(format: format, periodFrames: options.period)
} catch {
    terminal.fail("\(error)")
}
if let recorder = source as? Recorder, recorder.usesPlugConversion {
    terminal.log("capture device \(recorder.deviceName) does not take \(format) natively; converting through ALSA's plug")
}

// Who may listen. Remote names in event lines are escaped before they reach the terminal.
// The operator's input. On a terminal the m key mutes and unmutes (but not with --accept ask, whose questions read
// whole lines); otherwise stdin takes one command a line: mute, unmute, or m to toggle (questions come first).
let running = Mutex<RelayHost?>(nil)
@Sendable func operatorCommand(_ word: String) {
    guard let host = running.withLock({ $0 }) else { return }
    switch word {
    case "mute": host.isMuted = true
    case "unmute": host.isMuted = false
    case "m": host.isMuted.toggle()
    default: terminal.error("unknown command \"\(TerminalText.escape(word))\" (commands: mute, unmute, m)")
    }
}
let operatorKeys = isatty(STDIN_FILENO) == 1 && options.accept != .ask
let keyInput: StandardInputReader? = operatorKeys
    ? StandardInputReader(key: { byte in if byte == UInt8(ascii: "m") || byte == UInt8(ascii: "M") { operatorCommand("m") } },
                          line: { _ in })
    : nil
let input: StandardInput? = operatorKeys ? nil : StandardInput(commands: { line in
    if let word = line.split(separator: " ").first.map({ $0.lowercased() }) { operatorCommand(word) }
})
let accept: RelayHost.AcceptPolicy
switch options.accept {
case .paired: accept = .paired
case .all:
    accept = .all
    terminal.error("warning: --accept all: anyone on the network can listen to this microphone")
case .ask: accept = .ask(TerminalApproval(terminal: terminal, input: input!))
}

// Discovery: wait for avahi-daemon if it is not up yet; with no system bus at all, serve by address only.
let avahi: AvahiDiscovery?
do {
    avahi = try AvahiDiscovery(waitForDaemon: true, log: { terminal.log(TerminalText.escape($0)) })
} catch {
    terminal.error("\(error)")
    terminal.error("serving without DNS-SD: players join with mesh-play --connect THIS-HOST:PORT")
    avahi = nil
}
let dnssd = avahi != nil
let discovery: any DiscoveryBackend = avahi ?? InProcessDiscovery()

var config = RelayHost.Configuration(identity: device.identity, trust: device.trust, serviceType: options.service,
                                     port: options.port, maximumPeers: options.maxPeers + 1, accept: accept, discovery: discovery)
config.discoveryReachesNetwork = dnssd
config.bindHost = options.bind
config.maximumPlayersPerAddress = options.maxPerAddress
config.codec = options.codec
config.opusBitrate = options.opusBitrate
if let output = options.talkOutput {
    config.talk = RelayHost.TalkOutput(fullDuplex: options.talkFullDuplex) { format in
        switch output {
        case .device(let name): return try Player(device: name, format: format, periodFrames: 128, bufferFrames: 256)
        case .file(let path, let encoding): return try WAVFileSink(path: path, format: format, periodFrames: 128, encoding: encoding)
        }
    }
}
if let dir = options.clips {
    config.clips = ClipRecorder.Configuration(directory: dir, name: device.identity.displayName,
                                              prerollSeconds: options.clipPreroll, maximumSeconds: options.clipLength)
    config.clipQuota = .following(clipSeconds: options.clipLength)
}
let host: RelayHost
// Under systemd (Type=notify): ready once serving and, when avahi-daemon runs, advertised — or as soon as it is
// known that the advertisement must wait (no daemon yet) or failed.
struct Readiness {
    var serving = false
    var told = false
    /// The advertisement's state: live, not live (waiting for the daemon, or failed), or not known yet (probing).
    var live: Bool?
}
let readiness = Mutex(Readiness())
@Sendable func readinessChanged(serving: Bool = false, live: Bool? = nil, giveUpWaiting: Bool = false) {
    let message = readiness.withLock { r -> String? in
        if serving { r.serving = true }
        if let live { r.live = live }
        guard r.serving else { return nil }
        if !dnssd { r.live = false }
        if giveUpWaiting, r.live == nil { r.live = false }
        guard let live = r.live else { return nil }
        let status = live ? "serving, advertised" : (dnssd ? "serving; not advertised (waiting for avahi-daemon)"
                                                           : "serving without DNS-SD (players use --connect)")
        defer { r.told = true }
        return (r.told ? "" : "READY=1\n") + "STATUS=" + status
    }
    if let message { ServiceManager.notify(message) }
}
/// Signalled to stop: by SIGINT/SIGTERM, or by the host when its capture ended on its own.
let done = DispatchSemaphore(value: 0)
/// Why the host could not serve any more (its source failed), if it could not.
let failure = Mutex<String?>(nil)
do {
    host = try RelayHost(configuration: config, source: source, log: { terminal.log(TerminalText.escape($0)) },
                         notice: { terminal.error(TerminalText.escape($0)) },
                         advertised: { live in readinessChanged(live: live) },
                         failure: { why in
                             failure.withLock { $0 = why }
                             done.signal()
                         })
    try host.start()
    running.withLock { $0 = host }
} catch {
    terminal.fail("\(error)")
}
terminal.log("serving \"\(TerminalText.escape(device.identity.displayName))\" (\(source.format), period \(source.periodFrames), codec \(options.codec == .opus ? "opus \(options.opusBitrate / 1000) kbit/s" : options.codec.description)) on port \(host.port), "
    + "key \(device.identity.publicKey.shortFingerprint), accepting \(options.accept.rawValue) players")

// `mesh-record ctl` talks to this host through a socket only its user (and root) may use.
let controlServer: ControlServer?
do {
    controlServer = try ControlServer(directory: options.runtime) { command in hostControl(command) }
} catch {
    controlServer = nil
    terminal.error("no control socket (\(error)); mesh-record ctl cannot reach this host")
}

/// What the running host does for `mesh-record ctl`.
@Sendable func hostControl(_ command: ControlCommand) -> ControlReply {
    switch command {
    case .status:
        let s = host.statistics
        var lines = ["\(device.identity.displayName) (key \(device.identity.publicKey.shortFingerprint)) on port \(host.port): "
            + "\(s.players.count) player\(s.players.count == 1 ? "" : "s")" + (s.muted ? ", muted" : "")
            + (s.pairing ? ", pairing open" : "") + (s.advertised ? ", advertised" : ", not advertised")]
        for p in s.players {
            let alias = p.pairedName == nil ? "\tnot paired" : p.callsItself.map { "\tcalls itself \"\(TerminalText.escape($0))\"" } ?? ""
            lines.append("  \(TerminalText.escape(p.name))\t\(p.address ?? "?")\t\(p.fingerprint ?? "-")\(alias)")
        }
        lines.append(StatusReport.json(host: s, name: device.identity.displayName, port: host.port, format: source.format).description)
        return ControlReply(ok: true, lines)
    case .pair(let seconds):
        let timeout = seconds ?? options.pairTimeout
        do {
            let code = try host.openPairingWindow(timeout: .milliseconds(Int64(timeout * 1000)))
            let uri = "peermesh://pair?code=\(Pairing.normalize(code))&fp=\(device.identity.publicKey.shortFingerprint)"
            // The code goes to the one who asked, not to the log (readable by more people than should pair).
            terminal.error("pairing window opened by mesh-record ctl pair (\(JSONObject.number(timeout)) s)")
            return ControlReply(ok: true, ["pairing code: \(code)", uri,
                                           "on the player: mesh-play --pair \(code)   (the window closes in \(JSONObject.number(timeout)) s)"])
        } catch {
            return ControlReply(ok: false, ["cannot open a pairing window: \(error)"])
        }
    case .paired:
        do {
            let entries = try device.trust.list()
            if entries.isEmpty { return ControlReply(ok: true, ["no paired players"]) }
            return ControlReply(ok: true, entries.map(DeviceState.pairedLine))
        } catch {
            return ControlReply(ok: false, ["cannot read the paired players: \(error)"])
        }
    case .forget(let name):
        do {
            let gone = try device.trust.remove(matching: name)
            guard !gone.isEmpty else {
                return ControlReply(ok: false, ["no paired player matches \"\(TerminalText.escape(name))\""])
            }
            host.trustChanged()
            return ControlReply(ok: true, gone.map { "forgot \(TerminalText.escape($0.name)) (\($0.publicKey.shortFingerprint))" })
        } catch {
            return ControlReply(ok: false, ["cannot forget \"\(TerminalText.escape(name))\": \(error)"])
        }
    case .mute:
        host.isMuted = true
        return ControlReply(ok: true, ["microphone muted"])
    case .unmute:
        host.isMuted = false
        return ControlReply(ok: true, ["microphone unmuted"])
    }
}

if options.pair {
    do {
        let code = try host.openPairingWindow(timeout: .milliseconds(Int64(options.pairTimeout * 1000)))
        // The code is printed even with --quiet: it is what the person asked for.
        terminal.error("pairing code: \(code)")
        let uri = "peermesh://pair?code=\(Pairing.normalize(code))&fp=\(device.identity.publicKey.shortFingerprint)"
        if terminal.isTTY, let qr = QRCode.lines(for: uri) {
            terminal.raw(qr.joined(separator: "\n") + "\n" + uri + "\n")
        }
        terminal.error("on the player: mesh-play --pair \(code)   (the window closes in \(JSONObject.number(options.pairTimeout)) s)")
    } catch {
        terminal.fail("\(error)")
    }
}

readinessChanged(serving: true)
// Avahi's probing takes about a second; a publication that never settles must not hold the service back for good.
DispatchQueue.global().asyncAfter(deadline: .now() + 10) { readinessChanged(giveUpWaiting: true) }
if let loop = try? EventLoop.shared() { ServiceManager.feedWatchdog(from: loop) }

let trap = SignalTrap(queue: .global()) { _ in done.signal() }
let ticker = StatusTicker(label: "mesh-record.status") { hold in
    let s = host.statistics
    terminal.status(StatusReport.line(host: s, format: source.format, hold: hold.update(s.peakLevel),
                                      keys: operatorKeys ? ["m mute"] : []))
    if options.json { terminal.stdout(StatusReport.json(host: s, name: device.identity.displayName, port: host.port, format: source.format).description) }
}
done.wait()
terminal.exitIfStopTakesLonger(than: 5)
ticker.cancel()
keyInput?.restore()
terminal.finish()
let final = host.statistics
terminal.log("stopping: saying goodbye to \(final.players.count) player(s)")
ServiceManager.notify("STOPPING=1")
controlServer?.stop()
host.stop()
if options.json {
    terminal.stdout(StatusReport.json(host: final, name: device.identity.displayName, port: host.port, format: source.format, final: true).description)
}
withExtendedLifetime((trap, input, keyInput)) {}
// A host whose capture ended on its own did not do its job: say why, and exit 1 (a service is restarted).
if let why = failure.withLock({ $0 }) {
    terminal.error(TerminalText.escape(why))
    exit(1)
}
exit(0)
