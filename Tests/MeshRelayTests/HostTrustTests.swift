import Foundation
import MeshAudio
import MeshTestSupport
import PeerMesh
import Synchronization
import Testing
@testable import MeshRelay

/// Whom a host lets in beyond its trust store: a store that cannot be read or written vouches for nobody (the host
/// fails closed, and says why); an operator who is asked sees the check code the waiting player shows.
/// In one process: real UDP on 127.0.0.1, a paced tone, WAV sinks, in-process discovery.
@Suite("Host trust: store failures, and the operator's check code", .serialized)
struct HostTrustTests {
    /// Lines a host logged, by kind.
    final class Lines: Sendable {
        let events = Mutex<[String]>([]), notices = Mutex<[String]>([])
        /// Whether a notice (the operator's lines) contains `text`.
        func noticed(_ text: String) -> Bool { notices.withLock { $0.contains { $0.contains(text) } } }
        /// Whether an event line contains `text`.
        func logged(_ text: String) -> Bool { events.withLock { $0.contains { $0.contains(text) } } }
    }

    /// Answers every join request with `decision`, `after` seconds later; the check codes it was shown (at once,
    /// revealed to the player) go to `shown`.
    struct Operator: PlayerApproval {
        let decision: JoinDecision
        var after = 0.0
        var shown: Lines?
        func ask(_ request: JoinRequest, decide: @escaping @Sendable (JoinDecision) -> Void) {
            if shown != nil { request.revealShortAuthenticationString() }
            shown?.events.withLock { $0.append(request.shortAuthenticationString) }
            shown?.notices.withLock { $0.append(request.namesakeFingerprint ?? "none") }
            guard after > 0 else { return decide(decision) }
            DispatchQueue.global().asyncAfter(deadline: .now() + after) { [decision] in decide(decision) }
        }
    }

    /// Bytes that are no trust store: the host must neither trust them nor overwrite them.
    static let damage = Data("{\"format\": \"peermesh-trust-1\", \"peers\": [truncated".utf8)

    func makeHost(_ paired: PairedStates, name: String, accept: RelayHost.AcceptPolicy, lines: Lines) throws -> RelayHost {
        let tone = try ToneSource(frequency: 440, amplitude: 0.5, format: .default, periodFrames: 128)
        let config = RelayHost.Configuration(identity: try paired.host.renamed(name), trust: paired.hostTrust,
                                             serviceType: "pmr-trustfail", accept: accept, discovery: InProcessDiscovery())
        let host = try RelayHost(configuration: config, source: tone, log: { line in lines.events.withLock { $0.append(line) } },
                                 notice: { line in lines.notices.withLock { $0.append(line) } })
        try host.start()
        return host
    }

    func makePlayer(_ paired: PairedStates, host: RelayHost, out: String, log: @escaping @Sendable (String) -> Void = { _ in }) throws -> RelayPlayer {
        let config = RelayPlayer.Configuration(target: .direct(PeerEndpoint(host: "127.0.0.1", port: host.port)),
                                               identity: try paired.playerIdentity(0), hosts: .paired(paired.playerTrust(0)),
                                               discovery: InProcessDiscovery())
        let player = try RelayPlayer(configuration: config) { format, _ in
            try WAVFileSink(path: out, format: format, periodFrames: 128)
        } log: { log($0) }
        try player.start()
        return player
    }

    @Test("The trust store is damaged while a paired player listens: the host disconnects it within a second, says why, and does not let it back in")
    func damagedWhileListening() throws {
        let paired = try PairedStates(players: 1, hostName: "trust-host")
        let lines = Lines()
        let host = try makeHost(paired, name: "trust-host", accept: .paired, lines: lines)
        defer { host.stop() }
        let player = try makePlayer(paired, host: host, out: Rig.tempPath("trust-damaged.wav"))
        defer { player.stop() }
        #expect(eventually(10) { player.statistics.playout.received > 50 }, "the paired player listens")

        let store = paired.hostDirectory + "/paired.json"
        try Self.damage.write(to: URL(fileURLWithPath: store))
        let damagedAt = Date()
        #expect(eventually(3) { host.statistics.players.isEmpty }, "the player it admitted is disconnected")
        print("trust store damaged → player disconnected after \(Int(Date().timeIntervalSince(damagedAt) * 1000)) ms")
        #expect(Date().timeIntervalSince(damagedAt) < 1.5)
        #expect(lines.noticed("is damaged") && lines.noticed("disconnecting the player it admitted"),
                "\(lines.notices.withLock { $0 })")

        // It asks to join again: the store vouches for nobody now, so the host (policy: paired) turns it down.
        #expect(eventually(10) { lines.noticed("is not admitted as paired") }, "\(lines.notices.withLock { $0 })")
        let received = player.statistics.playout.received
        Thread.sleep(forTimeInterval: 1)
        #expect(host.statistics.players.isEmpty)
        #expect(player.statistics.playout.received == received, "no audio since")
        #expect(try Data(contentsOf: URL(fileURLWithPath: store)) == Self.damage, "the damaged store was left as it was")
    }

    @Test("'Always' when the trust store cannot be written: the player is let in once, and the operator hears it was not paired")
    func alwaysWithAnUnwritableStore() throws {
        let paired = try PairedStates(players: 1, hostName: "ask-host")
        let store = paired.hostDirectory + "/paired.json"
        try Self.damage.write(to: URL(fileURLWithPath: store))
        let lines = Lines()
        let host = try makeHost(paired, name: "ask-host", accept: .ask(Operator(decision: .always)), lines: lines)
        defer { host.stop() }
        let player = try makePlayer(paired, host: host, out: Rig.tempPath("trust-always.wav"))
        defer { player.stop() }
        #expect(eventually(10) { player.statistics.playout.received > 50 }, "the operator let it in")
        #expect(lines.noticed("accepted player-0 once; it could not be paired: the trust store"),
                "\(lines.notices.withLock { $0 })")
        #expect(!lines.logged("paired it"), "\(lines.events.withLock { $0 })")
        #expect(try Data(contentsOf: URL(fileURLWithPath: store)) == Self.damage, "the damaged store was left as it was")
        // Admitted once, not by the store: the store's damage does not disconnect it.
        Thread.sleep(forTimeInterval: 0.6)
        #expect(host.statistics.players.count == 1)
    }

    @Test("A player whose own trust store is damaged joins no host, and its log says why")
    func playerWithADamagedStore() throws {
        let paired = try PairedStates(players: 1, hostName: "kept-host")
        try Self.damage.write(to: URL(fileURLWithPath: paired.playerDirectory(0) + "/paired.json"))
        let lines = Lines()
        let host = try makeHost(paired, name: "kept-host", accept: .paired, lines: lines)
        defer { host.stop() }
        let playerLog = Lines()
        let player = try makePlayer(paired, host: host, out: Rig.tempPath("trust-player.wav"),
                                    log: { line in playerLog.events.withLock { $0.append(line) } })
        defer { player.stop() }
        #expect(eventually(10) { playerLog.logged("is damaged") && playerLog.logged("no host counts as paired") },
                "\(playerLog.events.withLock { $0 })")
        Thread.sleep(forTimeInterval: 0.5)
        #expect(host.statistics.players.isEmpty)
        #expect(player.statistics.playout.received == 0, "nothing heard from a host it cannot vouch for")
    }

    @Test("An operator who takes 8 s (longer than reaching a host may take) is asked once, and sees the check code the waiting player shows; a prompt answered at once shows none")
    func theWaitingPlayerShowsTheOperatorsCheckCode() throws {
        let paired = try PairedStates(players: 1, hostName: "asking-host")
        try FileManager.default.removeItem(atPath: paired.hostDirectory + "/paired.json")
        let lines = Lines(), shown = Lines(), playerLog = Lines()
        let host = try makeHost(paired, name: "asking-host", accept: .ask(Operator(decision: .once, after: 8, shown: shown)),
                                lines: lines)
        defer { host.stop() }
        let player = try makePlayer(paired, host: host, out: Rig.tempPath("trust-ask.wav"),
                                    log: { line in playerLog.events.withLock { $0.append(line) } })
        defer { player.stop() }
        #expect(eventually(20) { player.statistics.playout.received > 50 }, "the operator let it in")
        let codes = shown.events.withLock { $0 }
        #expect(codes.count == 1, "asked once: \(codes)")
        let code = try #require(codes.first)
        #expect(code.count == 7 && code.filter(\.isNumber).count == 6, "six digits: \(code)")
        let waiting = playerLog.events.withLock { $0 }.filter { $0.contains("waiting for asking-host") }
        #expect(waiting.count == 1 && waiting[0].hasSuffix("check code there is \(code)"), "\(playerLog.events.withLock { $0 })")

        // Paired now (the same host, asked nothing): no waiting line.
        let quick = try makeHost(paired, name: "quick-host", accept: .paired, lines: Lines())
        defer { quick.stop() }
        try paired.hostTrust.add(try paired.playerIdentity(0).publicKey, name: "player-0")
        let quickLog = Lines()
        let again = try makePlayer(paired, host: quick, out: Rig.tempPath("trust-quick.wav"),
                                   log: { line in quickLog.events.withLock { $0.append(line) } })
        defer { again.stop() }
        #expect(eventually(10) { again.statistics.playout.received > 50 })
        Thread.sleep(forTimeInterval: 1.2)
        #expect(!quickLog.logged("check code"), "\(quickLog.events.withLock { $0 })")
    }

    @Test("A stranger that gives a paired player's name is asked about as a stranger, and the question names the paired one's key")
    func aNamesakeIsAskedAboutAsAStranger() throws {
        let paired = try PairedStates(players: 1, hostName: "ask-host")
        // The host's paired "player-0" is another device: the player that connects gives its name with its own key.
        let stranger = try paired.playerIdentity(0).publicKey
        #expect(try paired.hostTrust.remove(matching: stranger.shortFingerprint).count == 1)
        let real = try PeerIdentity.generate(displayName: "player-0").publicKey
        try paired.hostTrust.add(real, name: "player-0")
        let lines = Lines(), shown = Lines(), playerLog = Lines()
        let host = try makeHost(paired, name: "ask-host", accept: .ask(Operator(decision: .no, shown: shown)), lines: lines)
        defer { host.stop() }
        let player = try makePlayer(paired, host: host, out: Rig.tempPath("trust-namesake.wav"),
                                    log: { line in playerLog.events.withLock { $0.append(line) } })
        defer { player.stop() }
        #expect(eventually(10) { shown.notices.withLock { $0 }.count == 1 }, "the operator was asked")
        #expect(shown.notices.withLock { $0 } == [real.shortFingerprint])
        #expect(eventually(5) { lines.logged("declined player-0") }, "\(lines.events.withLock { $0 })")
        #expect(player.statistics.playout.received == 0)
    }
}
