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
    /// How the host answers players who want to join.
    public enum AcceptPolicy: Sendable {
        /// Only players whose key is in the trust store (paired). The default.
        case paired
        /// Ask `approval` about players not in the trust store (the CLI prompts on the terminal).
        case ask(any PlayerApproval)
        /// Every player, paired or not: anyone on the network can listen. For public installations.
        case all
    }

    /// What the host needs to run.
    public struct Configuration: Sendable {
        /// Who the host is: its key pair and the name players see.
        public var identity: PeerIdentity
        /// The keys of paired players (also where pairing and "always" answers are written).
        public var trust: TrustStore?
        /// The service type advertised.
        public var serviceType: String = "mesh-audio"
        /// TCP port of the advertiser and UDP port of the session (0 picks one; both use the same number).
        public var port: UInt16 = 0
        /// Local address to listen on ("" = every address, IPv4 and IPv6).
        public var bindHost: String = ""
        /// Peers in the session including the host.
        public var maximumPeers: Int = 33
        /// Most players from one address (one machine cannot take every slot).
        public var maximumPlayersPerAddress: Int = 4
        /// How players are admitted.
        public var accept: AcceptPolicy = .paired
        /// Discovery backend; `nil` means Avahi.
        public var discovery: (any DiscoveryBackend)?
        /// Whether `discovery` reaches the network. False when an in-process backend stands in because there is no
        /// DNS-SD at all: then the host never says (or reports) that it is advertised.
        public var discoveryReachesNetwork = true
        /// A player silent this long is dropped.
        public var peerTimeout: Duration = .seconds(2)
        /// Extra discovery info published beside the audio format.
        public var discoveryInfo: [String: String] = [:]
        /// The audio session's encryption. `.required` (the default) is the product; `.none` exists so that
        /// `scripts/bench` can measure what encryption costs. With `.none` no key is proven, so only `.all` admits.
        public var encryption: EncryptionPreference = .required
        /// Clip capture (`--clips DIR`): where clips go and how long they are; nil keeps no clips.
        public var clips: ClipRecorder.Configuration?
        /// Talkback (`--talk-output`, `--talk-device`): where a talking player is played; nil takes no talkback.
        public var talk: TalkOutput?
        /// How the samples travel (`--codec`): Float32 (the default), dithered Int16 at half the bandwidth, or Opus
        /// (48 kHz, 2.5 ms frames, `opusBitrate`). Players follow whatever arrives.
        public var codec: SampleEncoding = .float32
        /// The Opus bitrate in bits per second (`--bitrate`), for `codec == .opus`.
        public var opusBitrate: Int = Packetizer.defaultOpusBitrate

        /// The settings most hosts set; every other one keeps its default.
        public init(identity: PeerIdentity, trust: TrustStore?, serviceType: String = "mesh-audio", port: UInt16 = 0,
                    maximumPeers: Int = 33, accept: AcceptPolicy = .paired, discovery: (any DiscoveryBackend)? = nil) {
            self.identity = identity
            self.trust = trust
            self.serviceType = serviceType
            self.port = port
            self.maximumPeers = maximumPeers
            self.accept = accept
            self.discovery = discovery
        }
    }

    /// Counters and levels, for the status line and `--json`.
    public struct Statistics: Sendable {
        /// The players connected now.
        public var players: [PlayerInfo] = []
        /// Audio packets sent (to all players together).
        public var packetsSent: UInt64 = 0
        /// Frames read from the capture source.
        public var framesCaptured: UInt64 = 0
        /// Capture over- and underruns recovered (`snd_pcm_recover`).
        public var captureXruns: UInt64 = 0
        /// The capture device's latest delay (`snd_pcm_delay`), frames.
        public var captureDelayFrames: Int = 0
        /// Peak |sample| of the latest captured chunk.
        public var peakLevel: Float = 0
        /// RMS of the latest captured chunk.
        public var rmsLevel: Float = 0
        /// How the samples travel (`Configuration.codec`).
        public var codec: SampleEncoding = .float32
        /// Whether the pairing window is open.
        public var pairing = false
        /// Whether the advertisement is out (false while avahi-daemon is missing).
        public var advertised = false
        /// Whether the operator muted the microphone (players get silence).
        public var muted = false
        /// The clip state players see (`off` without `--clips`).
        public var capture: CaptureState = .off
        /// Control commands received from players.
        public var controlCommands: UInt64 = 0
        /// Control messages from players that did not decode (dropped).
        public var malformedControl: UInt64 = 0
    }

    /// Where talkback from the players is played: a sink for the talker's format, and whether the talker keeps
    /// hearing the host meanwhile.
    public struct TalkOutput: Sendable {
        /// Builds the sink (an ALSA `Player`, or a `WAVFileSink`) for the talkback format.
        public var makeSink: @Sendable (AudioFormat) throws -> any AudioSink
        /// `--talk-duplex full`: the talker keeps hearing the host. By default (half duplex) the host stops sending its
        /// microphone to the player that talks, which avoids echo without echo cancellation.
        public var fullDuplex = false
        /// A talkback output that plays into the sinks `makeSink` builds.
        public init(fullDuplex: Bool = false, makeSink: @escaping @Sendable (AudioFormat) throws -> any AudioSink) {
            self.makeSink = makeSink
            self.fullDuplex = fullDuplex
        }
    }

    /// A connected player, as the host sees it.
    public struct PlayerInfo: Sendable, Equatable {
        /// The player (its display name is raw remote text: escape it before printing).
        public var peer: PeerID
        /// The numeric address its invitation came from.
        public var address: String?
        /// The short fingerprint of the key its handshake proved.
        public var fingerprint: String?
        /// Whether the player paused its audio (the host sends it none meanwhile).
        public var paused = false
        /// Whether the player talks back now.
        public var talking = false
    }

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
    /// Whether the talkback output's end was logged (it is logged once).
    private let talkbackEnded = Atomic<Bool>(false)
    private let notices: @Sendable (String) -> Void
    private let state = Mutex(HostState())
    private let timers = DispatchQueue(label: "peermesh.relay-host.timers")
    /// The control protocol's state machine; its actions are performed on `controlQueue`, in order.
    private let control: Mutex<HostControl<PeerID>>
    private let controlQueue = DispatchQueue(label: "peermesh.relay-host.control")
    private let clips: ClipRecorder?
    /// The talkback pipeline (network → jitter buffer → … → the talk sink), and whose datagrams it plays.
    private let talkback: PlayoutPipeline?
    private let talker = Mutex<PeerID?>(nil)
    /// Refused commands are logged at most once a second a player (the control queue's; a lock for `Sendable`).
    private let refusals = Mutex(LogThrottle<PeerID>(interval: 1_000_000_000))

    private struct HostState {
        /// Players admitted because the trust store has their key: forgotten keys are disconnected.
        var admittedByTrust: [PeerID: PublicKey] = [:]
        /// Where each player connected from.
        var addresses: [PeerID: String] = [:]
        /// Addresses with a question open to the operator (`.ask`): one at a time per address.
        var asking: Set<String> = []
        var advertised = false
    }

    /// The connected players, shared with the capture thread; a paused player is connected but not in the audience.
    /// The audience is published whole (`SnapshotCell`): the capture thread reads it once per chunk without a lock.
    private final class Players: Sendable {
        private struct List {
            var connected: [PeerID] = []
            var paused: Set<PeerID> = []
            /// Held while they talk (half duplex).
            var talking: Set<PeerID> = []
            var audience: [PeerID] { connected.filter { !paused.contains($0) && !talking.contains($0) } }
        }
        /// An audience as published.
        private final class Audience: Sendable {
            let peers: [PeerID]?
            init(_ peers: [PeerID]) { self.peers = peers.isEmpty ? nil : peers }
        }
        private let list = Mutex(List())
        private let published = SnapshotCell<Audience>(Audience([]))
        /// Lends `use` the players audio goes to now; does not call it when there are none. Lock-free (the capture
        /// thread), and the snapshot stays alive through `use`: one replaced meanwhile is freed by its writer.
        func withAudience(_ use: ([PeerID]) -> Void) {
            published.withCurrent { if let peers = $0?.peers { use(peers) } }
        }
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
        /// Changes the list and publishes the audience, under the lock (which keeps the publishers in turn).
        private func change(_ body: (inout List) -> Void) {
            list.withLock { l in
                body(&l)
                published.replace(with: Audience(l.audience))
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
        // One port number for UDP and TCP. With no port asked for, the session's free UDP port may be taken for TCP
        // (by any connection's local port): then try another.
        var attempt = 0
        var made: (Session, NearbyServiceAdvertiser)?
        while made == nil {
            attempt += 1
            let session = try Session(securityIdentity: configuration.identity, encryptionPreference: configuration.encryption,
                                      configuration: sessionConfig)
            let advertiser: NearbyServiceAdvertiser?
            do {
                advertiser = try Self.makeAdvertiser(configuration, source: source, port: configuration.port == 0 ? session.udpPort : configuration.port)
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
        pairing = try configuration.trust.map { trust in
            try PairingResponder(identity: configuration.identity, trust: trust, peerTimeout: configuration.peerTimeout,
                                 bindHost: configuration.bindHost, notices: notices) { [advertiser] open in
                try? advertiser.updateDiscoveryInfo(Self.info(configuration, source: source, pairing: open))
            }
        }
        let players = Players()
        self.players = players
        control = Mutex(HostControl(clips: configuration.clips != nil, talk: configuration.talk != nil,
                                    fullDuplex: configuration.talk?.fullDuplex ?? false))
        talkback = try configuration.talk.map { t in
            try PlayoutPipeline(format: .default, configuration: .init(mode: .auto), sink: try t.makeSink(.default))
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
        capture = try CapturePipeline(source: source, encoding: configuration.codec, opusBitrate: configuration.opusBitrate, withAudience: { [players] use in players.withAudience(use) }, send: { bytes, peers in
            session.sendDatagram(bytes, toConnected: peers) == 0
        }, tap: tap)
        session.delegate = self
        advertiser.delegate = self
        outcomes.withLock { $0 = { [weak self] outcome in self?.clipEnded(outcome) } }
    }

    private static func makeAdvertiser(_ configuration: Configuration, source: any AudioSource, port: UInt16) throws -> NearbyServiceAdvertiser {
        try NearbyServiceAdvertiser(
            peer: configuration.identity.peerID,
            discoveryInfo: info(configuration, source: source, pairing: false),
            serviceType: configuration.serviceType, discovery: configuration.discovery, port: port,
            bindHost: configuration.bindHost, encryptionPreference: configuration.encryption)
    }

    /// The TXT record: the audio format, the control features (`ctl=1`, `clip=1`), `pair=1` while pairing, and the
    /// caller's extra entries.
    private static func info(_ configuration: Configuration, source: any AudioSource, pairing: Bool) -> [String: String] {
        var info = configuration.discoveryInfo
        info.merge(HostControl<PeerID>(clips: configuration.clips != nil, talk: configuration.talk != nil).offered.discoveryInfo) { $1 }
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
            if let fault = self.source.fault, !self.failed.exchange(true, ordering: .acquiringAndReleasing) {
                self.onFailure("capture ended: \(fault)")
            }
            // Talkback is a side channel: the host serves on without it, and says so once.
            if let fault = self.talkback?.sink.fault, !self.talkbackEnded.exchange(true, ordering: .acquiringAndReleasing) {
                self.notices("talkback ended: \(fault); players' push-to-talk is not heard")
            }
            self.watch()
        }
    }

    /// Stops capture (nothing is sent after this), stops advertising and says goodbye to every player.
    public func stop() {
        guard running.exchange(false, ordering: .acquiringAndReleasing) else { return }
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
        let (addresses, advertised) = state.withLock { ($0.addresses, $0.advertised) }
        let paused = players.paused
        s.players = players.all.map {
            PlayerInfo(peer: $0, address: addresses[$0], fingerprint: $0.publicKey?.shortFingerprint, paused: paused.contains($0),
                       talking: talker.withLock { $0 } == $0)
        }
        let (clip, counters) = control.withLock { ($0.captureState, $0.counters) }
        s.capture = clip
        s.controlCommands = counters.commands
        s.malformedControl = counters.malformed
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
                    events("control: refused a command from \(peer.displayName): \(why)\(more)")
                }
                try? session.send(Data(message.encoded), toPeers: [peer], with: .reliable)
            case .setPaused(let peer, let paused):
                // A player that left is resumed only to be forgotten: say nothing.
                guard players.all.contains(peer) else { players.setPaused(peer, false); continue }
                players.setPaused(peer, paused)
                events("player \(peer.displayName) \(paused ? "paused" : "resumed")")
            case .openClip(let prerollOnly):
                guard let clips else { preconditionFailure("HostControl opened a clip on a host without clips") }
                do {
                    let name = try clips.open(prerollOnly: prerollOnly)
                    events("clip \(name): recording")
                    perform(control.withLock { $0.clipOpened() })
                } catch {
                    events("clip failed: \(error)")
                    perform(control.withLock { $0.clipOpenFailed("\(error)") })
                }
            case .finishClip:
                clips?.finish()
            case .discardClip:
                clips?.discard()
                events("clip discarded")
            case .setTalker(let peer):
                let previous = talker.withLock { t -> PeerID? in defer { t = peer }; return t }
                if let peer { events("player \(peer.displayName) talks") } else if let previous { events("player \(previous.displayName) stopped talking") }
            case .holdForTalk(let peer, let held):
                players.setHeldForTalk(peer, held)
            }
        }
    }

    /// The clip recorder's word on how a clip ended (its own thread).
    private func clipEnded(_ outcome: ClipRecorder.Outcome) {
        controlQueue.async { [self] in
            switch outcome {
            case .saved(let name):
                events("clip saved: \(name)")
                perform(control.withLock { $0.clipSaved(name) })
            case .failed(let why):
                events("clip failed: \(why)")
                perform(control.withLock { $0.clipFailed(why) })
            }
        }
    }

    // MARK: Trust

    /// The trust store was changed (a player forgotten): players no longer in it are disconnected now, without
    /// waiting for the next check.
    public func trustChanged() { timers.async { [weak self] in self?.checkTrust() } }

    /// Disconnects players admitted by the trust store whose key was forgotten since.
    private func checkTrust() {
        guard let trust = configuration.trust else { return }
        let admitted = state.withLock { $0.admittedByTrust }
        guard !admitted.isEmpty, let keys = try? Set(trust.list().map(\.publicKey)) else { return }
        for (peer, key) in admitted where !keys.contains(key) {
            state.withLock { _ = $0.admittedByTrust.removeValue(forKey: peer) }
            events("forgot \(peer.displayName); disconnecting it")
            session.disconnect(peer)
        }
    }

    // MARK: Delegates

    public func session(_ session: Session, peer: PeerID, didChange state: SessionState) {
        players.update(peer, connected: state == .connected)
        switch state {
        case .connected:
            controlQueue.async { [self] in perform(control.withLock { $0.joined(peer) }) }
            let address = self.state.withLock { $0.addresses[peer] }
            events("player \(peer.displayName) joined from \(address ?? "?") (\(peer.publicKey?.shortFingerprint ?? "no key"))")
            if let key = peer.publicKey { try? configuration.trust?.touch(key, name: peer.displayName) }
        case .notConnected:
            self.state.withLock {
                $0.admittedByTrust[peer] = nil
                $0.addresses[peer] = nil
            }
            controlQueue.async { [self] in
                refusals.withLock { $0.forget(peer) }
                perform(control.withLock { $0.left(peer) })
            }
            events("player \(peer.displayName) left")
        case .connecting: break
        }
    }

    /// Talkback: the talker's audio datagrams go to the talk pipeline (the session's I/O thread); anyone else's are
    /// dropped.
    public func session(_ session: Session, didReceiveDatagramBytes bytes: UnsafeRawBufferPointer, fromPeer peer: PeerID) {
        guard let talkback, session === self.session, talker.withLock({ $0 }) == peer else { return }
        talkback.receive(bytes, arrivalNanos: MonotonicClock.nowNanos())
    }

    public func session(_ session: Session, didReceive data: Data, fromPeer peer: PeerID) {
        let bytes = Array(data)
        controlQueue.async { [self] in perform(control.withLock { $0.received(bytes, from: peer) }) }
    }

    public func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceive invitation: Invitation) {
        let peer = invitation.peer
        if invitation.context == Self.pairingContext {
            let closed = "the pairing window is closed; open it with mesh-record --pair"
            if pairing?.take(invitation, closedMessage: closed) != true { invitation.decline(.declined, message: closed) }
            return
        }
        guard let key = invitation.certificate?.publicKey else {
            // No proven key: only a plaintext host that admits all (the bench's baseline) lets it in.
            if case .all = configuration.accept, configuration.encryption == .none {
                state.withLock { $0.addresses[peer] = invitation.address }
                return invitation.accept(into: session)
            }
            return invitation.decline(.notTrusted, message: "an unencrypted player cannot join")
        }
        let trusted = (try? configuration.trust?.contains(key)) ?? false
        @Sendable func admit(byTrust: Bool) {
            state.withLock {
                $0.addresses[peer] = invitation.address
                if byTrust { $0.admittedByTrust[peer] = key }
            }
            invitation.accept(into: session)
        }
        switch configuration.accept {
        case .all:
            admit(byTrust: trusted)
        case .paired:
            if trusted { admit(byTrust: true) } else {
                events("refused \(peer.displayName) from \(invitation.address ?? "?") (\(key.shortFingerprint)): not paired")
                invitation.decline(.notTrusted, message: "not paired")
            }
        case .ask(let approval):
            if trusted { return admit(byTrust: true) }
            let address = invitation.address ?? "?"
            guard state.withLock({ $0.asking.insert(address).inserted }) else {
                return invitation.decline(.declined, message: "a request from \(address) is already waiting for an answer")
            }
            let request = JoinRequest(peer: peer, address: address, fingerprint: key.shortFingerprint,
                                      shortAuthenticationString: invitation.certificate?.shortAuthenticationString ?? "",
                                      invitation: invitation)
            approval.ask(request) { [self] decision in
                state.withLock { _ = $0.asking.remove(address) }
                switch decision {
                case .once:
                    events("accepted \(peer.displayName) once")
                    admit(byTrust: false)
                case .always:
                    try? configuration.trust?.add(key, name: peer.displayName)
                    events("accepted \(peer.displayName) and paired it")
                    admit(byTrust: true)
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

    /// The invitation context a player sends to pair.
    /// The invitation context of a player that comes to pair (`mesh-play --pair`) rather than to listen.
    public static let pairingContext = PairingResponder.context

    /// The largest reliable message the relay's sessions take: room for any control message (`ControlMessage`).
    static let maximumControlMessageSize = 1024
}

/// A player asking to join a host whose policy is `.ask`: what the operator sees, and how to answer.
public final class JoinRequest: Sendable {
    /// The player (its display name is raw remote text: escape it before printing).
    public let peer: PeerID
    /// The numeric address the invitation came from.
    public let address: String
    /// The player's short key fingerprint.
    public let fingerprint: String
    /// Six digits the player can show too.
    public let shortAuthenticationString: String
    private let invitation: Invitation
    /// Whether the request went away unanswered, and (until then) who wants to hear of it.
    private let withdrawal = Mutex<(done: Bool, waiting: [@Sendable () -> Void])>((false, []))

    init(peer: PeerID, address: String, fingerprint: String, shortAuthenticationString: String, invitation: Invitation) {
        self.peer = peer
        self.address = address
        self.fingerprint = fingerprint
        self.shortAuthenticationString = shortAuthenticationString
        self.invitation = invitation
    }

    /// Runs `body` once if the request goes away unanswered (the player gave up, or it timed out) — at once if it
    /// already has.
    public func onWithdrawn(_ body: @escaping @Sendable () -> Void) {
        // Checked and registered under one lock: a withdrawal between the two would otherwise never reach `body`.
        let now = withdrawal.withLock { w -> Bool in
            if !w.done { w.waiting.append(body) }
            return w.done
        }
        if now { body() }
    }

    /// Whether the request still waits for an answer.
    public var isOpen: Bool { invitation.isOpen }

    func withdraw() {
        let waiting = withdrawal.withLock { w -> [@Sendable () -> Void] in
            guard !w.done else { return [] }
            w.done = true
            defer { w.waiting = [] }
            return w.waiting
        }
        for body in waiting { body() }
    }
}

/// The operator's answer to a `JoinRequest`.
public enum JoinDecision: Sendable, Equatable {
    /// Let the player in this time.
    case once
    /// Let it in and trust its key from now on (pairs it).
    case always
    /// Turn it down (the player does not retry).
    case no
}

/// Asks someone whether a player may join (`RelayHost.AcceptPolicy.ask`).
public protocol PlayerApproval: Sendable {
    /// Asks about `request`; call `decide` exactly once, from any thread. If the request is withdrawn first,
    /// take the question down (`request.onWithdrawn`); a late answer changes nothing. The take-down runs on the host's
    /// I/O thread, possibly while `RelayHost.stop()` waits for it: it must not wait for the thread that stops the host.
    func ask(_ request: JoinRequest, decide: @escaping @Sendable (JoinDecision) -> Void)
}
