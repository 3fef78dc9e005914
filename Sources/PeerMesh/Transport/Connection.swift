import MeshPOSIX
#if canImport(Glibc)
import Glibc
#endif

/// Why a connection ended.
enum ConnectionEnd: Equatable, Sendable {
    /// The peer closed its side (EOF).
    case closedByPeer
    /// The socket failed; the text is the system's (`Connection refused`, `Connection reset by peer`…).
    case failed(String)
    /// The peer sent bytes that are not PeerMesh frames.
    case fault(PeerFault)
}

/// One TCP connection of the PeerMesh control protocol on the event loop: non-blocking connect, the
/// `SecureChannel` (preamble, Noise handshake, records), framing in, a write queue out.
///
/// Loop-confined: it is created anywhere but used only on its loop's thread, by whoever owns it — the advertiser
/// while an invitation is pending, then the session it is handed to (`rehome`). Frames arrive through `onFrame`;
/// an initiator's peer awaiting approval through `onApproval`; the end of the connection arrives once through
/// `onEnd`, after which nothing more is delivered.
final class Connection {
    /// The socket (while a connect `race` is on, the first candidate's; then the winner's).
    private(set) var socket: FileDescriptor
    /// The peer's address (the one we connected to, or accepted from); while a connect race is on, the first
    /// candidate's (`connectedRemote` is nil until a connect is made).
    private(set) var remote: SocketAddress?
    /// Whether we opened it (and so also whether `connect` may still be in progress).
    let isOutgoing: Bool
    /// Whether it runs through a relay pipe (a `socketpair` end spliced by another member) rather than TCP.
    let isRelayed: Bool

    private let loop: EventLoop
    private var registration: EventLoop.Registration?
    private var connected: Bool
    private var ended = false
    private var channel: SecureChannel
    /// Bytes to write: `outbound[sent...]`. The written prefix is dropped only when the queue drains or the prefix
    /// reaches `compactionMark`, and a drained queue keeps its storage up to `keptCapacity`: a transfer that keeps
    /// the queue topped up reuses one buffer instead of moving its tail and mapping a fresh one on every write.
    private var outbound: [UInt8] = []
    private var sent = 0
    /// See `outbound`.
    static let compactionMark = 256 << 10
    /// See `outbound`.
    static let keptCapacity = 1 << 20
    private var paused = false
    /// While set, queued bytes wait (`corked`): several frames go out in one write.
    private var isCorked = false
    /// Called once, when the first bytes arrive (the advertiser tells idle connections from live ones).
    var onFirstBytes: (() -> Void)?
    /// Initiator: called once, with the six digits, when the responder has opened its nonce (its app showed the digits
    /// or its session let us in) and the short authentication string is known.
    var onShortAuthenticationString: ((String) -> Void)?
    /// Called when the socket is writable and fewer than `sendSpaceMark` bytes are queued, while set: resource
    /// transfers top the queue up from it. While it is set the connection watches for writability even with an
    /// empty queue, so a queue drained by any write (a heartbeat's, a message's) still leads here.
    var onSendSpace: (() -> Void)? {
        didSet { if (oldValue == nil) != (onSendSpace == nil) { updateInterest() } }
    }
    /// See `onSendSpace`.
    static let sendSpaceMark = 128 << 10
    /// The most bytes the queue may hold: past it the peer is faulted (`PeerFault.notReading`) and the connection
    /// ends. The owner's own sends stop at its limit (`Session.Configuration.maximumQueuedBytes`; this is set to twice
    /// that), so only the replies a peer provokes and never reads — MESH_INTRO_DATA for each MESH_INTRO_REQUEST,
    /// say — can reach it: a peer that asks without reading cannot grow our memory.
    var maximumQueued = 2 * Session.Configuration.defaultMaximumQueuedBytes
    private var onFrame: (ControlFrame) -> Void = { _ in }
    private var onApproval: (PeerID) -> Void = { _ in }
    private var onEnd: (ConnectionEnd) -> Void = { _ in }

    /// Wraps `socket`. `connecting` is true for an outgoing connect still in progress.
    init(socket: FileDescriptor, remote: SocketAddress?, connecting: Bool, loop: EventLoop, channel: SecureChannel.Configuration,
         relayed: Bool = false) {
        self.socket = socket
        self.remote = remote
        self.isOutgoing = connecting
        self.isRelayed = relayed
        self.connected = !connecting
        self.loop = loop
        self.channel = SecureChannel(configuration: channel)
    }

    /// Starts (or continues, after `rehome`) delivering to these handlers. Loop thread only.
    func start(onFrame: @escaping (ControlFrame) -> Void, onApproval: @escaping (PeerID) -> Void = { _ in },
               onEnd: @escaping (ConnectionEnd) -> Void) {
        self.onFrame = onFrame
        self.onApproval = onApproval
        self.onEnd = onEnd
        paused = false
        guard !ended else { return }
        if registration == nil {
            if isOutgoing { perform(channel.start()) }
            registration = loop.register(fd: socket.fd, interest: interest) { [unowned self] ready in handle(ready) }
            armRaceTimer()
        } else {
            updateInterest()
            // Frames that arrived in the previous owner's last read after the one it paused on.
            deliverPending()
        }
    }

    /// Hands the connection to a new owner: the same as `start`, and the previous owner's `onFirstBytes` is dropped.
    func rehome(onFrame: @escaping (ControlFrame) -> Void, onApproval: @escaping (PeerID) -> Void = { _ in },
                onEnd: @escaping (ConnectionEnd) -> Void) {
        onFirstBytes = nil
        start(onFrame: onFrame, onApproval: onApproval, onEnd: onEnd)
    }

    /// Takes the connection from its previous owner while the new one decides whether to keep it (a certificate
    /// check): it stays paused and delivers nothing, and the previous owner's handlers — whose owner (an advertiser)
    /// may be gone by then — are dropped. An end meanwhile shows in `hasEnded`; `rehome` later starts delivery.
    func hold() {
        onFirstBytes = nil
        onShortAuthenticationString = nil
        onFrame = { _ in }
        onApproval = { _ in }
        onEnd = { _ in }
        pause()
    }

    /// Whether the connection has ended (closed by us, by the peer, or failed); nothing more is delivered.
    var hasEnded: Bool { ended }

    /// The address our connect reached (or we accepted from); nil while an outgoing connect is in progress.
    var connectedRemote: SocketAddress? { connected ? remote : nil }

    /// Initiator: the owner trusts the peer the handshake identified; finish the handshake.
    func approve() {
        guard !ended else { return }
        perform(channel.approve())
        if !ended { updateInterest() }
    }

    /// Whether frames travel encrypted and authenticated.
    var isEncrypted: Bool { channel.isEncrypted }
    /// Whether the link runs in plaintext (not merely not encrypted yet: its handshake may still be under way).
    var isPlaintext: Bool { channel.isPlaintext }

    /// The link's datagram keys, once encrypted.
    var datagramKeys: (send: SecretKey, receive: SecretKey)? { channel.datagramKeys }

    /// The channel binding, once encrypted.
    var channelBinding: [UInt8]? { channel.channelBinding }

    /// The short authentication string both sides can show, once encrypted.
    var shortAuthenticationString: String? { channel.shortAuthenticationString }

    /// Runs `body` with writes held back, then writes everything it queued at once: frames sent together (the nonce
    /// and ACCEPT) leave in one write and arrive in one read.
    func corked(_ body: () -> Void) {
        let wasCorked = isCorked
        isCorked = true
        body()
        isCorked = wasCorked
        if !isCorked, !ended, connected, !hasFailed {
            flush()
            updateInterest()
        }
    }

    /// Responder: sends the nonce that gives the initiator the short authentication string (once; nothing in
    /// plaintext). The advertiser calls it when its app shows the digits (`Invitation.revealShortAuthenticationString`);
    /// the session that lets the caller in calls it before ACCEPT.
    func revealNonce() {
        guard !ended, !hasFailed else { return }
        let bytes = channel.revealNonce()
        guard !bytes.isEmpty else { return }
        enqueue(bytes)
        updateInterest()
    }

    /// Raises the frame limit (a session's limit after the advertiser's tighter one).
    func setMaximumFrameLength(_ n: Int) { channel.setMaximumFrameLength(n) }

    /// Stops reading until `rehome` (the advertiser pauses a connection while the app decides). A hang-up is
    /// still seen and ends the connection, so a withdrawn invitation is noticed.
    func pause() {
        paused = true
        updateInterest()
    }

    /// Queues `frame` and writes what the socket takes now.
    func send(_ frame: ControlFrame) {
        guard !ended, !hasFailed else { return }
        enqueue(channel.send(frame))
        updateInterest()
    }

    /// Appends `bytes` to the queue and writes what the socket takes now; a queue past `maximumQueued` ends the
    /// connection (on the loop's next turn, as a failed write does) with the peer at fault.
    private func enqueue(_ bytes: [UInt8]) {
        guard !hasFailed else { return }
        outbound.append(contentsOf: bytes)
        if connected, !isCorked { flush() }
        if queuedBytes > maximumQueued { failLater(.fault(.notReading)) }
    }

    /// Writes what it can of the queue, shuts the socket down and closes it. Delivers nothing more.
    func close() {
        guard !ended else { return }
        if connected { flush() }
        finish()
        if !socket.isClosed { shutdown(socket.fd, Int32(SHUT_RDWR)) }  // closed already: a raced first candidate
        socket.close()
    }

    /// Bytes queued but not yet written.
    var queuedBytes: Int { outbound.count - sent }

    /// A write failed (the peer reset the connection, say): the end is delivered on the loop's next turn, and
    /// until then whatever is sent is dropped. A sender that fills the queue in a loop (resource transfers) stops
    /// on it, rather than read, hash and seal the rest of a file into a queue that empties itself.
    private(set) var hasFailed = false

    // MARK: Events

    private var interest: EventLoop.Readiness {
        var r: EventLoop.Readiness = paused ? [] : [.readable]
        if !connected || sent < outbound.count || onSendSpace != nil { r.insert(.writable) }
        return r
    }

    private func updateInterest() {
        if let registration, !ended { loop.update(registration, interest: interest) }
    }

    private func handle(_ ready: EventLoop.Readiness) {
        guard !ended else { return }
        if paused, ready.contains(.failed) { return end(.closedByPeer) }
        if !connected {
            if let failure = connectFailure(of: socket, to: remote, ready) {
                guard race != nil else { return end(.failed(failure)) }
                stopContender(0)  // others race on
                return raceFailed(0, failure)
            }
            guard ready.contains(.writable) || ready.contains(.readable) else { return }
            if race != nil { raceWon(0) }
            connected = true
        }
        if ready.contains(.writable) || sent < outbound.count {
            flush()
            if ended { return }
            if let more = onSendSpace, queuedBytes < Self.sendSpaceMark {
                more()
                if ended { return }
            }
        }
        if !paused, ready.contains(.readable) || ready.contains(.failed) { read() }
        if !ended { updateInterest() }
    }

    private func flush() {
        while sent < outbound.count {
            let n = outbound.withUnsafeBytes { raw in
                Glibc.send(socket.fd, raw.baseAddress! + sent, raw.count - sent, Int32(MSG_NOSIGNAL))
            }
            if n > 0 { sent += n; continue }
            if n < 0, errno == EINTR { continue }
            if n < 0, errno == EAGAIN || errno == EWOULDBLOCK { break }
            failLater(.failed(Sys.errorText(errno)))
            return
        }
        if sent == outbound.count {
            outbound.removeAll(keepingCapacity: outbound.capacity <= Self.keptCapacity)
            sent = 0
        } else if sent >= Self.compactionMark {
            outbound.removeFirst(sent)
            sent = 0
        }
    }

    /// Drops the queue and ends the connection on the loop's next turn: never inside `send` (the owner may be in the
    /// middle of its own actions). Whatever is sent meanwhile is dropped (`hasFailed`).
    private func failLater(_ why: ConnectionEnd) {
        hasFailed = true
        outbound = []
        sent = 0
        loop.schedule(at: 0) { [weak self] in self?.end(why) }
    }

    /// Reads one turn of the loop may make on one connection (of up to 64 KiB each): a peer that keeps its socket
    /// full (of tiny records, say, each a decryption) gets this much and then waits its turn behind the loop's other
    /// work — timers, heartbeats, other peers. The loop is level-triggered, so what is left is read on the next turn.
    static let readsPerTurn = 4

    private func read() {
        let buffer = loop.readBuffer
        var reads = 0
        while !ended && !paused && !hasFailed && reads < Self.readsPerTurn {
            let n = recv(socket.fd, buffer.baseAddress, buffer.count, 0)
            if n > 0 {
                reads += 1
                if let first = onFirstBytes {
                    onFirstBytes = nil
                    first()
                }
                perform(channel.received(UnsafeRawBufferPointer(rebasing: buffer[..<n])))
                if n < buffer.count { return }
                continue
            }
            if n == 0 { return end(.closedByPeer) }
            if errno == EINTR { continue }
            if errno == EAGAIN || errno == EWOULDBLOCK { return }
            return end(.failed(Sys.errorText(errno)))
        }
    }

    /// Events decoded but not yet carried out: `pendingEvents[nextPending...]` (the connection was paused in the
    /// middle of a read, or a handler is carrying out an earlier one). One read can decode thousands of tiny frames:
    /// they are walked by index, and the array is emptied once all are done, so a read costs linear time.
    private var pendingEvents: [SecureChannel.Event] = []
    /// See `pendingEvents`. Stored, not local: a handler may re-enter `deliverPending` (through `approve`).
    private var nextPending = 0

    /// Carries out the channel's events: writes, frames to the owner, approval requests, faults.
    private func perform(_ events: [SecureChannel.Event]) {
        pendingEvents += events
        deliverPending()
    }

    private func deliverPending() {
        defer {
            if nextPending == pendingEvents.count {
                pendingEvents.removeAll(keepingCapacity: pendingEvents.count <= 64)
                nextPending = 0
            }
        }
        while !ended, !paused, !hasFailed, nextPending < pendingEvents.count {
            let e = pendingEvents[nextPending]
            nextPending += 1
            switch e {
            case .write(let bytes):
                enqueue(bytes)
            case .frame(let f): onFrame(f)
            case .needsApproval(let peer): onApproval(peer)
            case .shortAuthenticationString(let digits): onShortAuthenticationString?(digits)
            case .refused(let why):
                if connected { flush() }
                end(.failed(why))
            case .fault(let f):
                if connected { flush() }
                end(.fault(f))
            }
        }
    }

    private func end(_ why: ConnectionEnd) {
        guard !ended else { return }
        let handler = onEnd
        finish()
        if !socket.isClosed { shutdown(socket.fd, Int32(SHUT_RDWR)) }
        socket.close()
        handler(why)
    }

    private func finish() {
        ended = true
        if let registration { loop.deregister(registration) }
        registration = nil
        onFrame = { _ in }
        onApproval = { _ in }
        onEnd = { _ in }
        onFirstBytes = nil
        onShortAuthenticationString = nil
        pendingEvents = []
        nextPending = 0
        outbound = []
        sent = 0
        callOffRace(now: MonotonicClock.nowNanos())  // closed while the race is on: the owner hears of it last
    }

    // MARK: Happy Eyeballs

    /// A connect raced across addresses (`race(alternates:…)`).
    private struct Race {
        var machine: ConnectRace
        /// Candidate 0 is the connection's own socket and `remote`; then the alternates, in order.
        let addresses: [SocketAddress]
        let source: SocketAddress?
        /// The sockets of the candidates other than 0 that are still connecting.
        var contenders: [Int: (socket: FileDescriptor, registration: EventLoop.Registration)] = [:]
        let onDecided: (ConnectRace.Outcome) -> Void
    }
    private var race: Race?

    /// Races this outgoing connection's connect to `remote` against connects to `alternates` (Happy Eyeballs,
    /// `ConnectRace`), each from `source`'s address: the first to connect carries the connection. Call before
    /// `start`. `onDecided` hears the outcome once (candidate 0 is `remote`, then `alternates` in order), before
    /// anything else is delivered: when one connects, when all failed (the connection then ends with the last
    /// failure), or when the connection is closed while the race is on.
    func race(alternates: [SocketAddress], from source: SocketAddress?, stagger: Nanos,
              onDecided: @escaping (ConnectRace.Outcome) -> Void) {
        precondition(isOutgoing && !connected && registration == nil, "a connect is raced before it starts")
        guard let remote, !alternates.isEmpty else { return }
        race = Race(machine: ConnectRace(candidates: 1 + alternates.count, stagger: stagger, now: MonotonicClock.nowNanos()),
                    addresses: [remote] + alternates, source: source, onDecided: onDecided)
    }

    /// What calling the race off at `now` would hand back (`ConnectRace.outcomeIfCalledOff`); nil once the race is
    /// over, or when there was none.
    func raceOutcomeIfCalledOff(now: Nanos) -> ConnectRace.Outcome? {
        race?.machine.outcomeIfCalledOff(now: now)
    }

    /// Calls the race off as of `now`: the other candidates' sockets are closed and `onDecided` hears the outcome;
    /// the connection stays as it is (its owner closes it). Nothing when the race is over.
    func callOffRace(now: Nanos) {
        guard var r = race else { return }
        race = nil
        closeContenders(of: r)
        if let outcome = r.machine.callOff(now: now) { r.onDecided(outcome) }
    }

    /// Closes the sockets of `r`'s candidates (other than 0) still connecting, unwritten.
    private func closeContenders(of r: Race) {
        for c in r.contenders.values {
            loop.deregister(c.registration)
            c.socket.close()
        }
    }

    /// Why a connect in progress on `s` failed, or nil when it has not (it connected, or is still connecting).
    private func connectFailure(of s: FileDescriptor, to address: SocketAddress?, _ ready: EventLoop.Readiness) -> String? {
        let err = s.pendingError()
        let target = address.map(\.description) ?? "the peer"
        if err != 0 { return "cannot connect to \(target): \(Sys.errorText(err))" }
        if ready.contains(.failed) && !ready.contains(.readable) { return "cannot connect to \(target)" }
        return nil
    }

    /// Arms the timer for the race's next start, if one is due.
    private func armRaceTimer() {
        guard let at = race?.machine.nextStart else { return }
        loop.schedule(at: at) { [weak self] in self?.raceTimerFired() }
    }

    /// The race's timer: a stale one (another candidate started since) finds nothing to start.
    private func raceTimerFired() {
        guard !ended, var r = race else { return }
        let action = r.machine.timerFired(now: MonotonicClock.nowNanos())
        race = r
        guard case .start(let next, let setAside) = action else { return }
        if let setAside { stopContender(setAside) }
        startContender(next)
    }

    /// Candidate `i` no longer races (it failed, or the cap set it aside): its socket is closed. Candidate 0's is the
    /// connection's own: it stays `socket` (closed) until a winner's replaces it, or the connection ends.
    private func stopContender(_ i: Int) {
        if i == 0 {
            if let registration { loop.deregister(registration) }
            registration = nil
            socket.close()
        } else if let c = race?.contenders.removeValue(forKey: i) {
            loop.deregister(c.registration)
            c.socket.close()
        }
    }

    /// Starts candidate `i`'s connect (`i` ≥ 1); one that cannot be started has failed.
    private func startContender(_ i: Int) {
        guard var r = race else { return }
        let address = r.addresses[i]
        let s: FileDescriptor
        do { s = try FileDescriptor.tcpConnect(to: address, from: r.source) } catch {
            return raceFailed(i, "cannot connect to \(address): \(error.description)")
        }
        // Readable too, as candidate 0 is watched: a connect made and at once hung up on is made (then ends), not failed.
        let registration = loop.register(fd: s.fd, interest: [.readable, .writable]) { [unowned self] ready in
            contenderReady(i, ready)
        }
        r.contenders[i] = (s, registration)
        race = r
        armRaceTimer()
    }

    /// Candidate `i`'s socket (`i` ≥ 1) is ready: its connect failed, or it won and becomes the connection's socket.
    private func contenderReady(_ i: Int, _ ready: EventLoop.Readiness) {
        guard !ended, var r = race, let c = r.contenders[i] else { return }
        if let failure = connectFailure(of: c.socket, to: r.addresses[i], ready) {
            r.contenders[i] = nil
            race = r
            loop.deregister(c.registration)
            c.socket.close()
            return raceFailed(i, failure)
        }
        guard ready.contains(.writable) || ready.contains(.readable) else { return }
        r.contenders[i] = nil
        race = r
        loop.deregister(c.registration)
        // The winner: candidate 0's socket (still connecting, or already closed: failed or set aside) gives way to it.
        if let registration { loop.deregister(registration) }
        socket.close()
        socket = c.socket
        remote = r.addresses[i]
        raceWon(i)
        guard !ended else { return }
        connected = true
        registration = loop.register(fd: socket.fd, interest: interest) { [unowned self] ready in handle(ready) }
        flush()
        if !ended { updateInterest() }
    }

    /// Candidate `i` connected first: the others still connecting are closed unwritten.
    private func raceWon(_ i: Int) {
        guard var r = race else { return }
        race = nil
        let action = r.machine.connected(i)
        closeContenders(of: r)
        if case .won(_, let outcome) = action { r.onDecided(outcome) }
    }

    /// Candidate `i`'s connect failed with `failure`: the next starts, or the others go on, or — all failed — the
    /// connection ends with this failure.
    private func raceFailed(_ i: Int, _ failure: String) {
        guard var r = race else { return end(.failed(failure)) }
        let action = r.machine.failed(i, now: MonotonicClock.nowNanos())
        race = r
        switch action {
        case .start(let next): startContender(next)
        case .wait, .ignore: break
        case .lost(let outcome):
            race = nil
            r.onDecided(outcome)
            end(.failed(failure))
        }
    }
}
