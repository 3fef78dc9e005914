import Foundation
import MeshAudio
import MeshTestSupport
import PeerMesh
import Synchronization
@testable import MeshRelay

/// The environment flags `scripts/test` sets when its rigs run.
enum Rig {
    static let env = ProcessInfo.processInfo.environment
    static var jack: Bool { env["MESH_JACK_RIG"] == "1" }
    static var avahi: Bool { env["MESH_AVAHI_RIG"] == "1" }
    static var jackDir: String { env["MESH_JACK_RIG_DIR"] ?? "" }

    /// A fresh, valid service type so concurrent tests never see each other.
    static func uniqueService() -> String {
        "pmr-" + String((0..<8).map { _ in "abcdefghijklmnopqrstuvwxyz".randomElement()! })
    }

    static func tempPath(_ name: String) -> String {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("meshrelay-tests-\(getpid())")
        try? FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        return dir.appendingPathComponent(name).path
    }
}

/// The CLI processes these tests run are the shared `ChildProcess`, started by product name.
typealias CLIProcess = ChildProcess

extension ChildProcess {
    /// Starts one of this package's executables with `arguments` (stdin from `stdin`, else /dev/null).
    convenience init(_ name: String, _ arguments: [String], stdin: FileHandle? = nil) throws {
        try self.init(product: name, arguments, stdin: stdin)
    }

    /// Sends `sig` (SIGKILL by default) by PID.
    func kill(_ sig: Int32 = SIGKILL) { signal(sig) }
}

/// A host and players whose state directories already trust each other — as `mesh-play --pair` leaves them — so
/// the relay tests run as users do: encrypted, paired-only.
struct PairedStates {
    let root: String
    let hostDirectory: String
    let host: PeerIdentity

    /// Makes the host's identity and `players` players' identities, each trusting the other.
    init(players: Int = 1, hostName: String = "test-host") throws {
        root = Rig.tempPath("state-\(UUID().uuidString)")
        hostDirectory = root + "/host"
        host = try PeerIdentity.generate(displayName: hostName)
        try host.save(to: hostDirectory + "/identity.json")
        for i in 0..<players { try addPlayer(i) }
    }

    /// The state directory of player `i`.
    func playerDirectory(_ i: Int) -> String { root + "/player\(i)" }

    /// Makes player `i` (named `player-i`) and pairs it with the host.
    @discardableResult
    func addPlayer(_ i: Int, name: String? = nil) throws -> PeerIdentity {
        let p = try PeerIdentity.generate(displayName: name ?? "player-\(i)")
        try p.save(to: playerDirectory(i) + "/identity.json")
        try TrustStore(path: hostDirectory + "/paired.json").add(p.publicKey, name: p.displayName)
        try TrustStore(path: playerDirectory(i) + "/paired.json").add(host.publicKey, name: host.displayName)
        return p
    }

    var hostTrust: TrustStore { TrustStore(path: hostDirectory + "/paired.json") }
    func playerTrust(_ i: Int) -> TrustStore { TrustStore(path: playerDirectory(i) + "/paired.json") }
    func playerIdentity(_ i: Int) throws -> PeerIdentity { try PeerIdentity.load(from: playerDirectory(i) + "/identity.json") }

    /// `--state-dir` arguments.
    var hostArgs: [String] { ["--state-dir", hostDirectory] }
    func playerArgs(_ i: Int = 0) -> [String] { ["--state-dir", playerDirectory(i)] }
}
