import Foundation
import MeshAudio
import MeshTestSupport
import PeerMesh
import Synchronization
import Testing
@testable import MeshRelay

/// A paired player that speaks the control protocol raw: it sends whatever commands a test asks for, as fast as asked,
/// and keeps every message the host sends back.
final class RawControlClient: SessionDelegate, Sendable {
    let session: Session
    private let connected = Atomic<Bool>(false)
    private let received = Mutex<[ControlMessage]>([])

    /// Joins the host at `endpoint` as `identity` (a player the host trusts).
    init(identity: PeerIdentity, endpoint: PeerEndpoint) throws {
        session = try Session(securityIdentity: identity)
        session.delegate = self
        try session.connect(to: endpoint, timeout: .seconds(3))
        guard eventually(5, { self.connected.load(ordering: .acquiring) }) else { throw PeerMeshError.timedOut("the host did not admit the raw client") }
    }

    var host: PeerID? { session.connectedPeers.first }

    /// Sends `command` with `id`; false when the session refused it.
    @discardableResult
    func send(_ id: UInt32, _ command: PlayerCommand) -> Bool {
        guard let host else { return false }
        do { try session.send(Data(ControlMessage.command(id: id, command).encoded), toPeers: [host], with: .reliable) } catch { return false }
        return true
    }

    var messages: [ControlMessage] { received.withLock { $0 } }

    /// The host's reply to command `id`, if it came.
    func reply(to id: UInt32) -> HostReply? {
        for case .reply(id, let r) in messages { return r }
        return nil
    }

    /// The latest state the host sent.
    var state: HostControlState? {
        messages.reversed().lazy.compactMap { m -> HostControlState? in if case .state(let s) = m { s } else { nil } }.first
    }

    func stop() { session.disconnect() }

    func session(_ session: Session, peer: PeerID, didChange state: SessionState) {
        if state == .connected { connected.store(true, ordering: .releasing) }
    }

    func session(_ session: Session, didReceive data: Data, fromPeer peer: PeerID) {
        guard let m = try? ControlMessage.decode(Array(data)) else { return }
        received.withLock { $0.append(m) }
    }
}

/// The host's control driver in one process (real sessions on 127.0.0.1, a real clip recorder): what its state machine
/// decides reaches the disk and the players as it should.
@Suite("Host control in one process", .serialized)
struct HostControlInProcessTests {
    let paired: PairedStates

    init() throws { paired = try PairedStates(players: 3, hostName: "ctl-inproc-host") }

    /// A host keeping clips (0.2 s of pre-roll, 0.3 s at most) in a fresh directory, each player's within
    /// `clipQuota`, with players 0 and 1 joined as raw clients: `body` gets them and the directory once the pre-roll
    /// has filled.
    func withClipHost(clipQuota: ClipQuota = .default, log: @escaping @Sendable (String) -> Void = { _ in },
                      _ body: (RelayHost, _ a: RawControlClient, _ b: RawControlClient, _ dir: String) throws -> Void) throws {
        let dir = try Self.clipDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let tone = try ToneSource(frequency: 440, amplitude: 0.5, format: .default, periodFrames: 128)
        var config = RelayHost.Configuration(identity: paired.host, trust: paired.hostTrust, serviceType: "pmr-ctl-inproc",
                                             maximumPeers: 8, discovery: InProcessDiscovery())
        config.maximumPlayersPerAddress = 8
        config.clips = .init(directory: dir, name: "h", prerollSeconds: 0.2, maximumSeconds: 0.3)
        config.clipQuota = clipQuota
        let host = try RelayHost(configuration: config, source: tone, log: log)
        try host.start()
        defer { host.stop() }
        let endpoint = PeerEndpoint(host: "127.0.0.1", port: host.port)
        let a = try RawControlClient(identity: try paired.playerIdentity(0), endpoint: endpoint)
        defer { a.stop() }
        let b = try RawControlClient(identity: try paired.playerIdentity(1), endpoint: endpoint)
        defer { b.stop() }
        Thread.sleep(forTimeInterval: 0.3)  // the pre-roll fills
        try body(host, a, b, dir)
    }

    static func clipDirectory() throws -> String {
        let dir = Rig.tempPath("ctl-clips-\(UUID().uuidString.prefix(6))")
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        return dir
    }

    static func files(_ dir: String) -> Set<String> { Set((try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? []) }

    @Test("A cancel answered ok leaves no file, a cancel too late says saved (and the file is there), and the next clips start and end normally")
    func cancelledClipsLeaveNoFileAndTheNextClipsWork() throws {
        // Player a starts 7 clips in a few seconds: a quota wide enough for them (the quota is not what this is about).
        try withClipHost(clipQuota: ClipQuota(burst: 20, refill: .seconds(1))) { _, a, b, dir in
            var id: UInt32 = 0
            func ask(_ c: RawControlClient, _ command: PlayerCommand) -> HostReply? {
                id += 1
                let mine = id
                c.send(mine, command)
                _ = eventually(5) { c.reply(to: mine) != nil }
                return c.reply(to: mine)
            }
            // A cancel well before the clip's length: ok, and the file is gone.
            #expect(ask(a, .capture(.begin, .primary)) == .recording)
            #expect(ask(a, .capture(.cancel, .primary)) == .ok)
            #expect(eventually(2) { Self.files(dir).isEmpty }, "\(Self.files(dir))")
            // Cancels around the clip's length (0.3 s): whatever the race, an ok leaves nothing, and a "too late" (or "no
            // clip", once the host knew it was saved) keeps the clip; and every time, the other player's clip afterwards
            // starts and ends normally.
            for delay in [0.22, 0.26, 0.28, 0.3, 0.32, 0.35] {
                let before = Self.files(dir)
                #expect(ask(a, .capture(.begin, .primary)) == .recording)
                Thread.sleep(forTimeInterval: delay)
                let cancel = ask(a, .capture(.cancel, .primary))
                switch cancel {
                case .ok:
                    #expect(eventually(2) { Self.files(dir) == before }, "a cancelled clip stays on disk: \(Self.files(dir).subtracting(before))")
                case .failed(let why):
                    let name = String(why.split(separator: " ").last ?? "")
                    #expect(why.hasPrefix("too late to cancel: the clip was saved as ") && Self.files(dir) == before.union([name]), "\(why)")
                case .error("no clip is being recorded"):
                    // The host knew the clip was saved before the cancel came: it is kept, and the state says so.
                    #expect(Self.files(dir).subtracting(before).count == 1, "\(Self.files(dir).subtracting(before))")
                default:
                    Issue.record("cancel after \(delay) s: \(String(describing: cancel))")
                }
                #expect(ask(b, .capture(.begin, .primary)) == .recording)
                let seen = b.messages.count
                #expect(ask(b, .capture(.end, .primary)) == .ok, "b's clip ends as b asked")
                #expect(eventually(3) { b.messages.dropFirst(seen).contains { if case .state(let s) = $0, case .saved = s.capture { true } else { false } } },
                        "\(b.messages.dropFirst(seen))")
            }
        }
    }

    @Test("The default clip quota: a player's 4 pre-roll clips are written, its 5th start is answered with when to try again and writes nothing, the refusal is counted in the status and logged, and another player's clip is written")
    func clipsOverTheQuotaAreRefusedAndCounted() throws {
        let log = Mutex<[String]>([])
        try withClipHost(log: { line in log.withLock { $0.append(line) } }) { host, a, b, dir in
            /// The states `c` was sent that say a clip was saved.
            func saves(_ c: RawControlClient) -> Int {
                c.messages.filter { if case .state(let s) = $0, case .saved = s.capture { true } else { false } }.count
            }
            /// `c` asks for a pre-roll-only clip with `id`; once it is recording, waits until it is saved.
            func shoot(_ c: RawControlClient, _ id: UInt32) -> HostReply? {
                let before = saves(c)
                c.send(id, .capture(.single, .secondary))
                _ = eventually(5) { c.reply(to: id) != nil }
                if c.reply(to: id) == .recording { #expect(eventually(3) { saves(c) > before }, "clip \(id) was not saved") }
                return c.reply(to: id)
            }
            let start = Date()
            for id in UInt32(1)...4 { #expect(shoot(a, id) == .recording, "clip \(id) of the 4 at once") }
            #expect(Self.files(dir).count == 4, "\(Self.files(dir))")
            // The next comes back 10 s after the first 4 were taken.
            guard case .failed(let why)? = shoot(a, 5) else { Issue.record("the 5th clip: \(String(describing: a.reply(to: 5)))"); return }
            let wait = why.hasPrefix("too many clips: try again in ") && why.hasSuffix(" s")
                ? Int(why.dropFirst("too many clips: try again in ".count).dropLast(2)) : nil
            let elapsed = Date().timeIntervalSince(start)
            #expect(wait.map { $0 <= 10 && Double($0) >= 10 - elapsed - 1 } == true, "\(why), \(elapsed) s after the first")
            #expect(Self.files(dir).count == 4, "a refused clip wrote nothing: \(Self.files(dir))")
            #expect(shoot(b, 1) == .recording, "b's quota is its own")
            #expect(eventually(2) { Self.files(dir).count == 5 }, "\(Self.files(dir))")
            let s = host.statistics
            let idA = try paired.playerIdentity(0).peerID, idB = try paired.playerIdentity(1).peerID
            #expect(s.refusedClips == 1)
            #expect(s.players.first { $0.peer == idA }?.refusedClips == 1 && s.players.first { $0.peer == idB }?.refusedClips == 0)
            #expect(s.controlCommands == 6)
            let refusals = log.withLock { $0.filter { $0.contains("refused a clip") } }
            #expect(refusals.count == 1 && refusals[0].contains("over its clip quota, free again in "), "\(log.withLock { $0 })")
        }
    }
}

/// A device that went away, as a test says it.
struct DeviceGone: Error, CustomStringConvertible {
    let text: String
    var description: String { text }
}

/// A tone that fails on demand, as a talk input whose device went away: it stops delivering and reports the fault.
final class FailingSource: AudioSource, Sendable {
    private let tone: ToneSource
    private let failure = Mutex<(any Error)?>(nil)
    init(frequency: Double) throws { tone = try ToneSource(frequency: frequency, amplitude: 0.5, format: .default, periodFrames: 128) }
    var format: AudioFormat { tone.format }
    var periodFrames: Int { tone.periodFrames }
    func start() throws { try tone.start() }
    func start(consumer: any CaptureConsumer) throws { try tone.start(consumer: consumer) }
    func stop() { tone.stop() }
    func read(into buffer: UnsafeMutableBufferPointer<Float>, timeoutNanos: UInt64) -> ChunkInfo? { tone.read(into: buffer, timeoutNanos: timeoutNanos) }
    var stats: AudioStats { tone.stats }
    var fault: (any Error)? { failure.withLock { $0 } }
    func fail() {
        tone.stop()
        failure.withLock { $0 = DeviceGone(text: "the talk device went away") }
    }
}

/// A WAV file output that fails on demand, as a talkback device that went away.
final class FailingSink: WrappedSink, @unchecked Sendable {  // Sendable: its state is behind a Mutex.
    private let failure = Mutex<(any Error)?>(nil)
    init(path: String, format: AudioFormat) throws { super.init(try WAVFileSink(path: path, format: format, periodFrames: 128)) }
    override var fault: (any Error)? { failure.withLock { $0 } }
    func fail() { failure.withLock { $0 = DeviceGone(text: "the talkback device went away") } }
}

/// Push-to-talk when either end of talkback dies: the floor is released, and nobody is held for nothing.
@Suite("Talkback that ends, in one process", .serialized)
struct TalkbackEndsInProcessTests {
    let paired: PairedStates

    init() throws { paired = try PairedStates(players: 2, hostName: "talk-inproc-host") }

    func makeHost(talkSink: @escaping @Sendable (AudioFormat) throws -> any AudioSink) throws -> RelayHost {
        let tone = try ToneSource(frequency: 440, amplitude: 0.5, format: .default, periodFrames: 128)
        var config = RelayHost.Configuration(identity: paired.host, trust: paired.hostTrust, serviceType: "pmr-talk-inproc",
                                             maximumPeers: 8, discovery: InProcessDiscovery())
        config.maximumPlayersPerAddress = 8
        config.talk = RelayHost.TalkOutput(makeSink: talkSink)
        let host = try RelayHost(configuration: config, source: tone)
        try host.start()
        return host
    }

    func makeTalker(endpoint: PeerEndpoint, talk: any AudioSource, log: @escaping @Sendable (String) -> Void) throws -> RelayPlayer {
        var config = RelayPlayer.Configuration(target: .direct(endpoint), identity: try paired.playerIdentity(0),
                                               hosts: .paired(paired.playerTrust(0)), discovery: InProcessDiscovery())
        config.talkSource = talk
        let out = Rig.tempPath("talker-\(UUID().uuidString.prefix(6)).wav")
        let player = try RelayPlayer(configuration: config, makeSink: { format, _ in
            try WAVFileSink(path: out, format: format, periodFrames: 128)
        }, log: log)
        try player.start()
        return player
    }

    /// Player 0 joins `host` with `talk` as its talk input and talks; returns it once the host plays its talkback.
    func talkingPlayer(_ host: RelayHost, talk: any AudioSource, log: @escaping @Sendable (String) -> Void) throws -> RelayPlayer {
        let player = try makeTalker(endpoint: PeerEndpoint(host: "127.0.0.1", port: host.port), talk: talk, log: log)
        #expect(eventually(10) { player.statistics.hostControl?.features.contains(.talk) == true }, "the host offers talkback")
        player.send(.talk(true))
        #expect(eventually(5) { host.statistics.players.first?.talking == true && player.statistics.talking })
        #expect(eventually(2) { player.statistics.hostControl?.paused == true }, "half duplex: held while it talks")
        return player
    }

    /// The host plays talk in `RelayPlayer.talkFormat` only: a talk file in another format would be sent as packets
    /// it drops, silence at the host while the player shows TALKING. The player refuses it at once instead.
    @Test("A talk source in another format than 44.1 kHz mono is refused when the player is made, saying so")
    func talkSourceInAnotherFormatIsRefused() throws {
        let stereo48k = AudioFormat(sampleRate: 48_000, channels: 2)
        let path = Rig.tempPath("talk48k-\(UUID().uuidString.prefix(6)).wav")
        defer { unlink(path) }
        try SoundFiles.write(path: path, format: stereo48k, encoding: .float32, samples: [Float](repeating: 0.25, count: 9_600))
        let source = try WAVFileSource(path: path, periodFrames: 128, loop: true)
        #expect(source.format == stereo48k)
        do {
            _ = try makeTalker(endpoint: PeerEndpoint(host: "127.0.0.1", port: 9), talk: source, log: { _ in })
            Issue.record("a 48 kHz stereo talk source was taken")
        } catch let error as RelayPlayer.TalkFormatError {
            #expect(error.format == stereo48k)
            #expect(error.description.contains("push-to-talk must be 44100 Hz, 1 ch"), "\(error)")
        }
        #expect(RelayPlayer.talkFormat == .default)
    }

    @Test("The talk input fails 1 s after talk on: the player says talk off, the host releases it (not talking, not held), and another player may talk")
    func talkInputThatFailsReleasesTheFloor() throws {
        let host = try makeHost { format in try WAVFileSink(path: Rig.tempPath("talk-\(UUID().uuidString.prefix(6)).wav"), format: format, periodFrames: 128) }
        defer { host.stop() }
        let lines = Mutex<[String]>([])
        let input = try FailingSource(frequency: 880)
        let player = try talkingPlayer(host, talk: input) { line in lines.withLock { $0.append(line) } }
        defer { player.stop() }
        Thread.sleep(forTimeInterval: 1)
        input.fail()
        #expect(eventually(2) { host.statistics.players.first?.talking == false }, "the host still plays player 0's talkback")
        #expect(eventually(2) { player.statistics.hostControl?.paused == false && !player.controls.held }, "the player is still held")
        #expect(!player.statistics.talking)
        #expect(lines.withLock { $0 }.contains { $0.hasPrefix("talk input ended: ") }, "\(lines.withLock { $0 })")
        // The floor is free: another player talks.
        let other = try RawControlClient(identity: try paired.playerIdentity(1), endpoint: PeerEndpoint(host: "127.0.0.1", port: host.port))
        defer { other.stop() }
        other.send(1, .talk(true))
        #expect(eventually(3) { other.reply(to: 1) != nil })
        #expect(other.reply(to: 1) == .ok)
        // And the player whose input died does not ask again.
        player.send(.talk(true))
        #expect(eventually(2) { lines.withLock { $0 }.contains { $0.hasPrefix("talk on: not sent: ") } }, "\(lines.withLock { $0 })")
    }

    @Test("A talk request answered busy (another player holds the floor) leaves push-to-talk off, so that a toggle asks again; the host's leave turns it off too")
    func aBusyAnswerTurnsPushToTalkOff() throws {
        let host = try makeHost { format in try WAVFileSink(path: Rig.tempPath("talk-\(UUID().uuidString.prefix(6)).wav"), format: format, periodFrames: 128) }
        defer { host.stop() }
        let other = try RawControlClient(identity: try paired.playerIdentity(1), endpoint: PeerEndpoint(host: "127.0.0.1", port: host.port))
        defer { other.stop() }
        other.send(1, .talk(true))
        #expect(eventually(5) { other.reply(to: 1) == .ok }, "the other player holds the floor")
        let lines = Mutex<[String]>([])
        let player = try makeTalker(endpoint: PeerEndpoint(host: "127.0.0.1", port: host.port),
                                    talk: try ToneSource(frequency: 880, amplitude: 0.5, format: .default, periodFrames: 128)) { line in
            lines.withLock { $0.append(line) }
        }
        defer { player.stop() }
        #expect(eventually(10) { player.statistics.hostControl?.features.contains(.talk) == true }, "the host offers talkback")
        player.send(.talk(true))
        #expect(eventually(3) { lines.withLock { $0 }.contains("talk on: busy") }, "\(lines.withLock { $0 })")
        #expect(!player.talkRequested && !player.statistics.talking)
        // The floor is free again: a toggle (talk on, since it is off) gets it.
        other.send(2, .talk(false))
        #expect(eventually(3) { other.reply(to: 2) == .ok })
        player.toggleTalk()
        #expect(eventually(5) { player.statistics.talking && host.statistics.players.contains { $0.talking } })
        #expect(player.talkRequested)
        // The host goes: push-to-talk is off for the next visit.
        host.stop()
        #expect(eventually(5) { !player.talkRequested && !player.statistics.talking })
    }

    @Test("The host's talkback output fails: the talker is released (not talking, not held), talkback is no longer offered, and a talk request is answered that it is unavailable")
    func talkbackOutputThatFailsReleasesTheTalker() throws {
        let sink = Mutex<FailingSink?>(nil)
        let host = try makeHost { format in
            let s = try FailingSink(path: Rig.tempPath("talk-\(UUID().uuidString.prefix(6)).wav"), format: format)
            sink.withLock { $0 = s }
            return s
        }
        defer { host.stop() }
        let player = try talkingPlayer(host, talk: try ToneSource(frequency: 880, amplitude: 0.5, format: .default, periodFrames: 128)) { _ in }
        defer { player.stop() }
        sink.withLock { $0 }?.fail()
        #expect(eventually(2) { host.statistics.players.first?.talking == false }, "the host still holds the floor for nothing")
        #expect(eventually(2) { player.statistics.hostControl?.paused == false && !player.controls.held }, "the talker is still held")
        #expect(eventually(2) { player.statistics.hostControl?.features.contains(.talk) == false }, "talkback is still offered")
        #expect(eventually(2) { !player.statistics.talking }, "the player still sends its talk input")
        let other = try RawControlClient(identity: try paired.playerIdentity(1), endpoint: PeerEndpoint(host: "127.0.0.1", port: host.port))
        defer { other.stop() }
        other.send(1, .talk(true))
        #expect(eventually(3) { other.reply(to: 1) != nil })
        guard case .error(let why)? = other.reply(to: 1) else { Issue.record("talk on: \(String(describing: other.reply(to: 1)))"); return }
        #expect(why.hasPrefix("talkback is unavailable: "), "\(why)")
    }
}

/// A started host with one paired player's state (`paired`), a tone for its source, and the lines it logs.
private final class LoggedHost: Sendable {
    let paired: PairedStates
    let host: RelayHost
    private let log = Lines()
    var endpoint: PeerEndpoint { PeerEndpoint(host: "127.0.0.1", port: host.port) }
    /// What it logged so far.
    var lines: [String] { log.all.withLock { $0 } }

    private final class Lines: Sendable { let all = Mutex<[String]>([]) }

    init(name: String, service: String) throws {
        paired = try PairedStates(players: 1, hostName: name)
        let tone = try ToneSource(frequency: 440, amplitude: 0.5, format: .default, periodFrames: 128)
        let config = RelayHost.Configuration(identity: paired.host, trust: paired.hostTrust, serviceType: service,
                                             maximumPeers: 8, discovery: InProcessDiscovery())
        let log = self.log
        host = try RelayHost(configuration: config, source: tone, log: { l in log.all.withLock { $0.append(l) } })
        try host.start()
    }
}

/// A player that sends control commands as fast as it can: the host drops what is over its budget, counts it, keeps
/// its log readable, and an honest player is served as ever.
@Suite("Control command flood, in one process", .serialized)
struct ControlFloodInProcessTests {
    @Test("A paired player that comes back 20 times with 100 commands each: no visit buys a fresh budget, the host's log gets about a line a second, and its trust store one write")
    func reconnectingBuysNothing() throws {
        let logged = try LoggedHost(name: "revisit-host", service: "pmr-revisit")
        defer { logged.host.stop() }
        let (paired, host, endpoint) = (logged.paired, logged.host, logged.endpoint)
        // The store is replaced (a new file renamed into place) at each write: its inode tells whether one happened.
        func storeFile() -> Int? { try? FileManager.default.attributesOfItem(atPath: paired.hostTrust.path)[.systemFileNumber] as? Int }
        let start = Date()
        var sent: UInt64 = 0
        var afterFirstVisit: Int?
        for visit in 0..<20 {
            // It calls itself another name than the one it was paired under: every line still goes by the paired one.
            let client = try RawControlClient(identity: try paired.playerIdentity(0).renamed("den"), endpoint: endpoint)
            for i in 0..<100 where client.send(UInt32(visit * 100 + i + 1), .resume) { sent += 1 }
            // Each command taken (answered) or dropped (counted) before the player leaves.
            #expect(eventually(5) { let s = host.statistics; return s.controlCommands + s.droppedControl == sent })
            client.stop()
            #expect(eventually(5) { host.statistics.players.isEmpty })
            if visit == 0 { afterFirstVisit = storeFile() }
        }
        let seconds = Date().timeIntervalSince(start)
        let taken = host.statistics.controlCommands
        #expect(sent == 2_000)
        #expect(taken >= 100 && Double(taken) <= 100 + 50 * (seconds + 0.5), "\(taken) taken in \(seconds) s: as if it had stayed")
        #expect(afterFirstVisit != nil && storeFile() == afterFirstVisit, "the first visit was written down, the 19 after it within the minute not")
        Thread.sleep(forTimeInterval: 1.2)  // the last summary
        let all = logged.lines
        let visits = all.filter { $0.hasPrefix("player player-0 ") }
        #expect(visits.count >= 2 && Double(visits.count) <= seconds + 3, "\(visits.count) lines in \(seconds) s: \(visits)")
        #expect(visits.last.map { $0.hasPrefix("player player-0 left") } == true, "the last line says it left: \(visits.last ?? "")")
        #expect(!all.contains { $0.hasPrefix("player den") }, "never by the name it gives: \(all)")
    }

    @Test("A paired player that leaves and is back within the second: one line says it is connected, from where, and under the name it was paired under")
    func aQuickReturnIsSummedUpWithWhereFrom() throws {
        let logged = try LoggedHost(name: "return-host", service: "pmr-return")
        defer { logged.host.stop() }
        let (paired, host, endpoint) = (logged.paired, logged.host, logged.endpoint)
        let identity = try paired.playerIdentity(0).renamed("den")
        let first = try RawControlClient(identity: identity, endpoint: endpoint)
        first.stop()
        #expect(eventually(3) { host.statistics.players.isEmpty })
        let again = try RawControlClient(identity: identity, endpoint: endpoint)
        defer { again.stop() }
        #expect(eventually(3) { logged.lines.contains { $0.contains(" is connected from ") } }, "\(logged.lines)")
        let visits = logged.lines.filter { $0.hasPrefix("player ") }
        let fingerprint = identity.publicKey.shortFingerprint
        #expect(visits.first == "player player-0 joined from 127.0.0.1 (\(fingerprint), calls itself \"den\")", "\(visits)")
        #expect(visits.dropFirst().first == "player player-0 is connected from 127.0.0.1 (\(fingerprint)) (after 2 more joins and leaves within a second, not logged one by one)",
                "\(visits)")
        #expect(visits.count == 2)
    }

    @Test("20 000 pause/resume pairs from one player: a few toggle lines a second in the host's log, every command taken or dropped and counted, and a second player's pause and resume still work")
    func aFloodIsDroppedAndCountedAndTheLogStaysReadable() throws {
        let paired = try PairedStates(players: 2, hostName: "flood-host")
        let lines = Mutex<[(at: Date, text: String)]>([])
        let tone = try ToneSource(frequency: 440, amplitude: 0.5, format: .default, periodFrames: 128)
        var config = RelayHost.Configuration(identity: paired.host, trust: paired.hostTrust, serviceType: "pmr-flood",
                                             maximumPeers: 8, discovery: InProcessDiscovery())
        config.maximumPlayersPerAddress = 8
        let host = try RelayHost(configuration: config, source: tone, log: { l in lines.withLock { $0.append((Date(), l)) } })
        try host.start()
        defer { host.stop() }
        let endpoint = PeerEndpoint(host: "127.0.0.1", port: host.port)
        let honestID = try paired.playerIdentity(0).peerID, flooderID = try paired.playerIdentity(1).peerID
        let honest = try RelayPlayer(configuration: RelayPlayer.Configuration(target: .direct(endpoint), identity: try paired.playerIdentity(0),
                                                                              hosts: .paired(paired.playerTrust(0)), discovery: InProcessDiscovery()),
                                     makeSink: { format, _ in try WAVFileSink(path: Rig.tempPath("flood-honest-\(UUID().uuidString.prefix(6)).wav"), format: format) })
        try honest.start()
        defer { honest.stop() }
        #expect(eventually(10) { honest.statistics.hostControl != nil }, "the honest player joined")
        let flooder = try RawControlClient(identity: try paired.playerIdentity(1), endpoint: endpoint)
        defer { flooder.stop() }
        func info(_ peer: PeerID) -> RelayHost.PlayerInfo? { host.statistics.players.first { $0.peer == peer } }

        let start = Date()
        var sent: UInt64 = 0
        for i in 0..<20_000 {
            if flooder.send(UInt32(2 * i + 1), .pause) { sent += 1 }
            if flooder.send(UInt32(2 * i + 2), .resume) { sent += 1 }
        }
        #expect(sent == 40_000)
        // Meanwhile, the honest player's pause and resume work.
        honest.send(.pause)
        #expect(eventually(3) { info(honestID)?.paused == true }, "the honest player's pause was not served")
        honest.send(.resume)
        #expect(eventually(3) { info(honestID)?.paused == false }, "the honest player's resume was not served")
        // Every command of the flooder's was taken (and answered) or dropped (and counted): exactly.
        let honestCommands: UInt64 = 2
        #expect(eventually(10) { let s = host.statistics; return s.controlCommands - honestCommands + s.droppedControl == sent },
                "\(host.statistics.controlCommands) taken, \(host.statistics.droppedControl) dropped of \(sent)")
        let floodSeconds = Date().timeIntervalSince(start)
        let s = host.statistics
        let taken = s.controlCommands - honestCommands
        #expect(taken >= 100 && Double(taken) <= 100 + 50 * (floodSeconds + 0.5), "\(taken) taken in \(floodSeconds) s")
        #expect(s.droppedControl == sent - taken)
        #expect(info(flooderID)?.droppedCommands == s.droppedControl && info(honestID)?.droppedCommands == 0)
        // The log: about one toggle line a second for the flooder, and its last one tells where it stands.
        Thread.sleep(forTimeInterval: 2.2)  // the last summaries
        let seconds = Date().timeIntervalSince(start)
        let all = lines.withLock { $0 }
        let toggles = all.filter { $0.text.hasPrefix("player player-1 ") && !$0.text.contains(" joined ") }
        #expect(toggles.count >= 1 && Double(toggles.count) <= seconds + 3, "\(toggles.count) toggle lines in \(seconds) s")
        let paused = info(flooderID)?.paused ?? false
        let last = toggles.last?.text ?? ""
        #expect(paused ? last.hasPrefix("player player-1 paused") : (last.hasPrefix("player player-1 resumed") || last.hasPrefix("player player-1 playing")),
                "paused \(paused), the last line: \(last)")
        let overBudget = all.filter { $0.text.hasPrefix("control: ") && $0.text.contains("player-1") }
        #expect(overBudget.count >= 1 && Double(overBudget.count) <= seconds + 2, "\(overBudget.map(\.text))")
        // Every drop is said in the log once: when the player is told (so far), then each second's in silence.
        let said = overBudget.compactMap { l -> UInt64? in
            if let r = l.text.range(of: "unanswered: ") { return UInt64(l.text[r.upperBound...].prefix { $0.isNumber }) }
            if let r = l.text.range(of: "dropped ") { return UInt64(l.text[r.upperBound...].prefix { $0.isNumber }) }
            return nil
        }
        #expect(said.reduce(0, +) == s.droppedControl, "\(overBudget.map(\.text))")
        // The whole log: the joins and a few lines a second (toggles, drops), however long the flood took to arrive.
        #expect(Double(all.count) <= 3 * seconds + 10, "the whole log: \(all.count) lines in \(seconds) s")
        // The flooder was told, at most once a second.
        let tellings = flooder.messages.filter { if case .reply(_, .error(let why)) = $0 { why.hasPrefix("too many commands") } else { false } }
        #expect(tellings.count >= 1 && Double(tellings.count) <= seconds + 1, "\(tellings.count)")
    }
}
