// mesh-record --host: captures the microphone (or a tone or a sound file) and serves it, encrypted, to the players
// paired with this host.
import Foundation
import MeshAudio
import MeshCLI
import MeshPOSIX
import MeshRelay
import PeerMesh

let options = RecordOptions.configurationFromCommandLine()
let terminal = Terminal(program: RecordOptions.program, quiet: options.quiet)

switch options.action {
case .listPaired: DeviceState.listPaired(options.state, what: "player", terminal: terminal, json: options.json)
case .forget(let name): DeviceState.forget(name, options.state, what: "player", terminal: terminal)
case .host: break
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
let input = StandardInput()
let accept: RelayHost.AcceptPolicy
switch options.accept {
case .paired: accept = .paired
case .all:
    accept = .all
    terminal.error("warning: --accept all: anyone on the network can listen to this microphone")
case .ask: accept = .ask(TerminalApproval(terminal: terminal, input: input))
}

// Discovery: wait for avahi-daemon if it is not up yet; with no system bus at all, serve by address only.
let discovery: any DiscoveryBackend
var dnssd = true
do {
    discovery = try AvahiDiscovery(waitForDaemon: true, log: { terminal.log(TerminalText.escape($0)) })
} catch {
    terminal.error("\(error)")
    terminal.error("serving without DNS-SD: players join with mesh-play --connect THIS-HOST:PORT")
    discovery = InProcessDiscovery()
    dnssd = false
}

var config = RelayHost.Configuration(identity: device.identity, trust: device.trust, serviceType: options.service,
                                     port: options.port, maximumPeers: options.maxPeers + 1, accept: accept, discovery: discovery)
config.discoveryReachesNetwork = dnssd
config.bindHost = options.bind
config.maximumPlayersPerAddress = options.maxPerAddress
let host: RelayHost
do {
    host = try RelayHost(configuration: config, source: source, log: { terminal.log(TerminalText.escape($0)) },
                         notice: { terminal.error(TerminalText.escape($0)) })
    try host.start()
} catch {
    terminal.fail("\(error)")
}
terminal.log("serving \"\(TerminalText.escape(device.identity.displayName))\" (\(source.format), period \(source.periodFrames)) on port \(host.port), "
    + "key \(device.identity.publicKey.shortFingerprint), accepting \(options.accept.rawValue) players")

if options.pair {
    do {
        let code = try host.openPairingWindow(timeout: .seconds(Int64(options.pairTimeout)))
        // The code is printed even with --quiet: it is what the person asked for.
        terminal.error("pairing code: \(code)")
        let uri = "peermesh://pair?code=\(Pairing.normalize(code))&fp=\(device.identity.publicKey.shortFingerprint)"
        if terminal.isTTY, let qr = QRCode.lines(for: uri) {
            terminal.raw(qr.joined(separator: "\n") + "\n" + uri + "\n")
        }
        terminal.error("on the player: mesh-play --pair \(code)   (the window closes in \(Int(options.pairTimeout)) s)")
    } catch {
        terminal.fail("\(error)")
    }
}

let done = DispatchSemaphore(value: 0)
let trap = SignalTrap(queue: .global()) { _ in done.signal() }
let reporter = DispatchQueue(label: "mesh-record.status")
let hold = PeakHold()
let ticker = DispatchSource.makeTimerSource(queue: reporter)
ticker.schedule(deadline: .now() + 1, repeating: 1)
ticker.setEventHandler {
    let s = host.statistics
    terminal.status(StatusReport.line(host: s, format: source.format, hold: hold.update(s.peakLevel)))
    if options.json { terminal.stdout(StatusReport.json(host: s, name: device.identity.displayName, port: host.port, format: source.format).description) }
}
ticker.resume()
done.wait()
ticker.cancel()
terminal.finish()
let final = host.statistics
terminal.log("stopping: saying goodbye to \(final.players.count) player(s)")
host.stop()
if options.json {
    terminal.stdout(StatusReport.json(host: final, name: device.identity.displayName, port: host.port, format: source.format, final: true).description)
}
withExtendedLifetime((trap, input)) {}
exit(0)
