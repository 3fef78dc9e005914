import Foundation
import Testing
import MeshTestSupport
@testable import PeerMesh

/// The datagram send path real-time threads call (`sendDatagram(_:toConnected:)`): a whole datagram is assembled
/// and sealed on the stack, the largest one included.
@Suite("Datagram send path")
struct SendPathTests {
    @Test("The scratch holds the largest sealed datagram and lives on the stack (no malloc per packet)")
    func scratchIsOnTheStack() {
        let largest = DatagramHeader.size + Session.maximumDatagramSize + Sodium.tagSize
        var local = 0
        let (count, distance) = withUnsafeMutablePointer(to: &local) { here in
            withDatagramScratch { buf in
                (buf.count, abs(Int(bitPattern: buf.baseAddress!) - Int(bitPattern: here)))
            }
        }
        #expect(count >= largest, "room for \(count) bytes; the largest datagram is \(largest)")
        // Beside this frame's own local: the heap (or an mmap) is megabytes away.
        #expect(distance < 64 * 1024, "the scratch is \(distance) bytes from a local variable")
    }

    @Test("A largest-size datagram (1,184 bytes: stereo Float32 at period 128 and more) arrives whole, encrypted")
    func largestDatagramArrivesWhole() throws {
        let pair = try Pair()
        let payload = Data((0..<Session.maximumDatagramSize).map { UInt8(truncatingIfNeeded: $0 &* 7) })
        try pair.host.send(payload, toPeers: [pair.guestPeer], with: .unreliable)
        #expect(pair.guestLog.wait(3) { $0.datagrams.contains { $0.1 == payload } })
        #expect(pair.host.isEncrypted(pair.guestPeer))
    }
}
