import FoundationEssentials
import MeshPOSIX
import Synchronization

/// What both ends of a stream hold: its name and peer, its key, the session's driver (weakly: a stream never keeps
/// a session alive), and the signal the app's waiting thread sleeps on.
struct StreamLink: Sendable {
    let name: String
    let peer: PeerID
    let key: StreamKey
    weak let core: SessionCore?
    let wake = WakeSignal()

    /// The driver, for a call that may wait: never on the session's own I/O thread, which would wait on itself.
    func coreForWaiting(_ call: String) throws(PeerMeshError) -> SessionCore {
        guard let core, !core.loop.inLoop else {
            throw .invalidParameter("\(call): not on the session's I/O thread (it would wait on itself), and not after the session is gone")
        }
        return core
    }

    /// Runs `work` on the session's I/O thread, if the session is still there.
    func onLoop(_ work: @escaping @Sendable (SessionCore, StreamKey) -> Void) {
        guard let core else { return }
        let key = key
        core.loop.execute { [weak core] in if let core { work(core, key) } }
    }
}

/// Either end of a byte stream: its name and the peer at the other end (`OutputByteStream`, `InputByteStream`).
public class ByteStream: @unchecked Sendable {  // its one stored property is an immutable `let` of a Sendable type
    /// The stream's name, as the writer gave it.
    public var name: String { link.name }
    /// The peer at the other end.
    public var peer: PeerID { link.peer }
    let link: StreamLink

    init(name: String, peer: PeerID, key: StreamKey, core: SessionCore) {
        link = StreamLink(name: name, peer: peer, key: key, core: core)
    }
}

/// The writing end of a byte stream to a peer, as the `OutputStream` MC's `startStream(withName:toPeer:)` returns.
///
/// `write` blocks while the reader's window is full (the reader's app has not consumed what was sent), so a slow
/// reader slows the writer down, never the session. Call it from an app thread, never from a delegate call (that
/// would stop the session's own I/O thread). Thread-safe; one writer at a time keeps the bytes in order.
public final class OutputByteStream: ByteStream, @unchecked Sendable {  // its own state is behind a Mutex
    private struct State {
        var credit = 0
        var ended: PeerMeshError?
        var closed = false
    }

    private let state = Mutex(State())

    /// Sends all of `data`, waiting for the reader's window as needed.
    ///
    /// - Throws: `.cancelled` if the reader closed the stream, `.notConnected` if the link went, `.timedOut` if the
    ///   reader took nothing for `timeout` (the bytes before were sent), `invalidParameter` after `close()` or on the
    ///   session's I/O thread.
    public func write(_ data: Data, timeout: Duration = .seconds(30)) throws(PeerMeshError) {
        _ = try link.coreForWaiting("write")
        let bytes = [UInt8](data)
        var offset = 0
        var deadline = MonotonicClock.deadline(after: timeout.nanoseconds)
        while offset < bytes.count {
            let grant = try state.withLock { (s) throws(PeerMeshError) -> Int in
                if let e = s.ended { throw e }
                if s.closed { throw .invalidParameter("write: the stream is closed") }
                let n = min(s.credit, bytes.count - offset, StreamFrame.maximumData)
                s.credit -= n
                return n
            }
            guard grant > 0 else {
                if !link.wake.wait(untilNanos: deadline) {
                    throw .timedOut("write: the reader took nothing for \(timeout); \(offset) of \(bytes.count) bytes were sent")
                }
                continue
            }
            let chunk = Array(bytes[offset..<(offset + grant)])
            offset += grant
            deadline = MonotonicClock.deadline(after: timeout.nanoseconds)
            link.onLoop { core, key in core.writeStream(key, chunk) }
        }
    }

    /// Ends the stream: the reader reads what was sent, then the end of the stream. Later calls do nothing.
    public func close() {
        let first = state.withLock { s -> Bool in
            defer { s.closed = true }
            return !s.closed && s.ended == nil
        }
        if first { link.onLoop { core, key in core.closeStream(writer: key) } }
    }

    /// Whether the stream can no longer be written (closed here, by the reader, or with its link).
    public var isClosed: Bool { state.withLock { $0.closed || $0.ended != nil } }

    // Driver side (loop thread).

    func addCredit(_ n: Int) {
        state.withLock { $0.credit += n }
        link.wake.signal()
    }

    func end(_ error: PeerMeshError) {
        state.withLock { if $0.ended == nil { $0.ended = error } }
        link.wake.signal()
    }
}

/// The reading end of a byte stream from a peer, as the `InputStream` MC's `didReceive stream` hands over.
///
/// `read` returns bytes as they arrive and nil at the end of the stream; the writer may send at most a window
/// (256 KiB) ahead of what has been read, so an app that reads slowly holds the writer back and memory stays bounded.
/// Call it from an app thread, never from a delegate call. Thread-safe.
public final class InputByteStream: ByteStream, @unchecked Sendable {  // its own state is behind a Mutex
    private struct State {
        var buffer: [UInt8] = []
        var start = 0
        var finished = false
        var error: PeerMeshError?
        var closed = false
    }

    private let state = Mutex(State())

    /// Up to `maxLength` bytes, waiting up to `timeout` for some to arrive; nil at the end of the stream.
    ///
    /// - Throws: `.cancelled` if the writer gave up, `.notConnected` if the link went, `.timedOut` if nothing came
    ///   within `timeout`, `invalidParameter` after `close()` or on the session's I/O thread.
    public func read(maxLength: Int = 65_536, timeout: Duration = .seconds(30)) throws(PeerMeshError) -> Data? {
        guard maxLength > 0 else { throw .invalidParameter("read: maxLength must be positive") }
        _ = try link.coreForWaiting("read")
        let deadline = MonotonicClock.deadline(after: timeout.nanoseconds)
        while true {
            let taken = try state.withLock { (s) throws(PeerMeshError) -> [UInt8]? in
                if s.closed { throw .invalidParameter("read: the stream is closed") }
                let available = s.buffer.count - s.start
                if available > 0 {
                    let n = min(available, maxLength)
                    let out = Array(s.buffer[s.start..<(s.start + n)])
                    s.start += n
                    if s.start == s.buffer.count { s.buffer.removeAll(keepingCapacity: true); s.start = 0 }
                    return out
                }
                if let e = s.error { throw e }
                return s.finished ? [] : nil
            }
            if let taken {
                if taken.isEmpty { return nil }
                link.onLoop { core, key in core.consumedStream(key, taken.count) }
                return Data(taken)
            }
            if !link.wake.wait(untilNanos: deadline) { throw .timedOut("read: nothing arrived within \(timeout)") }
        }
    }

    /// Stops reading: the writer's next `write` fails with `.cancelled`. Later calls do nothing.
    public func close() {
        let first = state.withLock { s -> Bool in
            defer { s.closed = true }
            return !s.closed
        }
        if first { link.onLoop { core, key in core.closeStream(reader: key) } }
    }

    // Driver side (loop thread).

    func append(_ bytes: [UInt8]) {
        state.withLock { s in
            if s.start > 0, s.start == s.buffer.count { s.buffer.removeAll(keepingCapacity: true); s.start = 0 }
            s.buffer.append(contentsOf: bytes)
        }
        link.wake.signal()
    }

    func finish(_ error: PeerMeshError?) {
        state.withLock { s in
            s.finished = true
            if s.error == nil { s.error = error }
        }
        link.wake.signal()
    }
}

/// Byte streams: the driver of `StreamStateMachine`.
extension SessionCore {
    func startStream(name: String, to peer: PeerID) throws(PeerMeshError) -> OutputByteStream {
        guard (1...255).contains(name.utf8.count) else { throw .invalidParameter("startStream: the name must be 1–255 UTF-8 bytes") }
        guard let link = shared.withLock({ $0.machine.primaryLink(for: peer) }) else {
            throw .notConnected("startStream: peer \(peer) is not connected")
        }
        let stream: OutputByteStream? = loop.submitAndWait { [self] in
            guard io.value.connections[link] != nil else { return nil }
            let (key, actions) = io.value.streams.open(on: link, name: name)
            let stream = OutputByteStream(name: name, peer: peer, key: key, core: self)
            io.value.outputStreams[key] = stream
            performStreams(actions)
            return stream
        }
        guard let stream else { throw .notConnected("startStream: peer \(peer) is not connected") }
        return stream
    }

    func performStreams(_ actions: [StreamStateMachine.Action]) {
        for action in actions {
            switch action {
            case .send(let link, let frame):
                io.value.connections[link]?.send(.stream(frame))
                noteQueue(link)
            case .credit(let key, let n):
                io.value.outputStreams[key]?.addCredit(n)
            case .writerEnded(let key, let error):
                io.value.outputStreams.removeValue(forKey: key)?.end(error)
            case .opened(let key, let peer, let name):
                let stream = InputByteStream(name: name, peer: peer, key: key, core: self)
                io.value.inputStreams[key] = stream
                if let s = owner.withLock({ $0.value }), let d = delegate.withLock({ $0.value }) {
                    d.session(s, didReceive: stream, withName: name, fromPeer: peer)
                } else {
                    stream.close()
                }
            case .deliver(let key, let bytes):
                io.value.inputStreams[key]?.append(bytes)
            case .readerEnded(let key, let error):
                io.value.inputStreams.removeValue(forKey: key)?.finish(error)
            case .fault(let link, let fault):
                faulted(link, fault)
            }
        }
    }

    func writeStream(_ key: StreamKey, _ bytes: [UInt8]) {
        guard io.value.outputStreams[key] != nil else { return }
        performStreams(io.value.streams.write(bytes.count, on: key))
        io.value.connections[key.link]?.send(.stream(.data(id: key.id, bytes: bytes)))
        noteQueue(key.link)
    }

    func closeStream(writer key: StreamKey) {
        io.value.outputStreams[key] = nil
        performStreams(io.value.streams.closeWriter(key, .finished))
    }

    func closeStream(reader key: StreamKey) {
        performStreams(io.value.streams.closeReader(key))
    }

    func consumedStream(_ key: StreamKey, _ count: Int) {
        performStreams(io.value.streams.consumed(count, of: key))
    }
}
