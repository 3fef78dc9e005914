/// A byte stream, named by its link and the writer's id.
typealias StreamKey = LinkScopedID

/// The byte-stream protocol of one session as a pure state machine: each stream's credit (how much the writer may
/// still send) and window (how much the reader still lets in), and what a peer's frame means in the stream's
/// state. A writer that sends past the window, or frames for streams that are not open, is a fault that closes
/// its link; a flood of streams is refused beyond a limit.
///
/// Each event is one `mutating` method that returns the actions the driver performs in order; the streams' bytes
/// and the app's waiting threads live in the driver.
struct StreamStateMachine: Sendable {
    /// What the driver must do.
    enum Action: Equatable, Sendable {
        /// Write `frame` on `link`.
        case send(LinkID, StreamFrame)
        /// Our outgoing stream may send `bytes` more.
        case credit(StreamKey, Int)
        /// Our outgoing stream is over: the reader stopped reading (`.cancelled`, `.refused`) or the link went.
        case writerEnded(StreamKey, PeerMeshError)
        /// A peer opened a stream: make its reader and tell the app.
        case opened(StreamKey, PeerID, name: String)
        /// Bytes for an incoming stream's reader.
        case deliver(StreamKey, [UInt8])
        /// An incoming stream is over: nil at its end, else why it failed.
        case readerEnded(StreamKey, PeerMeshError?)
        /// The peer on `link` broke the protocol: count it and close the link.
        case fault(LinkID, PeerFault)
    }

    /// Limits against a peer that floods.
    struct Limits: Equatable, Sendable {
        /// Incoming streams one link may have open; more are refused.
        var maximumIncomingPerLink = 16
        /// Streams we closed as a reader whose writer has not acknowledged it yet, per link.
        var maximumClosingPerLink = 64
    }

    private enum Incoming: Equatable {
        /// Open: the writer may send `allowance` more bytes; `unacknowledged` were consumed but not yet credited.
        case open(allowance: Int, unacknowledged: Int)
        /// We closed it as the reader: its data is dropped until the writer's CLOSE retires the id.
        case closing
    }

    let limits: Limits
    /// Outgoing streams and the credit each has left.
    private var outgoing: [StreamKey: Int] = [:]
    private var incoming: [StreamKey: Incoming] = [:]
    private var nextID: UInt32 = 1

    init(limits: Limits = Limits()) { self.limits = limits }

    /// Streams open each way (for tests).
    var counts: (outgoing: Int, incoming: Int) { (outgoing.count, incoming.count) }

    // MARK: Our side writes

    /// The app opens a stream named `name` on `link`; it starts with a full window of credit.
    mutating func open(on link: LinkID, name: String) -> (StreamKey, [Action]) {
        let key = StreamKey(link: link, id: nextID)
        nextID = nextID == UInt32.max ? 1 : nextID + 1
        precondition(outgoing[key] == nil, "stream id reused while open")
        outgoing[key] = StreamFrame.window
        return (key, [.send(link, .open(id: key.id, name: name)), .credit(key, StreamFrame.window)])
    }

    /// The driver sends `count` bytes of `key` (within the credit it was given).
    mutating func write(_ count: Int, on key: StreamKey) -> [Action] {
        guard let credit = outgoing[key] else { return [] }  // ended meanwhile: the bytes are dropped
        precondition(count > 0 && count <= credit, "the driver wrote past the stream's credit")
        outgoing[key] = credit - count
        return []
    }

    /// The app closes (or fails) its outgoing stream.
    mutating func closeWriter(_ key: StreamKey, _ end: StreamEnd) -> [Action] {
        guard outgoing.removeValue(forKey: key) != nil else { return [] }
        return [.send(key.link, .close(id: key.id, byWriter: true, end))]
    }

    // MARK: Our side reads

    /// The app consumed `count` bytes of incoming stream `key`: credit the writer once half a window has built up.
    mutating func consumed(_ count: Int, of key: StreamKey) -> [Action] {
        guard case .open(let allowance, let pending) = incoming[key] else { return [] }
        let total = pending + count
        guard total >= StreamFrame.window / 2 else {
            incoming[key] = .open(allowance: allowance, unacknowledged: total)
            return []
        }
        incoming[key] = .open(allowance: allowance + total, unacknowledged: 0)
        return [.send(key.link, .credit(id: key.id, bytes: UInt32(total)))]
    }

    /// The app stops reading incoming stream `key`.
    mutating func closeReader(_ key: StreamKey) -> [Action] {
        guard case .open = incoming[key] else { return [] }
        incoming[key] = .closing
        return [.send(key.link, .close(id: key.id, byWriter: false, .cancelled)),
                .readerEnded(key, .cancelled("the stream was closed by this side"))]
    }

    // MARK: The peer's frames

    /// `frame` arrived from `peer` on `link`.
    mutating func received(_ frame: StreamFrame, on link: LinkID, from peer: PeerID) -> [Action] {
        let key = StreamKey(link: link, id: frame.id)
        switch frame {
        case .open(_, let name):
            guard incoming[key] == nil else { return fault(link, "a second STREAM_OPEN for stream \(key.id)") }
            // Checked on every OPEN, not only past the open limit: our app may close each stream as it arrives,
            // and a writer that never answers those CLOSEs must not grow this table without bound.
            guard closing(on: link) < limits.maximumClosingPerLink else {
                return fault(link, "STREAM_OPEN with \(limits.maximumClosingPerLink) closed streams it did not close")
            }
            let open = incoming.filter { $0.key.link == link && $0.value != .closing }.count
            if open >= limits.maximumIncomingPerLink {
                incoming[key] = .closing
                return [.send(link, .close(id: key.id, byWriter: false, .refused))]
            }
            incoming[key] = .open(allowance: StreamFrame.window, unacknowledged: 0)
            return [.opened(key, peer, name: name)]
        case .data(_, let bytes):
            switch incoming[key] {
            case .open(let allowance, let pending):
                guard bytes.count <= allowance else { return fault(link, "stream \(key.id) sent past its window") }
                incoming[key] = .open(allowance: allowance - bytes.count, unacknowledged: pending)
                return [.deliver(key, bytes)]
            case .closing: return []
            case nil: return fault(link, "STREAM_DATA for stream \(key.id), which is not open")
            }
        case .credit(_, let bytes):
            // A CREDIT can cross our CLOSE: for a stream we no longer write, it is not a fault.
            guard let credit = outgoing[key] else { return [] }
            let total = credit + Int(bytes)
            guard total <= StreamFrame.window else { return fault(link, "stream \(key.id) credited past its window") }
            outgoing[key] = total
            return [.credit(key, Int(bytes))]
        case .close(_, true, let end):
            switch incoming.removeValue(forKey: key) {
            case .open:
                let error: PeerMeshError? = end == .finished ? nil : .cancelled("the writer closed the stream (\(end))")
                return [.readerEnded(key, error)]
            case .closing, nil: return []
            }
        case .close(_, false, let end):
            // The reader stopped: acknowledge, so it can forget the id.
            guard outgoing.removeValue(forKey: key) != nil else { return [] }
            let error: PeerMeshError = end == .refused ? .resource("the peer refused the stream: \(end)")
                : .cancelled("the reader closed the stream")
            return [.send(link, .close(id: key.id, byWriter: true, .cancelled)), .writerEnded(key, error)]
        }
    }

    /// `link` closed: every stream on it ends.
    mutating func linkClosed(_ link: LinkID) -> [Action] {
        var actions: [Action] = []
        for key in outgoing.keys.filter({ $0.link == link }).sorted() {
            outgoing[key] = nil
            actions.append(.writerEnded(key, .notConnected("the connection closed")))
        }
        for key in incoming.keys.filter({ $0.link == link }).sorted() {
            if incoming.removeValue(forKey: key) != .closing {
                actions.append(.readerEnded(key, .notConnected("the connection closed before the stream ended")))
            }
        }
        return actions
    }

    private func closing(on link: LinkID) -> Int { incoming.filter { $0.key.link == link && $0.value == .closing }.count }

    private func fault(_ link: LinkID, _ what: String) -> [Action] { [.fault(link, .unexpectedFrame(what))] }
}
