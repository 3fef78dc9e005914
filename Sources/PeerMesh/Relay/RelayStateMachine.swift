/// A relay pipe as one link knows it: the link, the pipe's number there, and whether this side numbered it.
struct PipeKey: Hashable, Sendable, Comparable {
    var link: LinkID
    var id: UInt32
    /// This side opened the pipe on `link` (and chose `id`).
    var mine: Bool

    static func < (a: PipeKey, b: PipeKey) -> Bool { (a.link, a.id, a.mine ? 1 : 0) < (b.link, b.id, b.mine ? 1 : 0) }
}

/// Relay pipes of one session as a pure state machine: the pipes this member is an end of (a member that cannot
/// reach another directly calls it through one they both reach, or is called that way), and the pipes it splices
/// for two of its members. Each direction of a pipe has a window end to end: an end sends at most `window` bytes
/// that the far end has not credited, and a splicing member forwards no more than that, so it holds at most one
/// window per direction per pipe. A CLOSE is answered by a CLOSE; until the answer, the pipe's id stays taken and
/// its frames are dropped. A peer that breaks any of this is a fault that closes its link; pipes beyond the limits
/// are refused.
///
/// Each event is one `mutating` method returning the actions the driver performs in order; sockets live in the
/// driver. See docs/PROTOCOL.md §3.9.
struct RelayStateMachine: Sendable {
    /// What the driver must do.
    enum Action: Equatable, Sendable {
        /// Write `frame` on `link`.
        case send(LinkID, RelayFrame)
        /// Make this side's end of pipe `key` to `peer`: `calling` (we asked for it) starts our invitation through it;
        /// otherwise the pipe is an incoming connection for our listener.
        case openEnd(PipeKey, peer: PeerID, calling: Bool)
        /// Our end of `key` may send `bytes` more.
        case credit(PipeKey, Int)
        /// Bytes that arrived for our end of `key`.
        case deliver(PipeKey, [UInt8])
        /// Our end of `key` is over: close its socket.
        case closeEnd(PipeKey)
        /// The peer on `link` broke the relay protocol: count it and close the link.
        case fault(LinkID, PeerFault)
    }

    /// Limits against a member that floods.
    struct Limits: Equatable, Sendable {
        /// Pipes (live or closing) one link may have that the other side opened; more are refused.
        var maximumPerLink = 16
        /// Pipes this member splices at once.
        var maximumSpliced = 64
        /// Refusals on one link not yet answered before further requests are a fault.
        var maximumRefusedPerLink = 64
        /// Pipes on one link that we closed (or refused) and its peer has not answered yet; one more is a fault of
        /// that peer. Each of our CLOSEs is answered at once by an honest peer, so this bounds the table against a
        /// member that never answers while another opens and closes pipes to it through us.
        var maximumUnansweredPerLink = 256
    }

    private enum Pipe: Equatable {
        /// We are an end: we may send `credit` more; the far end may send `allowance` more; `unacknowledged`
        /// bytes were taken off the pipe and not yet credited.
        case end(peer: PeerID, credit: Int, allowance: Int, unacknowledged: Int)
        /// We splice this leg to `other`; `inFlight` bytes came in on this leg and were passed on but not credited.
        case splice(to: PipeKey, inFlight: Int)
        /// We sent CLOSE (or refused) and wait for the answering CLOSE.
        case closing
    }

    let topology: Session.Topology
    let limits: Limits
    private var pipes: [PipeKey: Pipe] = [:]
    private var nextID: UInt32 = 1

    init(topology: Session.Topology, limits: Limits = Limits()) {
        self.topology = topology
        self.limits = limits
    }

    /// Pipes this member is an end of, and legs it splices (for tests).
    var counts: (ends: Int, spliced: Int, closing: Int) {
        var e = 0, s = 0, c = 0
        for p in pipes.values {
            switch p {
            case .end: e += 1
            case .splice: s += 1
            case .closing: c += 1
            }
        }
        return (e, s, c)
    }

    /// Whether `key` is a live end.
    func isEnd(_ key: PipeKey) -> Bool {
        if case .end = pipes[key] { return true }
        return false
    }

    // MARK: Our side

    /// We cannot reach `peer` directly: ask the member on `link` (who introduced it) to splice us to it.
    mutating func call(_ peer: PeerID, via link: LinkID) -> (PipeKey, [Action]) {
        let key = freshKey(on: link)
        pipes[key] = .end(peer: peer, credit: RelayFrame.window, allowance: RelayFrame.window, unacknowledged: 0)
        return (key, [.send(link, .request(pipe: key.id, peer: peer)), .openEnd(key, peer: peer, calling: true),
                      .credit(key, RelayFrame.window)])
    }

    /// Our end of `key` read `bytes` to send (within the credit it was given).
    mutating func send(_ bytes: [UInt8], on key: PipeKey) -> [Action] {
        guard case .end(let peer, let credit, let allowance, let pending) = pipes[key] else { return [] }
        precondition(!bytes.isEmpty && bytes.count <= credit && bytes.count <= RelayFrame.maximumData,
                     "the driver sent past the pipe's credit")
        pipes[key] = .end(peer: peer, credit: credit - bytes.count, allowance: allowance, unacknowledged: pending)
        return [.send(key.link, .data(pipe: key.id, opener: key.mine, bytes: bytes))]
    }

    /// Our end of `key` passed `count` delivered bytes on: credit the far end once half a window has built up.
    mutating func consumed(_ count: Int, on key: PipeKey) -> [Action] {
        guard case .end(let peer, let credit, let allowance, let pending) = pipes[key] else { return [] }
        let total = pending + count
        guard total >= RelayFrame.window / 2 else {
            pipes[key] = .end(peer: peer, credit: credit, allowance: allowance, unacknowledged: total)
            return []
        }
        pipes[key] = .end(peer: peer, credit: credit, allowance: allowance + total, unacknowledged: 0)
        return [.send(key.link, .credit(pipe: key.id, opener: key.mine, bytes: UInt32(total)))]
    }

    /// Our end of `key` is finished (its connection closed, or the driver could not take the call).
    mutating func endClosed(_ key: PipeKey) -> [Action] {
        guard case .end = pipes[key] else { return [] }
        return close(key)
    }

    // MARK: The peer's frames

    /// `frame` arrived from `peer` on `link`. `members` maps each connected member to its link (for splicing).
    mutating func received(_ frame: RelayFrame, on link: LinkID, from peer: PeerID, members: [PeerID: LinkID]) -> [Action] {
        switch frame {
        case .request(let id, let target):
            let key = PipeKey(link: link, id: id, mine: false)
            guard pipes[key] == nil else { return fault(link, "a second RELAY_REQUEST for pipe \(id)") }
            guard let refusal = admission(on: link) else {
                return fault(link, "RELAY_REQUEST after \(limits.maximumRefusedPerLink) refusals it did not answer")
            }
            guard refusal == .admit, topology == .mesh, target != peer, let targetLink = members[target], targetLink != link,
                  counts.spliced + 2 <= limits.maximumSpliced * 2
            else { return refuse(key) }
            let out = freshKey(on: targetLink)
            pipes[key] = .splice(to: out, inFlight: 0)
            pipes[out] = .splice(to: key, inFlight: 0)
            return [.send(targetLink, .incoming(pipe: out.id, peer: peer))]
        case .incoming(let id, let caller):
            let key = PipeKey(link: link, id: id, mine: false)
            guard pipes[key] == nil else { return fault(link, "a second RELAY_INCOMING for pipe \(id)") }
            guard let refusal = admission(on: link) else {
                return fault(link, "RELAY_INCOMING after \(limits.maximumRefusedPerLink) refusals it did not answer")
            }
            guard refusal == .admit, topology == .mesh, caller != peer else { return refuse(key) }
            pipes[key] = .end(peer: caller, credit: RelayFrame.window, allowance: RelayFrame.window, unacknowledged: 0)
            return [.openEnd(key, peer: caller, calling: false), .credit(key, RelayFrame.window)]
        case .data(let id, let opener, let bytes):
            let key = PipeKey(link: link, id: id, mine: !opener)
            switch pipes[key] {
            case .end(let p, let credit, let allowance, let pending):
                guard bytes.count <= allowance else { return fault(link, "RELAY_DATA beyond pipe \(id)'s window") }
                pipes[key] = .end(peer: p, credit: credit, allowance: allowance - bytes.count, unacknowledged: pending)
                return [.deliver(key, bytes)]
            case .splice(let other, let inFlight):
                guard inFlight + bytes.count <= RelayFrame.window else { return fault(link, "RELAY_DATA beyond pipe \(id)'s window") }
                pipes[key] = .splice(to: other, inFlight: inFlight + bytes.count)
                return [.send(other.link, .data(pipe: other.id, opener: other.mine, bytes: bytes))]
            case .closing: return []
            case nil: return fault(link, "RELAY_DATA for pipe \(id), which is not open")
            }
        case .credit(let id, let opener, let bytes):
            let key = PipeKey(link: link, id: id, mine: !opener)
            let n = Int(bytes)
            switch pipes[key] {
            case .end(let p, let credit, let allowance, let pending):
                guard credit + n <= RelayFrame.window else { return fault(link, "RELAY_CREDIT beyond pipe \(id)'s window") }
                pipes[key] = .end(peer: p, credit: credit + n, allowance: allowance, unacknowledged: pending)
                return [.credit(key, n)]
            case .splice(let other, _):
                // Credit from this leg's far end acknowledges bytes that came in on the other leg.
                guard case .splice(let back, let inFlight) = pipes[other] else { return [] }
                guard n <= inFlight else { return fault(link, "RELAY_CREDIT for bytes pipe \(id) never carried") }
                pipes[other] = .splice(to: back, inFlight: inFlight - n)
                return [.send(other.link, .credit(pipe: other.id, opener: other.mine, bytes: bytes))]
            case .closing: return []
            case nil: return fault(link, "RELAY_CREDIT for pipe \(id), which is not open")
            }
        case .close(let id, let opener):
            let key = PipeKey(link: link, id: id, mine: !opener)
            switch pipes.removeValue(forKey: key) {
            case .end:
                return [.send(link, .close(pipe: id, opener: key.mine)), .closeEnd(key)]
            case .splice(let other, _):
                return [.send(link, .close(pipe: id, opener: key.mine))] + closeLeg(other)
            case .closing:
                return []  // the answer to our CLOSE: the id is free
            case nil:
                return fault(link, "RELAY_CLOSE for pipe \(id), which is not open")
            }
        }
    }

    /// `link` closed: every pipe on it ends, and each leg spliced to one of them is closed.
    mutating func linkClosed(_ link: LinkID) -> [Action] {
        var actions: [Action] = []
        for key in pipes.keys.filter({ $0.link == link }).sorted() {
            switch pipes.removeValue(forKey: key) {
            case .end: actions.append(.closeEnd(key))
            case .splice(let other, _): actions += closeLeg(other)
            case .closing, nil: break
            }
        }
        return actions
    }

    // MARK: Helpers

    private enum Admission { case admit, refuse }

    /// Whether a pipe the peer on `link` opens may be had: admitted, refused (over the limit), or nil when the
    /// peer ignores refusals (a fault).
    private func admission(on link: LinkID) -> Admission? {
        let theirs = pipes.filter { $0.key.link == link && !$0.key.mine }
        guard theirs.count >= limits.maximumPerLink else { return .admit }
        let refused = theirs.values.filter { $0 == .closing }.count
        return refused >= limits.maximumRefusedPerLink ? nil : .refuse
    }

    private mutating func refuse(_ key: PipeKey) -> [Action] { close(key) }

    /// Closes a spliced leg whose partner went.
    private mutating func closeLeg(_ key: PipeKey) -> [Action] {
        guard case .splice = pipes[key] else { return [] }
        return close(key)
    }

    /// Sends CLOSE for `key` and keeps its id taken until the answer; a peer that has left more than
    /// `maximumUnansweredPerLink` of them unanswered is at fault.
    private mutating func close(_ key: PipeKey) -> [Action] {
        pipes[key] = .closing
        let actions: [Action] = [.send(key.link, .close(pipe: key.id, opener: key.mine))]
        let unanswered = pipes.lazy.filter { $0.key.link == key.link && $0.value == .closing }.count
        guard unanswered > limits.maximumUnansweredPerLink else { return actions }
        return actions + fault(key.link, "no answer to \(unanswered) RELAY_CLOSEs")
    }

    private mutating func freshKey(on link: LinkID) -> PipeKey {
        while true {
            let key = PipeKey(link: link, id: nextID, mine: true)
            nextID = nextID == UInt32.max ? 1 : nextID + 1
            if pipes[key] == nil { return key }
        }
    }

    private func fault(_ link: LinkID, _ what: String) -> [Action] { [.fault(link, .unexpectedFrame(what))] }
}
