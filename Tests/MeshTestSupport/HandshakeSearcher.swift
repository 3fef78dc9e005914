// What a man in the middle does when it searches online for matching check digits (docs/PROTOCOL.md §3.2).
import Foundation
import MeshPOSIX
#if canImport(Glibc)
import Glibc
#endif

/// One try of a man in the middle searching for a handshake whose check digits match the ones another screen
/// shows: connects to 127.0.0.1:`port`, sends `preamble` (the inviter's, of the protocol version under test) and a
/// Noise message 1 (a random ephemeral key and a 32-byte commitment), waits up to `seconds` for the advertiser's
/// answer (its preamble and message 2: in wire version 3 what the searcher computed the digits from; since version
/// 4 the digits need a nonce the advertiser opens only once its app has an invitation), and hangs up. Each such try
/// still costs the advertiser a handshake, and is rationed.
///
/// Returns whether the advertiser answered; false when it closed the connection at once (refused) or said nothing.
package func abandonedHandshake(port: UInt16, preamble: [UInt8], seconds: Double = 2) -> Bool {
    guard let tcp = try? FileDescriptor.tcpConnect(to: SocketAddress(numericHost: "127.0.0.1", port: port)!) else { return false }
    return abandonedHandshake(over: tcp, preamble: preamble, seconds: seconds)
}

/// The same try over `tcp`, a connection to the advertiser made by other means (a relay pipe's end), which it closes.
package func abandonedHandshake(over tcp: FileDescriptor, preamble: [UInt8], seconds: Double = 2) -> Bool {
    defer { tcp.close() }
    var p = pollfd(fd: tcp.fd, events: Int16(POLLOUT), revents: 0)
    guard poll(&p, 1, Int32(seconds * 1_000)) == 1, p.revents & Int16(POLLOUT) != 0 else { return false }
    let message1 = (0..<64).map { _ in UInt8.random(in: 0...255) }
    let first = preamble + [0, UInt8(message1.count)] + message1
    guard first.withUnsafeBytes({ send(tcp.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) == first.count else { return false }
    // The advertiser's preamble (8 bytes) and message 2 (a u16 length, then 32 + 48 + commitment 32 + HELLO + 16): more than
    // this many bytes means message 2 came.
    let answer = 8 + 2 + 96
    var got = 0
    var buffer = [UInt8](repeating: 0, count: 4_096)
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline, got <= answer {
        p = pollfd(fd: tcp.fd, events: Int16(POLLIN), revents: 0)
        guard poll(&p, 1, 100) == 1 else { continue }
        let n = buffer.withUnsafeMutableBytes { recv(tcp.fd, $0.baseAddress, $0.count, 0) }
        guard n > 0 else { return false }
        got += n
    }
    return got > answer
}
