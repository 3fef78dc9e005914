// mesh-play: finds a paired mesh-record host on the LAN (or at an address), joins it and plays; or pairs with one.
import Dispatch
import FoundationEssentials
import Glibc
import MeshAudio
import MeshCLI
import MeshPOSIX
import MeshRelay
import PeerMesh
import Synchronization

let options = PlayOptions.configurationFromCommandLine()
let terminal = Terminal(program: PlayOptions.program, quiet: options.quiet)

switch options.action {
case .listPaired: DeviceState.listPaired(options.state, what: "host", terminal: terminal, json: options.json)
case .forget(let name): DeviceState.forget(name, options.state, what: "host", terminal: terminal)
case .list: listHosts()
case .pair(let code, let fingerprint): pair(code: code, fingerprint: fingerprint)
case .play: break
}

/// `--list`: the hosts found within two seconds (or `--duration`), paired or not; exit 1 when none.
func listHosts() -> Never {
    final class Lister: NearbyServiceBrowserDelegate, Sendable {
        let found = Mutex<[PeerID: (info: [String: String], endpoints: [String])]>([:])
        func browser(_ browser: NearbyServiceBrowser, foundPeer peer: PeerID, withDiscoveryInfo info: [String: String]?) {
            let endpoints = browser.foundPeers.first { $0.peer == peer }?.endpoints.map(\.description) ?? []
            found.withLock { $0[peer] = (info ?? [:], endpoints) }
        }
        func browser(_ browser: NearbyServiceBrowser, lostPeer peer: PeerID) {}
    }
    let seconds = options.duration ?? 2
    do {
        let trust = DeviceState.trustOnly(options.state)
        let browser = try NearbyServiceBrowser(peer: try PeerID(displayName: options.name ?? RecordOptions.defaultName), serviceType: options.service,
                                               discovery: try AvahiDiscovery(log: { terminal.log(TerminalText.escape($0)) }))
        let lister = Lister()
        browser.delegate = lister
        try browser.startBrowsingForPeers()
        MonotonicClock.sleep(untilNanos: MonotonicClock.nowNanos() + UInt64(min(seconds, 1e6) * 1e9))  // (no overflow)
        browser.stopBrowsingForPeers()
        // A paired host is listed by the name it was paired under (what --host matches), with the one it advertises
        // when that differs.
        let hosts = lister.found.withLock { $0 }.map { peer, entry in
            (peer: peer, entry: entry, paired: peer.publicKey.flatMap { (try? trust.entry(for: $0)) ?? nil })
        }.sorted { ($0.paired?.name ?? $0.peer.displayName) < ($1.paired?.name ?? $1.peer.displayName) }
        if options.json {
            terminal.stdout(JSONObject.array(hosts.map { h in
                var o = JSONObject()
                o.add("name", h.paired?.name ?? h.peer.displayName)
                o.add("advertisedName", h.peer.displayName)
                o.add("fingerprint", h.peer.publicKey?.shortFingerprint)
                o.add("paired", h.paired != nil)
                o.add("pairing", h.entry.info["pair"] == "1")
                o.add("endpoints", h.entry.endpoints)
                return o
            }))
        } else {
            for h in hosts {
                var tags: [String] = [h.paired != nil ? "paired" : "not paired"]
                if let name = h.paired?.name, name != h.peer.displayName {
                    tags.append("calls itself \"\(TerminalText.escape(h.peer.displayName))\"")
                }
                if h.entry.info["pair"] == "1" { tags.append("pairing open") }
                terminal.stdout("\(TerminalText.escape(h.paired?.name ?? h.peer.displayName))\t\(h.peer.publicKey?.shortFingerprint ?? "-")\t"
                    + "\(tags.joined(separator: ", "))\t\(h.entry.endpoints.joined(separator: ","))")
            }
        }
        if hosts.isEmpty {
            terminal.error("no hosts found (service _\(options.service)._tcp, \(JSONObject.number(seconds)) s)")
            exit(1)
        }
        exit(0)
    } catch {
        terminal.fail("\(error)")
    }
}

/// `--pair CODE`: pair with the host whose window is open, then exit (0 paired, 1 with the reason).
func pair(code: String, fingerprint: String?) -> Never {
    let device = DeviceState.open(options.state, name: options.name, terminal: terminal)
    let target: JoinTarget = options.connect.map { .direct($0) } ?? .discover(hostName: options.hostName)
    var config = PairingClient.Configuration(identity: device.identity, trust: device.trust, code: code, target: target)
    config.expectedFingerprint = fingerprint
    config.serviceType = options.service
    do {
        if case .discover = target { config.discovery = try AvahiDiscovery(log: { terminal.log(TerminalText.escape($0)) }) }
        let client = try PairingClient(configuration: config, log: { terminal.log(TerminalText.escape($0)) })
        switch client.run() {
        case .paired(let host, let name):
            let note = TerminalText.escape(storedNameNote(storedAs: name, given: host.displayName))
            terminal.error("paired with \(TerminalText.escape(host.displayName)) (\(host.publicKey?.shortFingerprint ?? "?"))\(note)")
            exit(0)
        case .failed(let why):
            terminal.fail("pairing failed: \(TerminalText.escape(why))")
        }
    } catch {
        terminal.fail("\(error)")
    }
}

// A --buttons device that cannot be read is said before anything starts.
if let path = options.buttons {
    do { try ButtonReader.check(path) } catch { terminal.fail("\(error)") }
}
let device = DeviceState.open(options.state, name: options.name, terminal: terminal)
let target: JoinTarget = options.connect.map { .direct($0) } ?? .discover(hostName: options.hostName)
let output = options.output
/// Files that hold audio: a host that changes format mid-stream gets a new file (`out-2.wav`…), never a truncated
/// one; a name nothing (not even a link) holds yet is the only kind written, and it is created exclusively.
let filesWritten = Mutex(1)
let makeSink: RelayPlayer.SinkFactory = { format, request in
    switch output {
    // Two periods of device buffer: the jitter buffer upstream absorbs the network; the device needs only to
    // ride out scheduling.
    case .device(let name): return try Player(device: name, format: format, periodFrames: 128, bufferFrames: 256)
    case .file(let path, let encoding):
        guard request == .formatChange else { return try WAVFileSink(path: path, format: format, periodFrames: 128, encoding: encoding) }
        while true {
            let file = filesWritten.withLock { n in
                var file = path
                repeat { n += 1; file = OutputFiles.numbered(path, n) } while OutputFiles.isTaken(file)
                return file
            }
            do {
                let sink = try WAVFileSink(path: file, format: format, periodFrames: 128, encoding: encoding, exclusive: true)
                terminal.log("writing \(format) to \(file) (the host changed format; \(path) is kept as it was)")
                return sink
            } catch where OutputFiles.isTaken(file) {
                continue  // something took the name meanwhile (the exclusive create refused it): the next number
            }
        }
    }
}

let done = DispatchSemaphore(value: 0)
let gaveUp = Mutex<String?>(nil)
let player: RelayPlayer
do {
    var config = RelayPlayer.Configuration(target: target, identity: device.identity, hosts: .paired(device.trust),
                                           serviceType: options.service, latency: options.latency)
    if case .discover = target { config.discovery = try AvahiDiscovery(log: { terminal.log(TerminalText.escape($0)) }) }
    config.maximumConnectAttempts = 5
    config.beep = options.beep
    config.talkSource = try options.talkInput?.makeSource(format: RelayPlayer.talkFormat, periodFrames: 128)
    player = try RelayPlayer(configuration: config, makeSink: makeSink, log: { terminal.log(TerminalText.escape($0)) },
                             onGiveUp: { why in
                                 gaveUp.withLock { $0 = why }
                                 done.signal()
                             })
    player.controls.volumeDB = options.volume
    try player.start()
} catch {
    terminal.fail("\(error)")
}

// The listener's controls: keys on a terminal, one command a line otherwise. Results are event lines.
@Sendable func apply(_ command: ListenerCommand) {
    let controls = player.controls
    switch command {
    case .remote(let c):
        player.send(c)
    case .mute(let on):
        controls.muted = on
        terminal.log(on ? "muted" : "unmuted")
    case .toggleMute:
        apply(.mute(!controls.muted))
    case .volume(let db):
        controls.volumeDB = db
        terminal.log("volume \(JSONObject.number(controls.volumeDB)) dB")
    case .volumeStep(let step):
        apply(.volume(min(max(controls.volumeDB + step, OutputControls.volumeRange.lowerBound), OutputControls.volumeRange.upperBound)))
    case .togglePause:
        player.send(player.statistics.hostControl?.paused == true ? .resume : .pause)
    case .toggleTalk:
        player.toggleTalk()
    }
}
let input = StandardInputReader(key: { byte in
    if let c = ListenerCommand.key(byte) { apply(c) }
}, line: { line in
    switch ListenerCommand.parse(line) {
    case .success(let c)?: apply(c)
    case .failure(let why)?: terminal.error(why.description)
    case nil: break
    }
})
let buttons: ButtonReader?
do {
    buttons = try options.buttons.map { try ButtonReader(path: $0, onCommand: apply) }
} catch {
    terminal.fail("\(error)")
}
// What the keys do, at the end of the status line; space talks only with a talk source.
let keys = !input.isTerminal ? [] : ["p pause", "m mute", "+/- vol", "c clip"] + (options.talkInput == nil ? [] : ["space talk"])

// Under systemd (mesh-play@HOST.service): ready once playing or searching, the phase as its status line, and a
// watchdog fed from the I/O loop.
ServiceManager.ready(status: StatusReport.phase(player.statistics.phase))
if let loop = try? EventLoop.shared() { ServiceManager.feedWatchdog(from: loop) }

let trap = SignalTrap(queue: .global()) { _ in done.signal() }
let ticker = StatusTicker(label: "mesh-play.status") { hold in
    let s = player.statistics
    terminal.status(StatusReport.line(player: s, hold: hold.update(s.playout.peakLevel), keys: keys))
    if ServiceManager.isManaged { ServiceManager.status(StatusReport.phase(s.phase)) }
    if options.json { terminal.stdout(StatusReport.json(player: s).description) }
}
if let d = options.duration {
    _ = done.wait(timeout: .now() + d)
} else {
    done.wait()
}
terminal.exitIfStopTakesLonger(than: 5)
ticker.cancel()
input.restore()
terminal.finish()
let final = player.statistics
player.stop()
if options.json { terminal.stdout(StatusReport.json(player: final, final: true).description) }
let rate = Double(final.format.sampleRate)
terminal.log("received \(JSONObject.number(Double(final.framesReceived) / rate)) s of audio "
    + "(played \(JSONObject.number(Double(final.device.framesOut) / rate)) s); loss \(JSONObject.number(final.playout.lossPercent)) %, "
    + "concealed \(JSONObject.number(final.concealedMilliseconds)) ms, waiting \(JSONObject.number(final.waitingMilliseconds)) ms")

// A run that played nothing from a host did not do its job: say why and exit 1.
if final.framesReceived == 0 {
    var why = gaveUp.withLock { $0 }
    if why == nil {
        switch target {
        case .direct(let e): why = "no audio from \(e) (not reachable, it did not let this player in, or it sent none)"
        case .discover(let name):
            let wanted = name.map { "host \"\($0)\"" } ?? "paired host"
            let seen = final.seen.map { h in
                let alias = h.name == h.peer.displayName ? "" : ", calls itself \"\(h.peer.displayName)\""
                return "\(h.name) (\(h.trusted ? "paired" : "not paired")\(alias))"
            }
            why = "no \(wanted) found (service _\(options.service)._tcp)" + (seen.isEmpty ? "; no hosts seen at all" : "; saw: \(seen.joined(separator: ", "))")
        }
    }
    terminal.error(TerminalText.escape(why!))
    exit(1)
}
if let why = gaveUp.withLock({ $0 }) {
    terminal.error(TerminalText.escape(why))
    exit(1)
}
withExtendedLifetime((trap, buttons)) {}
exit(0)
