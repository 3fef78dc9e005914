import Foundation
import MeshAudio
import MeshImpair
import MeshPipeline
import MeshTestSupport
import PeerMesh
import Testing
@testable import MeshRelay

/// The relay assembled from the library in one process: real UDP on 127.0.0.1, real-time paced tone source and
/// WAV sinks, in-process discovery (direct connects).
@Suite("Relay in one process (fan-out, impairment)", .serialized)
struct RelayInProcessTests {
    let paired: PairedStates

    init() throws { paired = try PairedStates(players: 8, hostName: "inproc-host") }

    func makeHost(name: String, port: UInt16 = 0) throws -> RelayHost {
        let tone = try ToneSource(frequency: 440, amplitude: 0.5, format: .default, periodFrames: 128)
        var config = RelayHost.Configuration(identity: try paired.host.renamed(name), trust: paired.hostTrust,
                                             serviceType: "pmr-inproc", port: port, maximumPeers: 33,
                                             discovery: InProcessDiscovery())
        config.maximumPlayersPerAddress = 8   // every player of this test is on 127.0.0.1
        let host = try RelayHost(configuration: config, source: tone)
        try host.start()
        return host
    }

    func makePlayer(_ i: Int, endpoint: PeerEndpoint, out: String, latency: JitterBuffer.Mode = .auto) throws -> RelayPlayer {
        let config = RelayPlayer.Configuration(target: .direct(endpoint), identity: try paired.playerIdentity(i),
                                               hosts: .paired(paired.playerTrust(i)), latency: latency,
                                               discovery: InProcessDiscovery())
        let player = try RelayPlayer(configuration: config) { format in
            try WAVFileSink(path: out, format: format, periodFrames: 128)
        }
        try player.start()
        return player
    }

    @Test("Fan-out: one host serves eight players at once, each gets the tone with nothing lost")
    func fanOutEight() throws {
        let host = try makeHost(name: "fan-host")
        defer { host.stop() }
        let endpoint = PeerEndpoint(host: "127.0.0.1", port: host.port)
        var players: [(RelayPlayer, String)] = []
        for i in 0..<8 {
            let out = Rig.tempPath("fan-\(i).wav")
            players.append((try makePlayer(i, endpoint: endpoint, out: out), out))
        }
        #expect(eventually(10) { host.statistics.players.count == 8 }, "players joined: \(host.statistics.players.count)")
        Thread.sleep(forTimeInterval: 2)
        var totals: [UInt64] = []
        for (p, _) in players {
            let s = p.statistics
            totals.append(s.playout.received)
            print("fan-out player: duplicates \(s.playout.duplicates) overflows \(s.playout.ringOverflows) resyncs \(s.playout.resyncs) mismatches \(s.playout.formatMismatches) lostFrames \(s.playout.lostFrames) unauthentic \(s.unauthenticDatagrams) stranger \(s.strangerDatagrams) host not sent \(host.session.statistics.datagramsNotSent) received \(s.playout.received) lost \(s.playout.lostPackets) late \(s.playout.late) underruns \(s.playout.underruns) concealed \(s.playout.concealedFrames) skipped \(s.playout.skippedFrames) stretched \(s.playout.stretchedFrames) resampling \(s.playout.resampling) drift \(s.playout.driftPPM) target \(s.playout.targetMilliseconds) jitter \(s.playout.peakJitterMilliseconds)")
            #expect(s.playout.lostPackets == 0)
            #expect(!s.playout.resampling, "one clock: the drift loop stays off")
            #expect(s.playout.received > 500, "received \(s.playout.received)")
            p.stop()
        }
        for (_, out) in players {
            let samples = try readWAV(out).samples
            // From 100 ms after the first audio (past the fade-in) it is the tone: a 0.5-amplitude sine, whose
            // steps never exceed 0.5·2π·440/44100 — any click would show as a bigger jump.
            let from = (samples.firstIndex { $0 != 0 } ?? 0) + 4_410
            let body = samples[min(from, samples.count)...]
            #expect(body.count > 44_100)
            #expect(abs((body.max() ?? 0) - 0.5) < 0.01)
            #expect(largestJump(body) < 0.5 * 2 * Float.pi * 440 / 44_100 * 1.25)
        }
        print("fan-out: packets received per player \(totals)")
    }

    @Test("Through the impairment proxy (5 % loss, reordering, jitter): playback goes on, loss is counted exactly, concealment is smooth")
    func throughImpairment() throws {
        let host = try makeHost(name: "impaired-host")
        defer { host.stop() }
        var config = ImpairmentProxy.Configuration(target: .init(host: "127.0.0.1", port: host.port))
        config.seed = 42
        config.loss = 0.05
        config.reorder = 0.05
        config.delayMilliseconds = 3
        config.jitterMilliseconds = 3
        config.direction = .fromTarget
        let proxy = try ImpairmentProxy(configuration: config)
        let listen = try proxy.start()
        defer { proxy.stop() }
        let out = Rig.tempPath("impaired.wav")
        let player = try makePlayer(0, endpoint: PeerEndpoint(host: listen.host, port: listen.port), out: out)
        #expect(eventually(10) { host.statistics.players.count == 1 })
        Thread.sleep(forTimeInterval: 4)
        // Stop the host first so nothing is in flight, then let the player drain.
        host.stop()
        Thread.sleep(forTimeInterval: 0.3)
        let s = player.statistics
        player.stop()
        let p = proxy.statistics.fromTarget
        print("impairment: proxy received \(p.received) to-target \(proxy.statistics.toTarget.received); dropped \(p.dropped) (\(p.droppedPeerMeshData) audio), reordered \(p.reordered); player lost \(s.playout.lostPackets), late \(s.playout.late), concealed \(s.playout.concealedMilliseconds) ms, underruns \(s.playout.underruns)")
        #expect(p.droppedPeerMeshData > 20, "the proxy did drop audio")
        // Every drop the player can see (all but those after the last delivered packet) is counted lost, no more.
        #expect(s.playout.lostPackets == p.droppedPeerMeshData - p.trailingDroppedPeerMeshData)
        #expect(s.playout.concealedFrames > 0)

        // Playback went on, and concealment boundaries are far smoother than zero-filling the same gaps.
        let samples = try readWAV(out).samples
        let start = (samples.firstIndex { $0 != 0 } ?? 0) + 4_410
        let body = samples[start..<max(start, samples.count - 4_410)]
        #expect(body.count > 2 * 44_100, "at least two seconds played")
        let concealedJump = largestJump(body)
        // Zero-filling: the same tone with the same number of packet-sized gaps cut to silence.
        var zeroFilled = (0..<body.count).map { 0.5 * sin(2 * Float.pi * 440 * Float($0) / 44_100) }
        var rng = SplitMix(seed: 1)
        for _ in 0..<Int(p.droppedPeerMeshData) {
            let at = Int(rng.next() % UInt64(max(1, zeroFilled.count - 128)))
            for i in at..<(at + 128) { zeroFilled[i] = 0 }
        }
        let zeroJump = largestJump(zeroFilled[...])
        print("largest sample-to-sample jump: concealed \(concealedJump), zero-filled \(zeroJump)")
        #expect(concealedJump < zeroJump / 4)
    }
}
