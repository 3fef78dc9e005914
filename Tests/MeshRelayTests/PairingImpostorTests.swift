import Foundation
import Synchronization
import Testing
import MeshTestSupport
import MeshPOSIX
import PeerMesh
@testable import MeshRelay

@Suite("Pairing against an impostor host")
struct PairingImpostorTests {
    /// A player's pairing settings aimed at `impostor` (code 1234-5678, 5 s), with a trust store in a fresh
    /// directory: the caller removes that directory.
    private static func clientConfiguration(for impostor: FakePairingHost) throws -> (PairingClient.Configuration, String) {
        let dir = NSTemporaryDirectory() + "pm-impostor-\(getpid())-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        var config = PairingClient.Configuration(identity: try PeerIdentity.generate(displayName: "bedroom"),
                                                 trust: TrustStore(path: dir + "/paired.json"), code: "1234-5678",
                                                 target: .direct(PeerEndpoint(host: "127.0.0.1", port: impostor.advertiser.port!)))
        config.bindHost = "127.0.0.1"
        config.timeout = .seconds(5)
        return (config, dir)
    }

    @Test("A host that says 'paired' without proving it knows the code is not trusted")
    func claimedSuccessWithoutProof() throws {
        let impostor = try FakePairingHost(.claimsPaired, name: "Kitchen mic")
        let (config, dir) = try Self.clientConfiguration(for: impostor)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let trust = config.trust
        let outcome = try PairingClient(configuration: config).run()
        guard case .failed(let why) = outcome else {
            Issue.record("the player paired with an impostor: \(outcome)")
            return
        }
        #expect(why.contains("without proving it knows the code"), "\(why)")
        #expect(try trust.list().isEmpty, "no key was written to the trust store")
        withExtendedLifetime(impostor) {}  // it must be there for the whole pairing attempt
    }

    @Test("run() on the session I/O thread (from a delegate call) fails at once instead of holding every session up")
    func runOnTheIOThreadFailsAtOnce() throws {
        let impostor = try FakePairingHost(.claimsPaired, name: "Kitchen mic")
        let (config, dir) = try Self.clientConfiguration(for: impostor)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let client = try PairingClient(configuration: config)
        let started = Date()
        let outcome = try EventLoop.shared().submitAndWait { client.run() }
        #expect(Date().timeIntervalSince(started) < 1, "it did not wait for the timeout")
        guard case .failed(let why) = outcome else {
            Issue.record("\(outcome)")
            return
        }
        #expect(why.contains("call it from another thread"), "\(why)")
        withExtendedLifetime(impostor) {}
    }
}
