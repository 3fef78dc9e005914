import FoundationEssentials
import MeshPOSIX

/// What an introduction handed us, kept while the direct connection it led to is tried: if that cannot be made, the
/// call goes through the introducer instead.
struct Introduction {
    var introducer: PeerID
    var data: NearbyConnectionData
    /// The next of `data.addresses` to try.
    var next = 0
}

/// Relayed links: the driver of `RelayStateMachine` (loop thread only). A member that cannot reach another directly
/// calls it through their introducer: both ends run an ordinary connection (Noise XX, the ticket, every frame) over
/// their side of a `socketpair`, whose other side is a `RelayEnd` carrying the bytes in relay frames.
extension SessionCore {
    /// How long a direct connection from an introduction may take before the call goes through the introducer.
    var introductionTimeout: Duration { .nanoseconds(Int64(min(max(peerTimeout, 5_000_000_000), 30_000_000_000))) }

    /// Connects to `peer` with connection data an introducer passed on: directly, or, when that cannot be done,
    /// through the introducer.
    func connectIntroduced(_ peer: PeerID, data bytes: [UInt8], introducer: PeerID) {
        guard preference != .none, case .success(let data) = NearbyConnectionData.decode(bytes),
              data.peer.identity == peer.identity, peer.publicKey == nil || peer.publicKey == data.peer.publicKey,
              data.forIdentity == self.peer.identity
        else { return }  // data that leads nowhere: nothing to connect to
        let introduction = Introduction(introducer: introducer, data: data)
        if configuration.relaysIntroductions { return call(introduction) }
        tryDirect(introduction)
    }

    /// Starts a direct connection to the next address of `introduction` that one can be started to (one with a
    /// route, a scope that exists here); with none left, calls through the introducer.
    private func tryDirect(_ introduction: Introduction) {
        var attempt = introduction
        let data = introduction.data
        while attempt.next < data.addresses.count {
            let address = data.addresses[attempt.next]
            attempt.next += 1
            if let link = try? invite(expected: data.peer, endpoint: PeerEndpoint(host: address, port: data.port),
                                      context: Data(NearbyConnectionData.contextPrefix + data.ticket),
                                      timeout: introductionTimeout, keyFromConnectionData: true) {
                io.value.introductions[link] = attempt
                return
            }
        }
        call(introduction)
    }

    /// An invitation ended without a connection. Returns true when it was a direct connection from an
    /// introduction that could not be made, now retried at the data's next address or, after the last, through
    /// the introducer (the failure is not reported: the retry's outcome is).
    func retryIntroduction(_ link: LinkID, _ reason: DeclineReason) -> Bool {
        guard let introduction = io.value.introductions.removeValue(forKey: link) else { return false }
        // A peer that answered and said no is not retried: only one that could not be reached.
        guard reason == .unavailable || reason == .timedOut else { return false }
        guard shared.withLock({ $0.machine.primaryLink(for: introduction.data.peer) == nil }) else { return false }
        tryDirect(introduction)  // the next address, and then the introducer
        return true
    }

    /// Asks the introducer for a pipe to the introduced peer and starts our invitation through it.
    private func call(_ introduction: Introduction) {
        guard let link = shared.withLock({ $0.machine.primaryLink(for: introduction.introducer) }) else { return }
        let (key, actions) = io.value.relay.call(introduction.data.peer, via: link)
        io.value.relayCalls[key] = introduction.data
        performRelay(actions)
    }

    /// Connected members and their links, for splicing.
    private func memberLinks() -> [PeerID: LinkID] {
        let members = io.value.membership.members
        return shared.withLock { s in
            var out: [PeerID: LinkID] = [:]
            for p in members { if let l = s.machine.primaryLink(for: p) { out[p] = l } }
            return out
        }
    }

    /// A relay frame from `peer` on `link`.
    func receivedRelay(_ frame: RelayFrame, on link: LinkID, from peer: PeerID) {
        let members = memberLinks()
        performRelay(io.value.relay.received(frame, on: link, from: peer, members: members))
    }

    /// `link` closed: its pipes end.
    func relayLinkClosed(_ link: LinkID) {
        performRelay(io.value.relay.linkClosed(link))
    }

    /// Closes every pipe end (the session is shutting down).
    func closeRelayEnds() {
        let ends = io.value.relayEnds.values
        io.value.relayEnds.removeAll()
        io.value.relayCalls.removeAll()
        for e in ends { e.close() }
    }

    func performRelay(_ actions: [RelayStateMachine.Action]) {
        for action in actions {
            switch action {
            case .send(let link, let frame):
                let connection = io.value.connections[link]
                connection?.send(.relay(frame))
            case .openEnd(let key, let peer, let calling):
                openEnd(key, peer: peer, calling: calling)
            case .credit(let key, let n):
                let end = io.value.relayEnds[key]
                end?.grant(n)
            case .deliver(let key, let bytes):
                let end = io.value.relayEnds[key]
                end?.deliver(bytes)
            case .closeEnd(let key):
                io.value.relayCalls[key] = nil
                let end = io.value.relayEnds.removeValue(forKey: key)
                end?.close()
            case .fault(let link, let fault):
                faulted(link, fault)
            }
        }
    }

    private func openEnd(_ key: PipeKey, peer: PeerID, calling: Bool) {
        let pair: (FileDescriptor, FileDescriptor)
        do { pair = try FileDescriptor.streamPair() } catch {
            io.value.relayCalls[key] = nil
            return performRelay(io.value.relay.endClosed(key))
        }
        let end = RelayEnd(key: key, socket: pair.0, loop: loop, core: self)
        io.value.relayEnds[key] = end
        end.start()
        if calling {
            guard let data = io.value.relayCalls.removeValue(forKey: key) else { return endFailed(key, other: pair.1) }
            do {
                try invite(expected: data.peer, socket: pair.1, remote: nil, relayed: true,
                           context: Data(NearbyConnectionData.contextPrefix + data.ticket), timeout: introductionTimeout,
                           keyFromConnectionData: true)
            } catch {
                endFailed(key, other: pair.1)
            }
        } else {
            // Only a caller we made connection data for gets through to the listener (which checks the ticket).
            guard let acceptor = owner.withLock({ $0.value })?.direct.withLock({ $0 }), acceptor.hasTicket(for: peer),
                  acceptor.advertiser.admitRelayed(pair.1, from: peer)
            else { return endFailed(key, other: pair.1) }
        }
    }

    private func endFailed(_ key: PipeKey, other: FileDescriptor) {
        other.close()
        let end = io.value.relayEnds.removeValue(forKey: key)
        end?.close()
        performRelay(io.value.relay.endClosed(key))
    }

    /// Our end of `key` read `bytes` from its connection.
    fileprivate func relayEndRead(_ key: PipeKey, _ bytes: [UInt8]) {
        performRelay(io.value.relay.send(bytes, on: key))
    }

    /// Our end of `key` passed `count` bytes on to its connection.
    fileprivate func relayEndConsumed(_ key: PipeKey, _ count: Int) {
        performRelay(io.value.relay.consumed(count, on: key))
    }

    /// Our end of `key` is finished: its connection closed or the socket failed.
    fileprivate func relayEndFinished(_ key: PipeKey) {
        let end = io.value.relayEnds.removeValue(forKey: key)
        end?.close()
        performRelay(io.value.relay.endClosed(key))
    }
}

/// This member's end of a relay pipe, on the loop: reads what its connection writes into the `socketpair` (within
/// the pipe's credit) and writes in what arrives from the far end, holding at most one window of it.
final class RelayEnd {
    let key: PipeKey
    private let socket: FileDescriptor
    private let loop: EventLoop
    private weak var core: SessionCore?
    private var registration: EventLoop.Registration?
    private var credit = 0
    private var pending: [UInt8] = []
    private var written = 0
    private var closed = false

    init(key: PipeKey, socket: FileDescriptor, loop: EventLoop, core: SessionCore) {
        self.key = key
        self.socket = socket
        self.loop = loop
        self.core = core
    }

    func start() {
        registration = loop.register(fd: socket.fd, interest: interest) { [weak self] ready in self?.handle(ready) }
    }

    /// The far end lets us send `n` more bytes.
    func grant(_ n: Int) {
        guard !closed else { return }
        credit += n
        updateInterest()
    }

    /// Bytes from the far end, for our connection.
    func deliver(_ bytes: [UInt8]) {
        guard !closed else { return }
        pending.append(contentsOf: bytes)
        flush()
        if !closed { updateInterest() }
    }

    func close() {
        guard !closed else { return }
        closed = true
        if let registration { loop.deregister(registration) }
        registration = nil
        socket.close()
        pending = []
    }

    private var interest: EventLoop.Readiness {
        var r: EventLoop.Readiness = []
        if credit > 0 { r.insert(.readable) }
        if written < pending.count { r.insert(.writable) }
        return r
    }

    private func updateInterest() {
        if let registration, !closed { loop.update(registration, interest: interest) }
    }

    private func handle(_ ready: EventLoop.Readiness) {
        guard !closed else { return }
        if written < pending.count { flush() }
        if closed { return }
        if credit > 0, ready.contains(.readable) || ready.contains(.failed) {
            read()
        } else if ready.contains(.failed), !ready.contains(.writable) || written >= pending.count {
            // Hung up with no credit to read what is left: the connection is gone either way.
            return finish()
        }
        if !closed { updateInterest() }
    }

    private func read() {
        let buffer = loop.readBuffer
        // A bounded number of reads per turn, so one busy pipe cannot starve the loop.
        for _ in 0..<16 where credit > 0 && !closed {
            let want = min(credit, RelayFrame.maximumData, buffer.count)
            switch socket.readSome(into: UnsafeMutableRawBufferPointer(rebasing: buffer[..<want])) {
            case .moved(let n):
                credit -= n
                core?.relayEndRead(key, Array(buffer[..<n]))
            case .wouldBlock:
                return
            case .endOfStream, .failed:
                return finish()
            }
        }
    }

    private func flush() {
        var moved = 0
        while written < pending.count {
            let r = pending.withUnsafeBytes { raw in socket.writeSome(UnsafeRawBufferPointer(rebasing: raw[written...])) }
            switch r {
            case .moved(let n):
                written += n
                moved += n
            case .wouldBlock:
                break
            case .endOfStream, .failed:
                return finish()
            }
            if case .wouldBlock = r { break }
        }
        if written == pending.count {
            pending.removeAll(keepingCapacity: true)
            written = 0
        } else if written > 65_536 {
            pending.removeFirst(written)
            written = 0
        }
        if moved > 0 { core?.relayEndConsumed(key, moved) }
    }

    private func finish() {
        guard !closed else { return }
        close()
        core?.relayEndFinished(key)
    }
}
