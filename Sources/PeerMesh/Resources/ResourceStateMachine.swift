/// A resource transfer, named by its link and the sending side's id.
typealias ResourceKey = LinkScopedID

/// The resource-transfer protocol of one session as a pure state machine: which transfers are in flight each way,
/// how many bytes each still owes, and what a peer's frame means in the transfer's state. Peers that lie (more
/// bytes than announced, an END before the last byte, frames for transfers that never started) are faults that
/// close their link; a flood of transfers is refused beyond a limit.
///
/// Each event is one `mutating` method that returns the actions the driver performs in order. Files, hashes and
/// the app live in the driver; the machine never touches them.
struct ResourceStateMachine: Sendable {
    /// What the driver must do.
    enum Action: Equatable, Sendable {
        /// Write `frame` on `link`.
        case send(LinkID, ResourceFrame)
        /// Outgoing transfers on `link` may send more chunks.
        case pump(LinkID)
        /// Everything of an outgoing transfer has been sent: send END with the hash of what was sent.
        case sendEnd(ResourceKey)
        /// An outgoing transfer ended: call its completion handler (nil: the receiver has it, verified).
        case complete(ResourceKey, PeerMeshError?)
        /// A peer starts sending `name` (`size` bytes): create its partial file and tell the app.
        case open(ResourceKey, PeerID, name: String, size: UInt64)
        /// Append `bytes` to the partial file (and to its hash).
        case write(ResourceKey, [UInt8])
        /// Every byte is in: compare the hash of what was written with `sha256`, then report `verified`.
        case verify(ResourceKey, sha256: [UInt8])
        /// Move the verified file into place and hand it to the app.
        case deliver(ResourceKey)
        /// Delete the partial file and tell the app why the transfer failed.
        case discard(ResourceKey, PeerMeshError)
        /// The peer on `link` broke the protocol: count it and close the link.
        case fault(LinkID, PeerFault)
    }

    /// Limits against a peer that floods.
    struct Limits: Equatable, Sendable {
        /// Incoming transfers one link may have in progress; more are refused.
        var maximumIncomingPerLink = 8
        /// Largest resource accepted, in bytes.
        var maximumSize: UInt64 = 1 << 36
        /// Refused or cancelled transfers whose sender has not yet closed them, per link; a peer past this is
        /// ignoring our answers, and is a fault.
        var maximumDiscardingPerLink = 64
    }

    private enum Outgoing: Equatable {
        /// Sending; `sent` of `size` bytes so far.
        case sending(size: UInt64, sent: UInt64)
        /// END sent; waiting for the receiver's RESULT.
        case awaitingResult
    }

    private enum Incoming: Equatable {
        /// Receiving `received` of `size` bytes from `peer`.
        case receiving(size: UInt64, received: UInt64)
        /// END arrived; the driver is comparing hashes.
        case verifying
        /// Refused or cancelled here: its chunks are dropped until the sender's END or CANCEL retires the id.
        case discarding
    }

    let limits: Limits
    private var outgoing: [ResourceKey: Outgoing] = [:]
    private var incoming: [ResourceKey: Incoming] = [:]
    private var nextID: UInt32 = 1

    init(limits: Limits = Limits()) { self.limits = limits }

    // MARK: Queries

    /// Bytes the outgoing transfer `key` still has to send, or nil when it is not sending.
    func remaining(_ key: ResourceKey) -> UInt64? {
        guard case .sending(let size, let sent) = outgoing[key] else { return nil }
        return size - sent
    }

    /// The outgoing transfers on `link` that still have bytes to send, in the order they started.
    func sending(on link: LinkID) -> [ResourceKey] {
        outgoing.compactMap { key, state in
            guard key.link == link, case .sending(let size, let sent) = state, sent < size else { return nil }
            return key
        }.sorted()
    }

    /// Bytes the incoming transfers on `link` that are still receiving are owed (what they will yet write to the disk).
    func owedIncomingBytes(on link: LinkID) -> UInt64 {
        incoming.reduce(0) { total, entry in
            guard entry.key.link == link, case .receiving(let size, let received) = entry.value else { return total }
            let (sum, overflow) = total.addingReportingOverflow(size - received)
            return overflow ? .max : sum
        }
    }

    /// Transfers in flight, each way (for tests and statistics).
    var counts: (outgoing: Int, incoming: Int) { (outgoing.count, incoming.count) }

    // MARK: Events: our side sends

    /// The app sends a resource of `size` bytes named `name` on `link`. Returns the transfer's key.
    mutating func begin(on link: LinkID, size: UInt64, name: String) -> (ResourceKey, [Action]) {
        let key = ResourceKey(link: link, id: nextID)
        nextID = nextID == UInt32.max ? 1 : nextID + 1
        precondition(outgoing[key] == nil, "resource id reused while in flight")
        outgoing[key] = .sending(size: size, sent: 0)
        let actions: [Action] = size == 0 ? [.send(link, .start(id: key.id, size: 0, name: name))] + finishSending(key)
            : [.send(link, .start(id: key.id, size: size, name: name)), .pump(link)]
        return (key, actions)
    }

    /// The driver sent `count` more bytes of `key` as a CHUNK.
    mutating func sent(_ count: Int, of key: ResourceKey) -> [Action] {
        guard case .sending(let size, let sent) = outgoing[key] else { preconditionFailure("sent bytes of a transfer that is not sending") }
        let total = sent + UInt64(count)
        precondition(count > 0 && total <= size, "the driver sent more than the resource holds")
        outgoing[key] = .sending(size: size, sent: total)
        return total == size ? finishSending(key) : []
    }

    private mutating func finishSending(_ key: ResourceKey) -> [Action] {
        outgoing[key] = .awaitingResult
        return [.sendEnd(key)]
    }

    /// Our app cancelled the outgoing transfer `key` (or its file failed, with `error`).
    mutating func cancelOutgoing(_ key: ResourceKey, error: PeerMeshError) -> [Action] {
        guard outgoing.removeValue(forKey: key) != nil else { return [] }
        return [.send(key.link, .cancel(id: key.id)), .complete(key, error)]
    }

    // MARK: Events: our side receives

    /// Our app cancelled the incoming transfer `key` (`.cancelled`), or storing it failed (`.storageFailed`).
    mutating func cancelIncoming(_ key: ResourceKey, outcome: ResourceOutcome, text: String) -> [Action] {
        guard let state = incoming[key], state != .discarding else { return [] }
        // After END the sender sends nothing more for this id, so there is nothing left to wait for.
        if state == .verifying { incoming[key] = nil } else { incoming[key] = .discarding }
        let error: PeerMeshError = outcome == .cancelled ? .cancelled("the resource transfer was cancelled") : .resource("\(outcome): \(text)")
        return [.send(key.link, .result(id: key.id, outcome, text)), .discard(key, error)]
    }

    /// The driver compared the hash of the bytes written for `key` with the sender's and, when they matched, moved
    /// the file into place: `.delivered`, `.hashMismatch`, or `.storageFailed` with `text` saying what failed.
    mutating func verified(_ key: ResourceKey, outcome: ResourceOutcome, text: String) -> [Action] {
        guard incoming[key] == .verifying else { return [] }  // cancelled meanwhile
        incoming[key] = nil
        if outcome == .delivered { return [.send(key.link, .result(id: key.id, .delivered, "")), .deliver(key)] }
        return [.send(key.link, .result(id: key.id, outcome, text)), .discard(key, Self.error(outcome, text))]
    }

    // MARK: Events: the peer's frames

    /// `frame` arrived from `peer` on `link`.
    mutating func received(_ frame: ResourceFrame, on link: LinkID, from peer: PeerID) -> [Action] {
        let key = ResourceKey(link: link, id: frame.id)
        switch frame {
        case .start(_, let size, let name):
            guard incoming[key] == nil else { return fault(link, "a second RESOURCE_START for transfer \(key.id)") }
            // Checked on every START, not only when refusing: our app may cancel each transfer as it starts, and a
            // sender that never closes those ids must not grow this table without bound.
            guard discarding(on: link) < limits.maximumDiscardingPerLink else {
                return fault(link, "RESOURCE_START with \(limits.maximumDiscardingPerLink) refused or cancelled transfers it did not close")
            }
            let active = incoming.filter { $0.key.link == link && $0.value != .discarding }.count
            let why: String? = if !ResourceName.isValid(name) {
                "its name holds control or invisible characters"
            } else if limits.maximumSize == 0 {
                "this peer takes no resources"
            } else if size > limits.maximumSize {
                "larger than the \(limits.maximumSize) bytes accepted"
            } else if active >= limits.maximumIncomingPerLink {
                "\(limits.maximumIncomingPerLink) transfers from this peer are already in progress"
            } else {
                nil
            }
            if let why {
                incoming[key] = .discarding
                return [.send(link, .result(id: key.id, .refused, why))]
            }
            incoming[key] = .receiving(size: size, received: 0)
            return [.open(key, peer, name: name, size: size)]
        case .chunk(_, let bytes):
            switch incoming[key] {
            case .receiving(let size, let received):
                let total = received + UInt64(bytes.count)
                guard total <= size else { return fault(link, "more bytes than the \(size) it announced for transfer \(key.id)") }
                incoming[key] = .receiving(size: size, received: total)
                return [.write(key, bytes)]
            case .discarding: return []
            case .verifying, nil: return fault(link, "RESOURCE_CHUNK for transfer \(key.id), which is not receiving")
            }
        case .end(_, let hash):
            switch incoming[key] {
            case .receiving(let size, let received):
                guard received == size else { return fault(link, "RESOURCE_END after \(received) of \(size) bytes") }
                incoming[key] = .verifying
                return [.verify(key, sha256: hash)]
            case .discarding:
                incoming[key] = nil
                return []
            case .verifying, nil: return fault(link, "RESOURCE_END for transfer \(key.id), which is not receiving")
            }
        case .cancel:
            // A CANCEL can cross our RESULT: an id we no longer know is not a fault.
            switch incoming.removeValue(forKey: key) {
            case .receiving, .verifying: return [.discard(key, .cancelled("the sender cancelled the resource transfer"))]
            case .discarding, nil: return []
            }
        case .result(_, let outcome, let text):
            // A RESULT can cross our CANCEL likewise.
            guard let state = outgoing.removeValue(forKey: key) else { return [] }
            switch (state, outcome) {
            case (.awaitingResult, .delivered):
                return [.complete(key, nil)]
            case (.sending, .delivered):
                return fault(link, "RESOURCE_RESULT delivered before every byte was sent")
            case (.sending, _):
                // The receiver gave up midway: close the id so it stops waiting for us.
                return [.send(link, .cancel(id: key.id)), .complete(key, Self.error(outcome, text))]
            case (.awaitingResult, _):
                return [.complete(key, Self.error(outcome, text))]
            }
        }
    }

    /// `link` closed: every transfer on it fails.
    mutating func linkClosed(_ link: LinkID) -> [Action] {
        var actions: [Action] = []
        for key in outgoing.keys.filter({ $0.link == link }).sorted() {
            outgoing[key] = nil
            actions.append(.complete(key, .notConnected("the connection closed before the resource was delivered")))
        }
        for key in incoming.keys.filter({ $0.link == link }).sorted() {
            if incoming.removeValue(forKey: key) != .discarding {
                actions.append(.discard(key, .notConnected("the connection closed before the resource arrived")))
            }
        }
        return actions
    }

    // MARK: Helpers

    private func discarding(on link: LinkID) -> Int { incoming.filter { $0.key.link == link && $0.value == .discarding }.count }

    private func fault(_ link: LinkID, _ what: String) -> [Action] { [.fault(link, .unexpectedFrame(what))] }

    private static func error(_ outcome: ResourceOutcome, _ text: String) -> PeerMeshError {
        if outcome == .cancelled { return .cancelled("the receiver cancelled the resource transfer") }
        return .resource(text.isEmpty ? outcome.description : "\(outcome.description): \(text)")
    }
}
