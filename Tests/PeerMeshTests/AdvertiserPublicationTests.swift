import Foundation
import Synchronization
import Testing
import MeshTestSupport
@testable import PeerMesh

/// A discovery backend that publishes the first record and refuses every later one (a daemon that turns the
/// updated record down, all alternative names taken…).
private final class RefusingRepublish: DiscoveryBackend, Sendable {
    let inner = InProcessDiscovery()
    let publications = Atomic<Int>(0)

    func publish(_ advertisement: ServiceAdvertisement,
                 onEvent: @escaping @Sendable (PublicationEvent) -> Void) throws(PeerMeshError) -> any DiscoveryRegistration {
        guard publications.add(1, ordering: .relaxed).newValue == 1 else { throw .discovery("the daemon refused the record") }
        return try inner.publish(advertisement, onEvent: onEvent)
    }

    func browse(serviceType: String, localPeer: PeerID,
                onEvent: @escaping @Sendable (BrowseEvent) -> Void) throws(PeerMeshError) -> any DiscoveryRegistration {
        try inner.browse(serviceType: serviceType, localPeer: localPeer, onEvent: onEvent)
    }
}

/// What an advertiser told its delegate about its publication.
private final class PublicationLog: NearbyServiceAdvertiserDelegate, Sendable {
    let events = Mutex<[PublicationEvent]>([])
    let notStarted = Mutex<[PeerMeshError]>([])
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceiveInvitationFromPeer peer: PeerID, withContext context: Data?,
                    invitationHandler: @escaping @Sendable (Bool, Session?) -> Void) { invitationHandler(false, nil) }
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didNotStartAdvertisingPeer error: PeerMeshError) {
        notStarted.withLock { $0.append(error) }
    }
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didUpdate publication: PublicationEvent) {
        events.withLock { $0.append(publication) }
    }
}

@Suite("An advertiser's publication")
struct AdvertiserPublicationTests {
    @Test("New discovery info that cannot be published: the caller gets the error, and the delegate hears that the peer is no longer advertised")
    func refusedUpdateIsReported() throws {
        let backend = RefusingRepublish()
        let peer = try PeerID(displayName: "host")
        let advertiser = try NearbyServiceAdvertiser(peer: peer, discoveryInfo: ["pair": "0"], serviceType: "pm-republish",
                                                     discovery: backend, bindHost: "127.0.0.1")
        let log = PublicationLog()
        advertiser.delegate = log
        try advertiser.startAdvertisingPeer()
        #expect(eventually(5) { log.events.withLock { $0 } == [.published(instanceName: peer.identityString)] })
        #expect(throws: PeerMeshError.discovery("the daemon refused the record")) { try advertiser.updateDiscoveryInfo(["pair": "1"]) }
        #expect(eventually(5) { log.events.withLock { $0.last } == .failed(.discovery("the daemon refused the record")) }, "\(log.events.withLock { $0 })")
        #expect(log.notStarted.withLock { $0 } == [.discovery("the daemon refused the record")])
        // Info that cannot be advertised at all changes nothing and says nothing more.
        #expect(throws: PeerMeshError.self) { try advertiser.updateDiscoveryInfo(["_bad key=": String(repeating: "x", count: 300)]) }
        Thread.sleep(forTimeInterval: 0.2)
        #expect(log.events.withLock { $0.count } == 2)
        advertiser.stopAdvertisingPeer()
    }
}
