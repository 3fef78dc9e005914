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

    func makeHost(clips: ClipRecorder.Configuration? = nil, log: @escaping @Sendable (String) -> Void = { _ in }) throws -> RelayHost {
        let tone = try ToneSource(frequency: 440, amplitude: 0.5, format: .default, periodFrames: 128)
        var config = RelayHost.Configuration(identity: paired.host, trust: paired.hostTrust, serviceType: "pmr-ctl-inproc",
                                             maximumPeers: 8, discovery: InProcessDiscovery())
        config.maximumPlayersPerAddress = 8
        config.clips = clips
        let host = try RelayHost(configuration: config, source: tone, log: log)
        try host.start()
        return host
    }

    static func clipDirectory() throws -> String {
        let dir = Rig.tempPath("ctl-clips-\(UUID().uuidString.prefix(6))")
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        return dir
    }

    static func files(_ dir: String) -> Set<String> { Set((try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? []) }

    @Test("A cancel answered ok leaves no file, a cancel too late says saved (and the file is there), and the next clips start and end normally")
    func cancelledClipsLeaveNoFileAndTheNextClipsWork() throws {
        let dir = try Self.clipDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let host = try makeHost(clips: .init(directory: dir, name: "h", prerollSeconds: 0.2, maximumSeconds: 0.3))
        defer { host.stop() }
        let a = try RawControlClient(identity: try paired.playerIdentity(0), endpoint: PeerEndpoint(host: "127.0.0.1", port: host.port))
        defer { a.stop() }
        let b = try RawControlClient(identity: try paired.playerIdentity(1), endpoint: PeerEndpoint(host: "127.0.0.1", port: host.port))
        defer { b.stop() }
        Thread.sleep(forTimeInterval: 0.3)  // the pre-roll fills
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
