#if canImport(Glibc)
import Glibc
#endif
import MeshPOSIX

/// Bytes waiting to be written, consumed from the front without shifting on every write.
struct ByteQueue {
    private var storage: [UInt8] = []
    private var head = 0

    var count: Int { storage.count - head }
    var isEmpty: Bool { count == 0 }

    mutating func append(_ bytes: UnsafeRawBufferPointer) { storage.append(contentsOf: bytes) }

    /// Calls `body` with the unwritten bytes; it returns how many it consumed.
    mutating func drain(_ body: (UnsafeRawBufferPointer) -> Int) -> Int {
        let n = storage.withUnsafeBytes { body(UnsafeRawBufferPointer(rebasing: $0[head...])) }
        guard n > 0 else { return n }
        head += n
        if head == storage.count {
            storage.removeAll(keepingCapacity: true)
            head = 0
        } else if head > 65_536, head * 2 > storage.count {
            storage.removeFirst(head)
            head = 0
        }
        return n
    }
}

/// One TCP connection passed through unimpaired: client ↔ proxy ↔ target, with half-close carried across.
/// Touched only by the proxy's I/O thread.
final class TCPPipe {
    static let bufferLimit = 256 * 1024

    let client: FileDescriptor
    let upstream: FileDescriptor
    private var connected = false
    private var toTarget = ByteQueue()
    private var fromTarget = ByteQueue()
    private var clientEOF = false, upstreamEOF = false
    private var upstreamWriteShut = false, clientWriteShut = false
    private(set) var dead = false
    /// Bytes delivered since the I/O thread last collected them.
    var movedToTarget: UInt64 = 0
    var movedFromTarget: UInt64 = 0

    init(client: FileDescriptor, upstream: FileDescriptor) {
        self.client = client
        self.upstream = upstream
    }

    var clientEvents: Int16 {
        var e: Int32 = 0
        if !clientEOF, toTarget.count < Self.bufferLimit { e |= POLLIN }
        if !fromTarget.isEmpty { e |= POLLOUT }
        return Int16(e)
    }

    var upstreamEvents: Int16 {
        guard connected else { return Int16(POLLOUT) }
        var e: Int32 = 0
        if !upstreamEOF, fromTarget.count < Self.bufferLimit { e |= POLLIN }
        if !toTarget.isEmpty { e |= POLLOUT }
        return Int16(e)
    }

    func service(clientRevents cr: Int16, upstreamRevents ur: Int16, scratch: inout [UInt8]) {
        let readable = Int16(POLLIN | POLLHUP | POLLERR)
        if !connected, ur & Int16(POLLOUT | POLLERR | POLLHUP) != 0 {
            guard upstream.pendingError() == 0 else { dead = true; return }
            connected = true
        }
        if cr & readable != 0, !clientEOF, toTarget.count < Self.bufferLimit {
            if !read(from: client, into: &toTarget, eof: &clientEOF, scratch: &scratch) { dead = true; return }
        }
        if connected, ur & readable != 0, !upstreamEOF, fromTarget.count < Self.bufferLimit {
            if !read(from: upstream, into: &fromTarget, eof: &upstreamEOF, scratch: &scratch) { dead = true; return }
        }
        if connected {
            guard let n = write(&toTarget, to: upstream) else { dead = true; return }
            movedToTarget += UInt64(n)
        }
        guard let n = write(&fromTarget, to: client) else { dead = true; return }
        movedFromTarget += UInt64(n)
        if connected, clientEOF, toTarget.isEmpty, !upstreamWriteShut {
            shutdown(upstream.fd, Int32(SHUT_WR))
            upstreamWriteShut = true
        }
        if upstreamEOF, fromTarget.isEmpty, !clientWriteShut {
            shutdown(client.fd, Int32(SHUT_WR))
            clientWriteShut = true
        }
        if upstreamWriteShut, clientWriteShut { dead = true }
    }

    /// Reads what is there (up to the buffer limit); false on a socket error.
    private func read(from s: FileDescriptor, into q: inout ByteQueue, eof: inout Bool, scratch: inout [UInt8]) -> Bool {
        while q.count < Self.bufferLimit {
            let n = scratch.withUnsafeMutableBytes { recv(s.fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            if n > 0 {
                scratch.withUnsafeBytes { q.append(UnsafeRawBufferPointer(rebasing: $0[..<n])) }
                continue
            }
            if n == 0 { eof = true; return true }
            if errno == EINTR { continue }
            return errno == EAGAIN || errno == EWOULDBLOCK
        }
        return true
    }

    /// Writes what the socket takes; returns the byte count, or nil on a socket error.
    private func write(_ q: inout ByteQueue, to s: FileDescriptor) -> Int? {
        var total = 0
        while !q.isEmpty {
            var failed = false
            let n = q.drain { raw in
                let r = send(s.fd, raw.baseAddress, raw.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT))
                if r < 0, errno != EINTR, errno != EAGAIN, errno != EWOULDBLOCK { failed = true }
                return r
            }
            if failed { return nil }
            if n > 0 { total += n; continue }
            if n < 0, errno == EINTR { continue }
            break
        }
        return total
    }
}
