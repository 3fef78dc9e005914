import Foundation
import MeshPOSIX
@testable import PeerMesh
#if canImport(Glibc)
import Glibc
#endif

/// A TCP connection to 127.0.0.1:`port` (from `source`, another loopback address, when given), with nothing sent yet.
func connectRaw(_ port: UInt16, from source: String? = nil) throws -> FileDescriptor {
    try FileDescriptor.tcpConnect(to: SocketAddress(numericHost: "127.0.0.1", port: port)!,
                                  from: source.flatMap { SocketAddress(numericHost: $0, port: 0) })
}

/// Writes all of `bytes`, waiting up to `seconds` for room. Returns whether it wrote them all (a peer that stops
/// reading, or closes, leaves a write unfinished).
@discardableResult
func sendAll(_ fd: FileDescriptor, _ bytes: [UInt8], seconds: Double = 2) -> Bool {
    var off = 0
    let deadline = Date().addingTimeInterval(seconds)
    while off < bytes.count, Date() < deadline {
        let n = bytes.withUnsafeBytes { Glibc.send(fd.fd, $0.baseAddress! + off, $0.count - off, Int32(MSG_NOSIGNAL)) }
        if n > 0 { off += n } else { usleep(1_000) }
    }
    return off == bytes.count
}

/// An attacker's client: it runs the PeerMesh handshake itself (with a key of its own — it needs none of the
/// host's), then writes whatever frames and bytes it likes, sealed under the real channel keys, as it likes them
/// batched. What a lying peer can do, without a `Session` of ours in the way.
final class RawGuest: @unchecked Sendable { // one thread at a time: a test hands it over and waits
    let fd: FileDescriptor
    let peer: PeerID
    private var channel: SecureChannel

    /// Connects to an advertiser on 127.0.0.1:`port` (from `source`, when given) and finishes the handshake
    /// (message 3 carries HELLO).
    init(port: UInt16, name: String, from source: String? = nil) throws {
        fd = try connectRaw(port, from: source)
        peer = try PeerID(displayName: name)
        channel = SecureChannel(configuration: .init(role: .initiator, preference: .required, localPeer: peer))
        for case .write(let b) in channel.start() { sendAll(fd, b) }
        var buffer = [UInt8](repeating: 0, count: 4096)
        let deadline = Date().addingTimeInterval(3)
        while Date() < deadline {
            let n = buffer.withUnsafeMutableBytes { recv(fd.fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            guard n > 0 else { usleep(500); continue }
            let events = buffer.withUnsafeBytes { channel.received(UnsafeRawBufferPointer(rebasing: $0[..<n])) }
            if events.contains(where: { if case .needsApproval = $0 { true } else { false } }) {
                for case .write(let b) in channel.approve() { sendAll(fd, b) }
                return
            }
        }
        throw PeerMeshError.transport("the handshake with 127.0.0.1:\(port) did not finish")
    }

    /// `frames`, each sealed in its own record, in one write: they reach the other side in one read. Returns
    /// whether all of it was written.
    @discardableResult
    func send(_ frames: [ControlFrame]) -> Bool {
        var bytes: [UInt8] = []
        for f in frames { bytes += channel.send(f) }
        return sendAll(fd, bytes)
    }

    /// Reads what the other side sends until `count` frames have come: true then; false when the connection ends
    /// first, or `seconds` pass.
    func receiveFrames(_ count: Int, within seconds: Double) -> Bool {
        var got = 0
        return receive(within: seconds) { _ in
            got += 1
            return got >= count
        } != nil
    }

    /// Reads what the other side sends until a frame `matches`: that frame; nil when the connection ends or breaks
    /// (a read with a fault in it) first, or `seconds` pass. Frames after it in the same read are dropped.
    func receive(within seconds: Double, until matches: (ControlFrame) -> Bool) -> ControlFrame? {
        var buffer = [UInt8](repeating: 0, count: 4096)
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            let n = buffer.withUnsafeMutableBytes { recv(fd.fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            if n == 0 { return nil }
            guard n > 0 else { usleep(500); continue }
            let events = buffer.withUnsafeBytes { channel.received(UnsafeRawBufferPointer(rebasing: $0[..<n])) }
            if events.contains(where: { if case .fault = $0 { true } else { false } }) { return nil }
            for case .frame(let f) in events where matches(f) { return f }
        }
        return nil
    }

    /// Bytes as they are, after the handshake. Returns whether all of them were written.
    @discardableResult
    func sendRaw(_ bytes: [UInt8]) -> Bool { sendAll(fd, bytes) }

    /// A plaintext frame sealed as the next record, without sending it.
    func seal(_ frame: ControlFrame) -> [UInt8] { channel.send(frame) }

    /// Encoded frames (`ControlFrame.encoded()`, concatenated) sealed as the next records, without sending them:
    /// many frames to a record, as no honest sender packs them.
    func seal(frames bytes: [UInt8]) -> [UInt8] { channel.seal(bytes) }

    /// An INVITE into the host's session, as a `Session` would send it.
    static func invite(token: UInt64 = 0x5eed_0001) -> ControlFrame {
        .invite(.init(context: [], timeoutMillis: 10_000, udpPort: 9, token: token))
    }
}
