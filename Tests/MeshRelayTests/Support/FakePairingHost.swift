import Foundation
import Synchronization
import MeshTestSupport
import PeerMesh

/// A host on 127.0.0.1 that advertises an open pairing window (`pair=1`) and takes every pairing invitation, but does
/// not know the code: what it answers to the player's first pairing message is its `Behaviour`'s.
final class FakePairingHost: SessionDelegate, NearbyServiceAdvertiserDelegate, Sendable {
    enum Behaviour: Sendable {
        /// "Paired" (message 4) at once, skipping the proof (message 2): an impostor.
        case claimsPaired
        /// After `seconds`, a message 2 it cannot make right: a decoy.
        case wrongProof(after: Double)
        /// Nothing at all: a decoy that holds the player.
        case silent
    }

    let session: Session
    let advertiser: NearbyServiceAdvertiser
    /// The pairing messages it was sent.
    let tried = Atomic<Int>(0)
    private let behaviour: Behaviour

    init(_ behaviour: Behaviour, name: String = "host", discovery: any DiscoveryBackend = InProcessDiscovery()) throws {
        self.behaviour = behaviour
        session = try Session(peer: try PeerID(displayName: name), configuration: .init(bindHost: "127.0.0.1"))
        advertiser = try NearbyServiceAdvertiser(peer: session.myPeerID, discoveryInfo: ["pair": "1"], serviceType: "mesh-audio",
                                                 discovery: discovery, bindHost: "127.0.0.1")
        session.delegate = self
        advertiser.delegate = self
        try advertiser.startAdvertisingPeer()
    }

    func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceiveInvitationFromPeer peer: PeerID,
                    withContext context: Data?, invitationHandler: @escaping @Sendable (Bool, Session?) -> Void) {
        invitationHandler(true, session)
    }
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didNotStartAdvertisingPeer error: PeerMeshError) {}
    func session(_ session: Session, peer: PeerID, didChange state: SessionState) {}
    func session(_ session: Session, didReceive data: Data, fromPeer peer: PeerID) {
        tried.add(1, ordering: .relaxed)
        switch behaviour {
        case .claimsPaired:
            try? session.send(Data(Pairing.resultMessage(.paired)), toPeers: [peer], with: .reliable)
        case .wrongProof(let delay):
            // A valid element of its own, a tag that cannot match.
            let element = Pairing.Initiator(code: "0000-0000", binding: [1]).firstMessage.suffix(32)
            let bogus = Array("PMP1".utf8) + [2] + Array(element) + [UInt8](repeating: 0xab, count: 32)
            DispatchQueue.global().asyncAfter(deadline: .now() + delay) { [session] in
                try? session.send(Data(bogus), toPeers: [peer], with: .reliable)
            }
        case .silent:
            break
        }
    }
}
