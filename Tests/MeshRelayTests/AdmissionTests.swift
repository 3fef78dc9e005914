import Foundation
import PeerMesh
import Testing
@testable import MeshRelay

/// The host's admission table (`RelayHost.Admission`) and the audience its capture thread reads (`Audience`), with no
/// sockets.
@Suite("Host admission and audience")
struct AdmissionTests {
    /// An operator that is never reached: the table only says whether to ask.
    struct NobodyAsked: PlayerApproval {
        func ask(_ request: JoinRequest, decide: @escaping @Sendable (JoinDecision) -> Void) {}
    }

    static let key = try! PeerIdentity.generate(displayName: "player").publicKey

    static func decide(_ policy: RelayHost.AcceptPolicy, key: PublicKey? = key, trusted: Bool = false,
                       context: Data? = nil, encryption: EncryptionPreference = .required) -> RelayHost.Admission {
        RelayHost.Admission.decide(context: context, key: key, trusted: trusted, policy: policy, encryption: encryption)
    }

    @Test func pairedOnlyLetsInPairedKeys() {
        #expect(Self.decide(.paired, trusted: true) == .accept(byTrust: true))
        #expect(Self.decide(.paired, trusted: false) == .decline(.notTrusted, "not paired"))
    }

    @Test func askLetsInPairedKeysAndAsksAboutTheRest() {
        #expect(Self.decide(.ask(NobodyAsked()), trusted: true) == .accept(byTrust: true))
        #expect(Self.decide(.ask(NobodyAsked()), trusted: false) == .askOperator)
    }

    @Test func allLetsEveryKeyInAndRemembersWhichWerePaired() {
        #expect(Self.decide(.all, trusted: true) == .accept(byTrust: true), "a forgotten key is still disconnected")
        #expect(Self.decide(.all, trusted: false) == .accept(byTrust: false))
    }

    @Test func aPlayerWithNoProvenKeyGetsInOnlyToAPlaintextHostThatAdmitsAll() {
        let refused = RelayHost.Admission.decline(.notTrusted, "an unencrypted player cannot join")
        for policy in [RelayHost.AcceptPolicy.paired, .ask(NobodyAsked()), .all] {
            #expect(Self.decide(policy, key: nil, trusted: true) == refused, "trust without a key proves nothing")
        }
        #expect(Self.decide(.paired, key: nil, encryption: .none) == refused)
        #expect(Self.decide(.ask(NobodyAsked()), key: nil, encryption: .none) == refused)
        #expect(Self.decide(.all, key: nil, encryption: .none) == .accept(byTrust: false))
    }

    @Test func thePairingContextGoesToThePairingWindowWhateverThePolicy() {
        for policy in [RelayHost.AcceptPolicy.paired, .ask(NobodyAsked()), .all] {
            #expect(Self.decide(policy, trusted: false, context: RelayHost.pairingContext) == .pairing)
            #expect(Self.decide(policy, key: nil, context: RelayHost.pairingContext) == .pairing)
        }
        #expect(Self.decide(.paired, context: Data("pair?".utf8)) == .decline(.notTrusted, "not paired"),
                "another context is an ordinary invitation")
    }

    @Test func anAudienceLendsItsLatestListAndSkipsNobody() throws {
        let audience = Audience()
        let a = try PeerID(displayName: "a"), b = try PeerID(displayName: "b")
        var lent: [[PeerID]] = []
        audience.withPeers { lent.append($0) }
        #expect(lent.isEmpty, "nobody to send to: the capture thread is not called")
        audience.publish([a, b])
        audience.withPeers { lent.append($0) }
        audience.publish([b])
        audience.withPeers { lent.append($0) }
        #expect(lent == [[a, b], [b]])
        #expect(audience.peers == [b])
        audience.publish([])
        audience.withPeers { lent.append($0) }
        #expect(lent.count == 2 && audience.peers.isEmpty)
    }

    @Test func concurrentPublishersNeverLeaveATornList() async throws {
        let audience = Audience()
        let peers = try (0..<8).map { try PeerID(displayName: "p\($0)") }
        let lists = (1...8).map { Array(peers.prefix($0)) }
        let torn = await withTaskGroup(of: Int.self) { group in
            for w in 0..<2 {
                group.addTask {
                    for i in 0..<2_000 { audience.publish(lists[(i + w) % lists.count]) }
                    return 0
                }
            }
            group.addTask {
                var torn = 0
                for _ in 0..<20_000 {
                    audience.withPeers { seen in if seen.isEmpty || !lists.contains(seen) { torn += 1 } }
                }
                return torn
            }
            return await group.reduce(0, +)
        }
        #expect(torn == 0)
    }
}
