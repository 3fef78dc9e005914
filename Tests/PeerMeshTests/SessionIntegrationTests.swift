import Foundation
import Testing
@testable import PeerMesh

@Suite("Sessions over real sockets on 127.0.0.1")
struct SessionIntegrationTests {
    @Test("Two peers connect through advertiser, browser and invitation")
    func twoPeersConnect() throws {
        let pair = try Pair()
        #expect(pair.guestLog.states(of: pair.hostPeer) == [.connecting, .connected])
        #expect(pair.hostLog.states(of: pair.guestPeer) == [.connecting, .connected])
        #expect(pair.host.connectedPeers == [pair.guestPeer])
        #expect(pair.guest.connectedPeers == [pair.hostPeer])
        let inv = pair.hostLog.snapshot.invitations
        #expect(inv.count == 1)
        #expect(inv.first?.0 == pair.guestPeer)
        #expect(inv.first?.1 == Data("hi".utf8))
        // Events arrive off the caller's thread.
        let events = pair.guestLog.snapshot.eventThreads
        #expect(!events.isEmpty && !events.contains(UInt(pthread_self())))
    }
}
