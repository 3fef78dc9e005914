// mesh-play --find: discovers a mesh-record host on the LAN, joins it and plays.
import Foundation
import MeshAudio
import MeshCLI
import MeshRelay
import PeerMesh
import Synchronization

let options = PlayOptions.configurationFromCommandLine()
let terminal = Terminal(program: PlayOptions.program, quiet: options.quiet)

func fail(_ text: String) -> Never { terminal.fail(text) }

// --list: print the hosts found within two seconds, then exit.
if options.list {
    final class Lister: NearbyServiceBrowserDelegate, @unchecked Sendable { // only touched on the browser's queue
        func browser(_ browser: NearbyServiceBrowser, foundPeer peer: PeerID, withDiscoveryInfo info: [String: String]?) {
            let endpoints = browser.foundPeers.first { $0.peer == peer }?.endpoints.map(\.description).joined(separator: ",") ?? ""
            let details = (info ?? [:]).sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
            print("\(peer.displayName)\t\(endpoints)\t\(details)")
        }
        func browser(_ browser: NearbyServiceBrowser, lostPeer peer: PeerID) {}
    }
    do {
        let me = try PeerID(displayName: options.name)
        let browser = try NearbyServiceBrowser(peer: me, serviceType: options.service)
        let lister = Lister()
        browser.delegate = lister
        try browser.startBrowsingForPeers()
        Thread.sleep(forTimeInterval: options.duration ?? 2)
        browser.stopBrowsingForPeers()
        exit(0)
    } catch {
        fail("\(error)")
    }
}

let target: JoinTarget = options.connect.map { .direct($0) } ?? .discover(hostName: options.hostName)
let output = options.output
let makeSink: RelayPlayer.SinkFactory = { format in
    switch output {
    // Two periods of device buffer: the jitter buffer upstream absorbs the network; the device needs only to
    // ride out scheduling.
    case .device(let name): try Player(device: name, format: format, periodFrames: 128, bufferFrames: 256)
    case .file(let path): try WAVFileSink(path: path, format: format, periodFrames: 128)
    }
}

let done = DispatchSemaphore(value: 0)
let exitCode = Mutex<Int32>(0)
let player: RelayPlayer
do {
    var config = RelayPlayer.Configuration(target: target, name: options.name, serviceType: options.service, latency: options.latency)
    config.maximumConnectAttempts = 5
    player = try RelayPlayer(configuration: config, makeSink: makeSink, log: { terminal.log($0) }, onGiveUp: { _ in
        exitCode.withLock { $0 = 1 }
        done.signal()
    })
    try player.start()
} catch {
    fail("\(error)")
}

let trap = SignalTrap(queue: .global()) { _ in done.signal() }
let reporter = DispatchQueue(label: "mesh-play.status")
let ticker = DispatchSource.makeTimerSource(queue: reporter)
ticker.schedule(deadline: .now() + 1, repeating: 1)
ticker.setEventHandler {
    let s = player.statistics
    terminal.status(StatusReport.line(player: s))
    if options.json { terminal.stdout(StatusReport.encode(StatusReport.json(player: s))) }
}
ticker.resume()
if let d = options.duration {
    _ = done.wait(timeout: .now() + d)
} else {
    done.wait()
}
ticker.cancel()
terminal.finish()
let final = player.statistics
player.stop()
if options.json {
    var summary = StatusReport.json(player: final)
    summary["final"] = true
    terminal.stdout(StatusReport.encode(summary))
}
terminal.log(String(format: "received %.1f s of audio (played %.1f s); loss %.2f%%, concealed %.0f ms",
                    Double(final.framesReceived) / Double(final.format.sampleRate),
                    Double(final.device.framesOut) / Double(final.format.sampleRate), final.playout.lossPercent,
                    final.playout.concealedMilliseconds))
_ = trap
exit(exitCode.withLock { $0 })
