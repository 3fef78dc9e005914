import Dispatch
import FoundationEssentials
import MeshAudio
import MeshPipeline
import MeshPOSIX
import PeerMesh
import Synchronization

/// The capture side of the relay: captures from an `AudioSource`, advertises an encrypted PeerMesh session, admits
/// players by its accept policy (paired only, by default), and sends each captured period to every connected player
/// at once (fan-out) as sealed datagrams. It also holds the pairing window (`openPairingWindow`).
///
/// The chain is MeshPipeline's `CapturePipeline` (source → packetize → send, on the `pm-send` thread); the host
/// gives it the source and the network end: the connected players, and `Session.sendDatagram`.
public final class RelayHost: SessionDelegate, NearbyServiceAdvertiserDelegate, Sendable {
    /// The host's own peer (name and key), as players see it.
    public let peer: PeerID
    /// The configuration the host was made with.
    public let configuration: Configuration
    /// The audio session (players join it).
    public let session: Session
    /// The pairing window (players that pair join its own session); nil without a trust store.
    let pairing: PairingResponder?
    private let advertiser: NearbyServiceAdvertiser
    private let source: any AudioSource
    private let players: Players
    private let capture: CapturePipeline<[PeerID]>
    private let running = Atomic<Bool>(false)
    private let events: @Sendable (String) -> Void
    private let advertisedChanged: @Sendable (Bool) -> Void
    private let onFailure: @Sendable (String) -> Void
    /// Whether `onFailure` was called (it is called once).
    private let failed = Atomic<Bool>(false)
    /// Whether the talkback output's end was handled (said, the talker released, talk withdrawn: once).
    private let talkbackEnded = Atomic<Bool>(false)
    private let notices: @Sendable (String) -> Void
    private let state = Mutex(HostState())
    private let timers = DispatchQueue(label: "peermesh.relay-host.timers")
    /// The control protocol's state machine; its actions are performed on `controlQueue`, in order.
    private let control: Mutex<HostControl<PeerID>>
    /// Where control actions run, one at a time — and every publication of the TXT record, so that the last one
    /// published says what holds now (talk withdrawn, the pairing window open or shut).
    private let controlQueue: DispatchQueue
    private let clips: ClipRecorder?
    /// The talkback pipeline (network → jitter buffer → … → the talk sink), and whose datagrams it plays.
    private let talkback: PlayoutPipeline?
    private let talker = Mutex<PeerID?>(nil)
    /// What the TXT record offers now (shared with the pairing window, which publishes the record again).
    private let offer: AdvertisedFeatures
    /// Refused commands are logged at most once a second a player (the control queue's; a lock for `Sendable`).
    private let refusals = Mutex(LogThrottle<PeerID>(interval: 1_000_000_000))
    /// Clip refusals, throttled apart from refused commands so that neither kind hides the other's lines.
    private let clipRefusals = Mutex(LogThrottle<PeerID>(interval: 1_000_000_000))
    /// How fast each player may send commands; spent on the session's thread, before anything is queued.
    private let budget = Mutex(CommandBudget<PeerID>())
    /// Players whose dropped commands a report loop (`sayUntoldDrops`) is saying, a second at a time.
    private let reportingDrops = Mutex(Set<PeerID>())
    /// A player's pause and talk changes are logged about once a second at most (the control queue's; a lock for
    /// `Sendable`).
    private let changeLines = Mutex(ChangeLineCoalescer<PeerID>(interval: 1_000_000_000))
    /// Clips that could not be opened: one line in 10 s.
    private let clipOpenFailures = Mutex(LogThrottle<Int>(interval: 10_000_000_000))
    /// The lines that say a player joined or left, coalesced likewise (`logVisit`).
    private let visitLines = Mutex(ChangeLineCoalescer<PeerID>(interval: 1_000_000_000))
    /// The advertiser's rationed connections the operator was last told of, and when (the timers queue's; a lock for
    /// `Sendable`).
    private let rationNotice = Mutex<(told: UInt64, saidAtNanos: UInt64)>((0, 0))

    private struct HostState {
        /// Players admitted because the trust store has their key: forgotten keys are disconnected.
        var admittedByTrust: [PeerID: PublicKey] = [:]
        /// Where each player connected from.
        var addresses: [PeerID: String] = [:]
        /// Players let in and handed to the session, not connected yet: where from, their key if the trust store
        /// admitted them, and when (monotonic ns). Moved to `addresses` and `admittedByTrust` when they connect; the
        /// session may turn one away without a word (its peer limit, a second link of a connected identity), so an
        /// entry older than `admissionWait` is dropped, and at most `maximumAdmitting` are kept.
        var admitting: [PeerID: (address: String?, trustedKey: PublicKey?, atNanos: UInt64)] = [:]
        /// The names connected paired players were paired under, with the number of the connection that noted each:
        /// logs and status call them so, whatever name they give now (a paired device cannot pass for another by
        /// taking its name). A connection's leave removes only its own note, never a rejoin's.
        var pairedNames: [PeerID: (connection: UInt64, name: String)] = [:]
        /// The number of the latest connection, for `pairedNames`.
        var connections: UInt64 = 0
        /// Addresses with a question open to the operator (`.ask`): one at a time per address.
        var asking: Set<String> = []
        var advertised = false
    }

    /// The control features the TXT record offers: the configuration's, less talkback once its output ended. Shared
    /// with the pairing window, which publishes the record again when it opens and closes.
    private final class AdvertisedFeatures: Sendable {
        private let raw: Atomic<UInt8>
        init(_ features: ControlFeatures) { raw = Atomic(features.rawValue) }
        var value: ControlFeatures { ControlFeatures(rawValue: raw.load(ordering: .acquiring)) }
        func withdraw(_ features: ControlFeatures) { _ = raw.bitwiseAnd(~features.rawValue, ordering: .acquiringAndReleasing) }
    }

    /// The connected players, and the audience the capture thread sends to: a paused player, or one that talks
    /// (half duplex), is connected but not in it.
    private final class Players: Sendable {
        private struct List {
            var connected: [PeerID] = []
            var paused: Set<PeerID> = []
            /// Held while they talk (half duplex).
            var talking: Set<PeerID> = []
            var audience: [PeerID] { connected.filter { !paused.contains($0) && !talking.contains($0) } }
        }
        private let list = Mutex(List())
        /// Whom the capture thread sends to (read there without a lock).
        let audience = Audience()
        var all: [PeerID] { list.withLock { $0.connected } }
        var paused: Set<PeerID> { list.withLock { $0.paused } }
        func update(_ peer: PeerID, connected: Bool) {
            change { l in
                l.connected.removeAll { $0 == peer }
                if connected { l.connected.append(peer) } else { l.paused.remove(peer); l.talking.remove(peer) }
            }
        }
        func setHeldForTalk(_ peer: PeerID, _ held: Bool) {
            change { l in if held { l.talking.insert(peer) } else { l.talking.remove(peer) } }
        }
        func setPaused(_ peer: PeerID, _ paused: Bool) {
            change { l in if paused { l.paused.insert(peer) } else { l.paused.remove(peer) } }
        }
        /// Changes the list and publishes the audience under the list's lock, so that audiences are published in
        /// the order the list changed.
        private func change(_ body: (inout List) -> Void) {
            list.withLock { l in
                body(&l)
                audience.publish(l.audience)
            }
        }
    }

    /// Opens the sessions and the advertiser (nothing is published until `start`).
    /// - Parameters:
    ///   - log: receives one human-readable line per event (joins, leaves). Remote names in it are raw: the CLI
    ///     escapes them before they reach a terminal.
    ///   - notice: receives the lines the operator asked for — pairing outcomes, the window closing — (default:
    ///     `log`); the CLI prints them even with `--quiet`.
    ///   - advertised: called with true when the advertisement goes live on the network, and with false when it
    ///     cannot be (avahi-daemon is not running yet, went away, or publishing failed); a service tells systemd it
    ///     is ready on the first of these.
    ///   - failure: called once, with the reason, when the host cannot serve any more: its source ended on its own
    ///     (the capture device failed or stopped delivering, a file could not be read). The host keeps its players
    ///     (they hear nothing) until the owner stops it.
    public init(configuration: Configuration, source: any AudioSource, log: @escaping @Sendable (String) -> Void = { _ in },
                notice: (@Sendable (String) -> Void)? = nil, advertised: @escaping @Sendable (Bool) -> Void = { _ in },
                failure: @escaping @Sendable (String) -> Void = { _ in }) throws {
        peer = configuration.identity.peerID
        self.configuration = configuration
        self.source = source
        events = log
        notices = notice ?? log
        advertisedChanged = advertised
        onFailure = failure
        // Players send control messages (≤ 267 bytes) and audio, nothing else: no file transfers into $TMPDIR.
        let sessionConfig = Session.Configuration(maximumPeers: configuration.maximumPeers, peerTimeout: configuration.peerTimeout,
                                                  udpPort: configuration.port, bindHost: configuration.bindHost,
                                                  maximumMessageSize: Self.maximumControlMessageSize,
                                                  maximumPeersPerHost: configuration.maximumPlayersPerAddress,
                                                  maximumResourceSize: 0, topology: .star)
        let offer = AdvertisedFeatures(HostControl<PeerID>(clips: configuration.clips != nil, talk: configuration.talk != nil).offered)
        self.offer = offer
        // One port number for UDP and TCP. With no port asked for, the session's free UDP port may be taken for TCP
        // (by any connection's local port): then try another. The TCP port is bound here (`reservePort`), not only
        // when advertising starts, so that a taken one is found while another can still be tried.
        var attempt = 0
        var made: (Session, NearbyServiceAdvertiser)?
        while made == nil {
            attempt += 1
            let session = try Session(securityIdentity: configuration.identity, encryptionPreference: configuration.encryption,
                                      configuration: sessionConfig)
            let advertiser: NearbyServiceAdvertiser?
            do {
                let a = try Self.makeAdvertiser(configuration, source: source, features: offer.value,
                                                port: configuration.port == 0 ? session.udpPort : configuration.port)
                try a.reservePort()
                advertiser = a
            } catch {
                guard configuration.port == 0, attempt < 8, "\(error)".contains("Address already in use") else { throw error }
                advertiser = nil
            }
            if let advertiser { made = (session, advertiser) } else { session.disconnect() }
        }
        let (session, advertiser) = made!
        self.session = session
        self.advertiser = advertiser
        let notices = notice ?? log
        let controlQueue = DispatchQueue(label: "peermesh.relay-host.control")
        self.controlQueue = controlQueue
        pairing = try configuration.trust.map { trust in
            try PairingResponder(identity: configuration.identity, trust: trust, peerTimeout: configuration.peerTimeout,
                                 bindHost: configuration.bindHost, notices: notices) { [advertiser] open in
                controlQueue.async {
                    // A record that cannot be published reaches `advertiser(_:didUpdate: .failed)`: logged, and the
                    // status says not advertised.
                    try? advertiser.updateDiscoveryInfo(Self.info(configuration, source: source, features: offer.value, pairing: open))
                }
            }
        }
        let players = Players()
        self.players = players
        control = Mutex(HostControl(clips: configuration.clips != nil, talk: configuration.talk != nil,
                                    fullDuplex: configuration.talk?.fullDuplex ?? false, clipQuota: configuration.clipQuota))
        talkback = try configuration.talk.map { t in
            try PlayoutPipeline(format: RelayPlayer.talkFormat, configuration: .init(mode: .auto),
                                sink: try t.makeSink(RelayPlayer.talkFormat))
        }
        // The clip recorder reports how a clip ended on its own thread; the control queue takes it from there.
        let outcomes = Mutex<(@Sendable (ClipRecorder.Outcome) -> Void)?>(nil)
        var clips: ClipRecorder?
        if let c = configuration.clips {
            clips = try ClipRecorder(configuration: c, format: source.format) { outcome in outcomes.withLock { $0 }?(outcome) }
        }
        self.clips = clips
        var tap: (@Sendable (UnsafeBufferPointer<Float>) -> Void)?
        if let recorder = clips { tap = { recorder.tap($0) } }
        capture = try CapturePipeline(source: source, encoding: configuration.codec, opusBitrate: configuration.opusBitrate, withAudience: { [audience = players.audience] use in audience.withPeers(use) }, send: { bytes, peers in
            peers.count - session.sendDatagram(bytes, toConnected: peers)
        }, tap: tap)
        session.delegate = self
        advertiser.delegate = self
        outcomes.withLock { $0 = { [weak self] outcome in self?.clipEnded(outcome) } }
    }

    private static func makeAdvertiser(_ configuration: Configuration, source: any AudioSource, features: ControlFeatures,
                                       port: UInt16) throws -> NearbyServiceAdvertiser {
        try NearbyServiceAdvertiser(
            peer: configuration.identity.peerID,
            discoveryInfo: info(configuration, source: source, features: features, pairing: false),
            serviceType: configuration.serviceType, discovery: configuration.discovery, port: port,
            bindHost: configuration.bindHost, encryptionPreference: configuration.encryption)
    }

    /// The TXT record: the audio format, the control `features` offered (`ctl=1`, `clip=1`, `talk=1`), `pair=1` while
    /// pairing, and the caller's extra entries.
    private static func info(_ configuration: Configuration, source: any AudioSource, features: ControlFeatures,
                             pairing: Bool) -> [String: String] {
        var info = configuration.discoveryInfo
        for key in ["ctl", "clip", "talk"] { info[key] = nil }
        info.merge(features.discoveryInfo) { $1 }
        // The format players play: Opus travels at 48 kHz, but players decode it back to the source's rate.
        info["rate"] = String(source.format.sampleRate)
        info["ch"] = String(source.format.channels)
        info["period"] = String(source.periodFrames)
        if pairing { info["pair"] = "1" }
        return info
    }

    /// The advertiser's (and session's) port.
    public var port: UInt16 { advertiser.port ?? session.udpPort }

    /// Whether the microphone is muted: every player gets silence (no loss, no gap) until it is unmuted.
    public var isMuted: Bool {
        get { capture.isMuted }
        set {
            guard capture.isMuted != newValue else { return }
            capture.isMuted = newValue
            notices(newValue ? "microphone muted: players hear silence" : "microphone unmuted")
            controlQueue.async { [self] in perform(control.withLock { $0.setMuted(newValue) }) }
        }
    }

    /// Starts capture and the send thread, then advertising, and watches the trust store for forgotten players and
    /// the source for a failure.
    public func start() throws {
        try clips?.start()
        try talkback?.start()
        try capture.start()
        // A device thread refused real-time priority: say so once, with what to do (the audio still flows).
        for note in [capture.source.schedulingNote, talkback?.sink.schedulingNote].compactMap({ $0 }) { notices(note) }
        running.store(true, ordering: .releasing)
        try advertiser.startAdvertisingPeer()
        watch()
    }

    /// Every 250 ms while running: players whose key was forgotten are disconnected, and a source that ended on its
    /// own is reported.
    private func watch() {
        timers.asyncAfter(deadline: .now() + .milliseconds(250)) { [weak self] in
            guard let self, self.running.load(ordering: .acquiring) else { return }
            self.checkTrust()
            self.sayRationedConnections()
            if let fault = self.source.fault, !self.failed.exchange(true, ordering: .acquiringAndReleasing) {
                self.onFailure("capture ended: \(fault)")
            }
            // Talkback is a side channel: the host serves on without it, and says so once. Nobody holds the floor for
            // nothing: the talker is released, and push-to-talk is no longer offered.
            if let fault = self.talkback?.sink.fault, !self.talkbackEnded.exchange(true, ordering: .acquiringAndReleasing) {
                self.notices("talkback ended: \(fault); push-to-talk is refused from now on")
                self.controlQueue.async { [self] in
                    perform(control.withLock { $0.talkbackEnded("\(fault)") })
                    offer.withdraw(.talk)
                    // A failure reaches `advertiser(_:didUpdate: .failed)`, as above.
                    try? advertiser.updateDiscoveryInfo(Self.info(configuration, source: source, features: offer.value, pairing: isPairing))
                }
            }
            self.watch()
        }
    }

    /// Tells the operator, at most every 10 s, that connections were refused because their address had used its
    /// ration of tries: what a man in the middle searching for a matching check code runs into (docs/PROTOCOL.md §3.2).
    private func sayRationedConnections() {
        let now = MonotonicClock.nowNanos()
        let refused = advertiser.statistics.rationedConnections
        let told = rationNotice.withLock { n -> UInt64? in
            guard refused > n.told, now &- n.saidAtNanos >= 10_000_000_000 else { return nil }
            defer { (n.told, n.saidAtNanos) = (refused, now) }
            return n.told
        }
        guard let told else { return }
        notices("refused \(refused - told) connection\(refused - told == 1 ? "" : "s") from addresses that had used up their "
                + "tries (16 not let in at once, then one a second; \(refused) so far): a client that breaks off its "
                + "handshakes or is turned away and tries again at once, such as someone searching for a check code that matches")
    }

    /// Stops capture (nothing is sent after this), stops advertising and says goodbye to every player.
    public func stop() {
        // Never started, or its start failed: give back the TCP port it reserved (stopping twice does nothing more).
        guard running.exchange(false, ordering: .acquiringAndReleasing) else { return advertiser.stopAdvertisingPeer() }
        capture.stop()
        clips?.stop()
        talkback?.stop()
        advertiser.stopAdvertisingPeer()
        session.disconnect()
        pairing?.stop()
    }

    /// A snapshot of the counters.
    public var statistics: Statistics {
        var s = Statistics()
        s.codec = configuration.codec
        let (addresses, pairedNames, advertised) = state.withLock { ($0.addresses, $0.pairedNames.mapValues(\.name), $0.advertised) }
        let paused = players.paused
        let budget = self.budget.withLock { $0 }
        let control = self.control.withLock { $0 }
        s.players = players.all.map {
            PlayerInfo(peer: $0, pairedName: pairedNames[$0], address: addresses[$0], fingerprint: $0.publicKey?.shortFingerprint, paused: paused.contains($0),
                       talking: talker.withLock { $0 } == $0, droppedCommands: budget.dropped(by: $0),
                       refusedClips: control.refusedClips(by: $0))
        }
        s.droppedControl = budget.totalDropped
        s.capture = control.captureState
        s.controlCommands = control.counters.commands
        s.malformedControl = control.counters.malformed
        s.refusedClips = control.counters.refusedClips
        let callers = advertiser.statistics
        s.unadmittedHandshakes = callers.unadmittedHandshakes
        s.rationedConnections = callers.rationedConnections
        s.pairing = pairing?.isOpen ?? false
        s.advertised = advertised
        s.muted = capture.isMuted
        let c = capture.statistics
        s.packetsSent = c.packetsSent
        s.framesCaptured = c.framesCaptured
        s.peakLevel = c.peakLevel
        s.rmsLevel = c.rmsLevel
        let a = source.stats
        s.captureXruns = a.xruns
        s.captureOverrunFrames = a.overrunFrames
        s.captureDelayFrames = a.delayFrames
        return s
    }

    // MARK: Pairing

    /// Opens the pairing window: players that know `code` (a fresh 8-digit one by default) may pair until
    /// `timeout` passes or `maximumFailures` wrong codes have been tried. The TXT record says `pair=1` meanwhile.
    /// Returns the code.
    @discardableResult
    public func openPairingWindow(code: String = Pairing.newCode(), timeout: Duration = .seconds(30),
                                  maximumFailures: Int = 3) throws -> String {
        guard let pairing else { throw PeerMeshError.trust("pairing needs a trust store") }
        return pairing.open(code: code, timeout: timeout, maximumFailures: maximumFailures)
    }

    /// Whether the pairing window is open.
    public var isPairing: Bool { pairing?.isOpen ?? false }

    // MARK: Control (controlQueue only)

    /// Performs the control state machine's actions, in order (the lock is not held).
    private func perform(_ actions: [HostControl<PeerID>.Action]) {
        for action in actions {
            switch action {
            case .send(let peer, let message):
                if case .reply(_, .error(let why)) = message,
                   let held = refusals.withLock({ $0.admit(peer, now: MonotonicClock.nowNanos()) }) {
                    let more = held > 0 ? " (and \(held) more since the last such line)" : ""
                    events("control: refused a command from \(name(of: peer)): \(why)\(more)")
                }
                try? session.send(Data(message.encoded), toPeers: [peer], with: .reliable)
            case .setPaused(let peer, let paused):
                // A player that left is resumed only to be forgotten: say nothing.
                guard players.all.contains(peer) else { players.setPaused(peer, false); continue }
                players.setPaused(peer, paused)
                logChange(of: peer, "player \(name(of: peer)) \(paused ? "paused" : "resumed")")
            case .openClip(let number, let prerollOnly):
                guard let clips else { preconditionFailure("HostControl opened a clip on a host without clips") }
                do {
                    let name = try clips.open(clip: number, prerollOnly: prerollOnly)
                    events("clip \(name): recording")
                    perform(control.withLock { $0.clipOpened(number) })
                } catch {
                    // A clip that cannot be opened (no room, a directory it cannot write) gives its player its quota
                    // back, so the player may ask again at once: the line is said once in 10 s at most.
                    if let held = clipOpenFailures.withLock({ $0.admit(0, now: MonotonicClock.nowNanos()) }) {
                        events("clip failed: \(error)" + (held > 0 ? " (and \(held) more since the last such line)" : ""))
                    }
                    perform(control.withLock { $0.clipOpenFailed(number, reason: "\(error)") })
                }
            case .finishClip(let number):
                clips?.finish(clip: number)
            case .discardClip(let number):
                clips?.discard(clip: number)
            case .setTalker(let peer):
                let previous = talker.withLock { t -> PeerID? in defer { t = peer }; return t }
                if let peer {
                    logChange(of: peer, "player \(name(of: peer)) talks")
                } else if let previous {
                    logChange(of: previous, "player \(name(of: previous)) stopped talking")
                }
            case .holdForTalk(let peer, let held):
                players.setHeldForTalk(peer, held)
            case .clipRefused(let peer, let seconds):
                if let held = clipRefusals.withLock({ $0.admit(peer, now: MonotonicClock.nowNanos()) }) {
                    let more = held > 0 ? " (and \(held) more since the last such line)" : ""
                    events("control: refused a clip to \(name(of: peer)): over its clip quota, free again in \(seconds) s\(more)")
                }
            }
        }
    }

    /// Logs `line`, which says that `peer` paused, resumed, talks or stopped talking, unless it changed less than a
    /// second ago: then the line is held back, and when the second is over one line says where it stands.
    private func logChange(of peer: PeerID, _ line: String) {
        logCoalesced(changeLines, peer, line, Self.changes) { [weak self] in self?.summarizeChanges(of: peer) }
    }

    /// Logs `line` about `peer` through `coalescer`: at once, saying how many lines of the kind `held` names it sums
    /// up, or held back, with `summary` run when its second is over.
    private func logCoalesced(_ coalescer: borrowing Mutex<ChangeLineCoalescer<PeerID>>, _ peer: PeerID, _ line: String,
                              _ held: (Int) -> String, summary: @escaping @Sendable () -> Void) {
        switch coalescer.withLock({ $0.change(peer, now: MonotonicClock.nowNanos()) }) {
        case .log(let n):
            events(n > 0 ? "\(line) (after \(held(n)) not logged one by one)" : line)
        case .hold(let summarizeIn):
            guard let summarizeIn else { return }
            controlQueue.asyncAfter(deadline: .now() + .nanoseconds(Int(clamping: summarizeIn)), execute: summary)
        }
    }

    /// The second after a logged change of `peer` is over: if it changed again meanwhile, one line says how often, and
    /// where it stands now.
    private func summarizeChanges(of peer: PeerID) {
        guard let held = changeLines.withLock({ $0.summarize(peer, now: MonotonicClock.nowNanos()) }) else { return }
        // One that left meanwhile has no state to tell (its leaving is told by its own line).
        guard players.all.contains(peer) else { return }
        let paused = players.paused.contains(peer), talking = talker.withLock { $0 } == peer
        events("player \(name(of: peer)) \(paused ? "paused" : "playing")\(talking ? ", talking" : "") "
               + "(after \(Self.changes(held)) within a second, not logged one by one)")
    }

    private static func changes(_ n: Int) -> String { "\(n) more pause/resume/talk \(n == 1 ? "change" : "changes")" }

    /// Logs `line`, which says that `peer` joined or left, unless it came or went less than a second ago: then the
    /// line is held back, and when the second is over one line says whether it is here. A player that reconnects as
    /// fast as it can costs the log about a line a second.
    private func logVisit(of peer: PeerID, as name: String, _ line: String) {
        logCoalesced(visitLines, peer, line, Self.visits) { [weak self] in self?.summarizeVisits(of: peer, as: name) }
    }

    /// The second after a logged join or leave of `peer` (`name` in that line) is over: if it came or went again
    /// meanwhile, one line says how often, and whether it is here now (and from where). A paired player goes by the
    /// name it was paired under, whether it is here or gone: not by the one it gives.
    private func summarizeVisits(of peer: PeerID, as name: String) {
        guard let held = visitLines.withLock({ $0.summarize(peer, now: MonotonicClock.nowNanos()) }) else { return }
        let after = "(after \(Self.visits(held)) within a second, not logged one by one)"
        if players.all.contains(peer) {
            // Back in while its join is being noted, it may have no paired name yet: the one it had then stands.
            let (paired, address) = state.withLock { ($0.pairedNames[peer]?.name, $0.addresses[peer]) }
            events("player \(paired ?? name) is connected from \(address ?? "?") (\(peer.publicKey?.shortFingerprint ?? "no key")) \(after)")
        } else {
            events("player \(name) left \(after)")
        }
    }

    private static func visits(_ n: Int) -> String { "\(n) more \(n == 1 ? "join or leave" : "joins and leaves")" }

    /// `peer` sent commands faster than its budget (after a quiet second): it is told, in the answer to the command `id`
    /// that tipped it, and so is the log. The commands dropped after it in silence are said a second later, and so on
    /// each second while they go on: one line a second at most.
    private func tellOverBudget(_ peer: PeerID, id: UInt32, dropped: UInt64) {
        let limit = "at most \(CommandBudget<PeerID>.defaultCommandsPerSecond) a second, \(CommandBudget<PeerID>.defaultBurst) at once"
        events("control: \(name(of: peer)) sends commands too fast; dropping those over its budget (\(limit)), "
               + "unanswered: \(dropped) so far")
        let reply = ControlMessage.reply(id: id, .error("too many commands: dropping those over \(limit), unanswered"))
        try? session.send(Data(reply.encoded), toPeers: [peer], with: .reliable)
        // One report loop a player: a telling that comes while one runs (its timer fired late) starts no other.
        if reportingDrops.withLock({ $0.insert(peer).inserted }) { sayUntoldDrops(of: peer) }
    }

    /// In a second: the commands of `peer`'s dropped in silence since it was told, if any (and again a second later).
    private func sayUntoldDrops(of peer: PeerID) {
        controlQueue.asyncAfter(deadline: .now() + .seconds(1)) { [weak self] in
            guard let self else { return }
            guard let dropped = budget.withLock({ $0.takeUntold(peer, now: MonotonicClock.nowNanos()) }) else {
                reportingDrops.withLock { _ = $0.remove(peer) }
                return
            }
            events("control: dropped \(dropped) more commands of \(name(of: peer))'s, sent too fast, in the last second")
            sayUntoldDrops(of: peer)
        }
    }

    /// The command id in a control message's header (0 when it has none), to answer a dropped command by.
    private static func commandID(_ bytes: [UInt8]) -> UInt32 {
        do {
            if case .command(let id, _) = try ControlMessage.decode(bytes) { return id }
            return 0
        } catch {
            return error.id ?? 0
        }
    }

    /// The clip recorder's word on how a clip ended (its own thread), for the clip it names.
    private func clipEnded(_ outcome: ClipRecorder.Outcome) {
        controlQueue.async { [self] in
            switch outcome {
            case .saved(let number, let name):
                events("clip saved: \(name)")
                perform(control.withLock { $0.clipSaved(number, name: name) })
            case .failed(let number, let why):
                events("clip failed: \(why)")
                perform(control.withLock { $0.clipFailed(number, reason: why) })
            case .discarded(let number):
                events("clip discarded")
                perform(control.withLock { $0.clipDiscarded(number) })
            }
        }
    }

    // MARK: Trust

    /// The trust store was changed (a player forgotten): players no longer in it are disconnected now, without
    /// waiting for the next check.
    public func trustChanged() { timers.async { [weak self] in self?.checkTrust() } }

    /// Disconnects players admitted by the trust store whose key was forgotten since. A store that can no longer be
    /// read (damaged, or now writable by others) vouches for nobody: every player it admitted is disconnected, and the
    /// operator is told why.
    private func checkTrust() {
        guard let trust = configuration.trust else { return }
        let admitted = state.withLock { $0.admittedByTrust }
        guard !admitted.isEmpty else { return }
        let keys: Set<PublicKey>
        do { keys = Set(try trust.list().map(\.publicKey)) } catch {
            notices("\(error); disconnecting the \(admitted.count == 1 ? "player" : "players") it admitted")
            keys = []
        }
        for (peer, key) in admitted where !keys.contains(key) {
            state.withLock { _ = $0.admittedByTrust.removeValue(forKey: peer) }
            events("forgot \(name(of: peer)); disconnecting it")
            session.disconnect(peer)
        }
    }

    /// What logs call `peer`: the name it was paired under while it is connected as a paired player, else the name it
    /// gives.
    private func name(of peer: PeerID) -> String { state.withLock { $0.pairedNames[peer]?.name } ?? peer.displayName }

    /// Whether the trust store holds `key`. A store that cannot be read trusts nobody; the operator is told why.
    private func isTrusted(_ key: PublicKey?, peer: PeerID) -> Bool {
        guard let key, let trust = configuration.trust else { return false }
        do { return try trust.contains(key) } catch {
            notices("\(error); \(peer.displayName) (\(key.shortFingerprint)) is not admitted as paired")
            return false
        }
    }

    // MARK: Delegates

    public func session(_ session: Session, peer: PeerID, didChange state: SessionState) {
        players.update(peer, connected: state == .connected)
        switch state {
        case .connected:
            // A paired player is known by the name it was paired under; the one it gives now may be another. One
            // read-modify-write of the store notes the visit and says which. The name is noted before anything else
            // of this player's is logged.
            let paired = peer.publicKey.flatMap { key in (try? configuration.trust?.touch(key, name: peer.displayName)) ?? nil }
            let address = self.state.withLock { s in
                s.connections += 1
                s.pairedNames[peer] = paired.map { (s.connections, $0.name) }
                if let admitted = s.admitting.removeValue(forKey: peer) {
                    s.addresses[peer] = admitted.address
                    s.admittedByTrust[peer] = admitted.trustedKey
                } else if paired != nil, let key = peer.publicKey {
                    // Its admission was dropped before it connected: a paired key answers to the trust store all
                    // the same (the watch disconnects it if it is forgotten).
                    s.admittedByTrust[peer] = key
                }
                return s.addresses[peer]
            }
            let alias = paired.map { $0.name == peer.displayName ? "" : ", calls itself \"\(peer.displayName)\"" } ?? ", not paired"
            controlQueue.async { [self] in perform(control.withLock { $0.joined(peer) }) }
            let shown = name(of: peer)
            logVisit(of: peer, as: shown, "player \(shown) joined from \(address ?? "?") (\(peer.publicKey?.shortFingerprint ?? "no key")\(alias))")
        case .notConnected:
            let (name, connection) = self.state.withLock { s in
                s.admittedByTrust[peer] = nil
                s.addresses[peer] = nil
                s.admitting[peer] = nil
                return (s.pairedNames[peer]?.name ?? peer.displayName, s.pairedNames[peer]?.connection)
            }
            // Its command budget and the throttles of its log lines outlive the visit: coming back buys nothing.
            budget.withLock { $0.forget(peer, now: MonotonicClock.nowNanos()) }
            controlQueue.async { [self] in
                perform(control.withLock { $0.left(peer) })
                // Its lines are logged by now (leaving may end its talk); its name goes too, unless it joined again.
                self.state.withLock { s in
                    if let connection, s.pairedNames[peer]?.connection == connection { s.pairedNames[peer] = nil }
                }
            }
            logVisit(of: peer, as: name, "player \(name) left")
        case .connecting: break
        }
    }

    /// Talkback: the talker's audio datagrams go to the talk pipeline (the session's I/O thread); anyone else's are
    /// dropped.
    public func session(_ session: Session, didReceiveDatagramBytes bytes: UnsafeRawBufferPointer, fromPeer peer: PeerID) {
        guard let talkback, session === self.session, talker.withLock({ $0 }) == peer else { return }
        talkback.receive(bytes, arrivalNanos: MonotonicClock.nowNanos())
    }

    /// A control message: within the player's budget, it is queued for the control state machine; over it, it is
    /// dropped here and counted, before it costs the control queue (or the log) anything.
    public func session(_ session: Session, didReceive data: Data, fromPeer peer: PeerID) {
        let bytes = Array(data)
        switch budget.withLock({ $0.spend(peer, now: MonotonicClock.nowNanos()) }) {
        case .take:
            controlQueue.async { [self] in perform(control.withLock { $0.received(bytes, from: peer, now: MonotonicClock.nowNanos()) }) }
        case .drop:
            break
        case .dropAndTell(let dropped):
            let id = Self.commandID(bytes)
            controlQueue.async { [self] in tellOverBudget(peer, id: id, dropped: dropped) }
        }
    }

    /// Admits a player by `Admission`'s table: to the pairing window, in, to the operator, or out.
    public func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceive invitation: Invitation) {
        let peer = invitation.peer
        let key = invitation.certificate?.publicKey
        let trusted = isTrusted(key, peer: peer)
        @Sendable func admit(byTrust: Bool) {
            let now = MonotonicClock.nowNanos()
            state.withLock { s in
                s.admitting = s.admitting.filter { now &- $0.value.atNanos < Self.admissionWait }
                if s.admitting.count >= Self.maximumAdmitting, let oldest = s.admitting.min(by: { $0.value.atNanos < $1.value.atNanos }) {
                    s.admitting[oldest.key] = nil
                }
                s.admitting[peer] = (invitation.address, byTrust ? key : nil, now)
            }
            invitation.accept(into: session)
        }
        switch Admission.decide(context: invitation.context, key: key, trusted: trusted, policy: configuration.accept,
                                encryption: configuration.encryption) {
        case .pairing:
            let closed = "the pairing window is closed; open it with mesh-record --pair"
            if pairing?.take(invitation, closedMessage: closed) != true { invitation.decline(.declined, message: closed) }
        case .accept(let byTrust):
            admit(byTrust: byTrust)
        case .decline(let reason, let message):
            if let key {
                events("refused \(peer.displayName) from \(invitation.address ?? "?") (\(key.shortFingerprint)): \(message)")
            }
            invitation.decline(reason, message: message)
        case .askOperator:
            guard case .ask(let approval) = configuration.accept, let key else {
                preconditionFailure("Admission asked the operator of a host whose policy is not .ask, or about no key")
            }
            let address = invitation.address ?? "?"
            guard state.withLock({ $0.asking.insert(address).inserted }) else {
                // Not a refusal of this player: it may ask again once that question is answered.
                return invitation.decline(.unavailable, message: "a request from \(address) is already waiting for an answer")
            }
            // A stranger that gives a paired player's name is not that player: the question says so.
            let namesake = ((try? configuration.trust?.list()) ?? nil).flatMap { entries in
                TrustStore.entries(pairedUnder: peer.displayName, in: entries).first { $0.publicKey != key }
            }
            let request = JoinRequest(peer: peer, address: address, fingerprint: key.shortFingerprint,
                                      shortAuthenticationString: invitation.certificate?.shortAuthenticationString ?? "",
                                      namesakeFingerprint: namesake?.publicKey.shortFingerprint, invitation: invitation)
            approval.ask(request) { [self] decision in
                state.withLock { _ = $0.asking.remove(address) }
                switch decision {
                case .once:
                    events("accepted \(peer.displayName) once")
                    admit(byTrust: false)
                case .always:
                    // Paired only if its key is stored: otherwise it is let in this once, and the operator is told.
                    do throws(PeerMeshError) {
                        guard let trust = configuration.trust else { throw .trust("this host keeps no trust store") }
                        let entry = try trust.add(key, name: peer.displayName)
                        events("accepted \(peer.displayName) and paired it\(entry.storedNameNote(given: peer.displayName))")
                        admit(byTrust: true)
                    } catch {
                        notices("accepted \(peer.displayName) once; it could not be paired: \(error)")
                        admit(byTrust: false)
                    }
                case .no:
                    events("declined \(peer.displayName)")
                    invitation.decline(.declined, message: "declined by the host's operator")
                }
            }
            invitation.onWithdrawn { [self] in
                state.withLock { _ = $0.asking.remove(address) }
                request.withdraw()
            }
        }
    }

    public func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceiveInvitationFromPeer peer: PeerID,
                           withContext context: Data?, invitationHandler: @escaping @Sendable (Bool, Session?) -> Void) {
        // Not used: the richer `didReceive invitation` form answers.
        invitationHandler(false, nil)
    }

    public func advertiser(_ advertiser: NearbyServiceAdvertiser, didNotStartAdvertisingPeer error: PeerMeshError) {
        events("advertising failed: \(error)")
    }

    public func advertiser(_ advertiser: NearbyServiceAdvertiser, didUpdate publication: PublicationEvent) {
        switch publication {
        case .published(let name):
            guard configuration.discoveryReachesNetwork else { return }
            let first = state.withLock { s -> Bool in defer { s.advertised = true }; return !s.advertised }
            if first {
                events("advertised as _\(configuration.serviceType)._tcp (instance \(name))")
                advertisedChanged(true)
            }
        case .waitingForDaemon:
            state.withLock { $0.advertised = false }
            events("waiting for avahi-daemon; the host is advertised as soon as it runs (players can use --connect meanwhile)")
            advertisedChanged(false)
        case .failed(let error):
            state.withLock { $0.advertised = false }
            events("not advertised: \(error)")
            advertisedChanged(false)
        }
    }

    /// Admissions whose players have not connected yet (tests).
    var admissionsWaiting: Int { state.withLock { $0.admitting.count } }

    /// The invitation context of a player that comes to pair (`mesh-play --pair`) rather than to listen.
    public static let pairingContext = PairingResponder.context

    /// The largest reliable message the relay's sessions take: room for any control message (`ControlMessage`).
    static let maximumControlMessageSize = 1024

    /// How long a player let in may take to connect before its admission is forgotten (the session connects one
    /// within a round trip, or turns it away).
    static let admissionWait: UInt64 = 10_000_000_000
    /// The most admissions kept waiting for their players to connect (`HostState.admitting`).
    static let maximumAdmitting = 256
}
