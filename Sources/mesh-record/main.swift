// mesh-record --host: captures the microphone (or a tone or WAV file) and serves it to every mesh-play on the LAN.
import Foundation
import MeshAudio
import MeshCLI
import MeshRelay
import PeerMesh

let options = RecordOptions.configurationFromCommandLine()
let terminal = Terminal(program: RecordOptions.program, quiet: options.quiet)

func fail(_ text: String) -> Never { terminal.fail(text) }

let format = AudioFormat(sampleRate: options.rate, channels: options.channels)
let source: any AudioSource
do {
    switch options.input {
    case .device(let name):
        source = try Recorder(device: name, format: format, periodFrames: options.period)
    case .tone(let hz):
        source = try ToneSource(frequency: hz, format: format, periodFrames: options.period)
    case .file(let path):
        source = try WAVFileSource(path: path, periodFrames: options.period, loop: true)
    }
} catch {
    fail("\(error)")
}

let accept: RelayHost.AcceptPolicy
if options.acceptAll {
    accept = .all
} else {
    accept = .ask { peer in
        // As MC's invitation handler: ask the person at the terminal. No terminal (or EOF) means no.
        FileHandle.standardError.write(Data("mesh-record: accept player \"\(peer.displayName)\"? [y/N] ".utf8))
        guard let answer = readLine() else { return false }
        return answer.lowercased().hasPrefix("y")
    }
}

var config = RelayHost.Configuration(name: options.name, serviceType: options.service, port: options.port,
                                     maximumPeers: options.maxPeers + 1, accept: accept)
let host: RelayHost
do {
    host = try RelayHost(configuration: config, source: source, log: { terminal.log($0) })
} catch PeerMeshError.discovery(let why) {
    // No DNS-SD here: still serve, so players can join with --connect.
    terminal.error(why)
    terminal.error("serving without DNS-SD; players can join with mesh-play --connect <this host's address>:<port>")
    config.discovery = InProcessDiscovery()
    do { host = try RelayHost(configuration: config, source: source, log: { terminal.log($0) }) } catch { fail("\(error)") }
} catch {
    fail("\(error)")
}
do { try host.start() } catch { fail("\(error)") }
terminal.log("serving \"\(options.name)\" (\(source.format), period \(source.periodFrames)) on port \(host.port) as _\(options.service)._tcp")

let done = DispatchSemaphore(value: 0)
let trap = SignalTrap(queue: .global()) { _ in done.signal() }
let reporter = DispatchQueue(label: "mesh-record.status")
let ticker = DispatchSource.makeTimerSource(queue: reporter)
ticker.schedule(deadline: .now() + 1, repeating: 1)
ticker.setEventHandler {
    let s = host.statistics
    terminal.status(StatusReport.line(host: s, format: source.format))
    if options.json { terminal.stdout(StatusReport.encode(StatusReport.json(host: s, name: options.name, port: host.port, format: source.format))) }
}
ticker.resume()
done.wait()
ticker.cancel()
terminal.finish()
terminal.log("stopping: saying goodbye to \(host.statistics.players.count) player(s)")
host.stop()
_ = trap
exit(0)
