import Dispatch
import FoundationEssentials
import MeshAudio
import MeshPipeline
import PeerMesh
import Synchronization
import MeshPOSIX

/// The playback side of the relay: finds a host (DNS-SD or a direct address), joins its encrypted session, and plays
/// what it sends. It joins only hosts whose key it trusts (paired), pinned by key, never by name. When the host goes
/// away it says so, searches again and rejoins by itself; when the host refuses it for good (not paired, declined),
/// it gives up and says why.
///
/// The chain is MeshPipeline's `PlayoutPipeline` (ingress → jitter buffer → conceal → drift/resample → sink); the
/// player gives it the sink, built for the host's format by `makeSink`. The session delivers datagrams to a
/// `DatagramReader` (not to the delegate), and the sink's real-time thread reads it into the pipeline itself: one
/// thread wakes once per period for the network and the device (a sink that does not serve inputs gets a `pm-net`
/// thread that reads for it). When the host switches format, the pipeline reports it and the control queue builds a
/// new one and swaps it in.
public final class RelayPlayer: SessionDelegate, NearbyServiceBrowserDelegate, Sendable {
    /// Concealment and waiting time, attributed on the control queue every tick.
    private struct Accounting {
        var lastConcealed: UInt64 = 0
        var lastPlayed: UInt64 = 0
        var waitingConcealed: UInt64 = 0
        var waitingFrames: UInt64 = 0
    }

    /// The configuration the player was made with.
    public let configuration: Configuration
    /// The session the player joins its host in.
    public let session: Session
    /// The player's own peer (name and key), as hosts see it.
    public let peer: PeerID
    private let makeSink: SinkFactory
    private let browser: NearbyServiceBrowser?
    private let join: Mutex<JoinStateMachine>
    /// The pipeline playing now: read by the datagram path, replaced only on `control`.
    private let playout = SnapshotCell<PlayoutPipeline>()
    private let host = Mutex<PeerID?>(nil)
    /// What the datagrams of audio said so far (frames, first audio, whether audio came since the join).
    private let arrivals = AudioArrivals()
    /// The session's datagrams, as the sinks' threads read them.
    private let packets: SessionPackets
    /// The thread that reads datagrams for a sink that does not (started the first time one is used).
    private let pump = Mutex<DatagramPump?>(nil)
    private let control = DispatchQueue(label: "peermesh.relay-player.control")
    /// Direct connects (`--connect`): a name's lookup blocks, and must not block the control queue.
    private let connector = DispatchQueue(label: "peermesh.relay-player.connect")
    /// Whether a direct connect is still looking up its name (on `connector`).
    private let connecting = Atomic<Bool>(false)
    /// Marks `control`, so that `onControl` knows when it already runs there.
    private let onControlKey = DispatchSpecificKey<Bool>()
    private let seen = Mutex<[PeerID: SeenHost]>([:])
    /// Hosts this player approved and that have not answered yet: whether the player said it waits, and the check
    /// code once the host's operator is shown it.
    private let unanswered = Mutex(Unanswered())
    private let accounting = Mutex(Accounting())
    private let ticking = Atomic<Bool>(false)
    private let log: @Sendable (String) -> Void
    /// Whether a sink's `schedulingNote` has been logged (once a run, not once a pipeline).
    private let schedulingNoted = Atomic<Bool>(false)
    private let onGiveUp: @Sendable (String) -> Void
    /// Whether `onGiveUp` was called (it is called once).
    private let gaveUp = Atomic<Bool>(false)
    /// Whether the talk input's end was logged (it is logged once).
    private let talkInputEnded = Atomic<Bool>(false)
    private let started = Atomic<UInt64>(0)
    /// Rebuilds for a new host format allowed so far (control queue).
    private let formatChanges = Mutex(FormatChangeLimiter())
    /// The listener's controls over playback (hold, volume, mute, beep), kept across pipelines.
    public let controls = OutputControls()
    /// The control protocol's player side; its actions are performed on `control`.
    private let remote = Mutex(PlayerControl())
    /// The lines that say a host's message was ignored: one a second (each is counted, `malformedControl`), so that a
    /// host that sends nothing else cannot fill the player's log (the control queue's; a lock for `Sendable`).
    private let ignoredLines = Mutex(LogThrottle<Int>(interval: 1_000_000_000))
    /// TXT records of the paired hosts the browser saw (their control features); strangers' are not kept.
    private let discoveryInfo = Mutex<[PeerID: [String: String]]>([:])
    /// The lines that say which other hosts a search found: the first `freeSightingLines` as they come, then one each
    /// 10 s at most, saying how many it sums up — announcements under ever-new keys cannot fill the log.
    private let sightingLines = Mutex((logged: 0, throttle: LogThrottle<Int>(interval: 10_000_000_000)))
    /// How many sighting lines are logged before they are throttled.
    static let freeSightingLines = 16
    /// How long a host has to answer an invitation: enough for its operator to compare the check code and say yes
    /// (`--accept ask`), and the most a host waits for its app (`NearbyServiceAdvertiser.maximumInvitationWait`).
    static let answerTimeout: Duration = .seconds(60)
    /// How long an invitation may take to reach a host (connect, handshake, the host's first frame).
    static let reachTimeout: Duration = .seconds(5)
    /// Whether a pipeline of this run has carried audio from a host: every sink asked for after that is a
    /// `formatChange` (the control queue's; an atomic for `Sendable`).
    private let carriedAudio = Atomic<Bool>(false)
    /// Whether the clip being recorded is one this player asked for (it beeps when it is saved).
    private let ownsClip = Atomic<Bool>(false)
    /// Push-to-talk: the capture chain of the talk input (talk input → packetize → send), and where it goes now
    /// (the host, while talk is on; nobody otherwise, and then nothing is packetized).
    private let talkCapture: CapturePipeline<[PeerID]>?
    private let talkTarget: Audience
    /// Whether the listener's latest talk command was "on" (the control queue's; an atomic for `Sendable`).
    private let talkWanted = Atomic<Bool>(false)

    /// The format push-to-talk travels in: what a host's talkback plays (`RelayHost.Configuration.talk`).
    public static let talkFormat = AudioFormat.default

    /// A talk source in another format than `talkFormat`.
    public struct TalkFormatError: Error, Sendable, Equatable, CustomStringConvertible {
        /// What the source produces.
        public let format: AudioFormat
        public var description: String {
            "push-to-talk must be \(RelayPlayer.talkFormat), not \(format): the host plays talk in that format only"
        }
    }

    /// Throws `TalkFormatError` for a talk source in another format than `talkFormat`, or what making the session
    /// throws.
    /// - Parameters:
    ///   - log: one human-readable line per event.
    ///   - onGiveUp: called once, with the reason, when joining cannot succeed (direct connects exhausted before
    ///     the first join, not paired, declined, a name that does not resolve before the first join) or playing
    ///     cannot go on (the output device failed or stopped taking audio, the output file could not be written);
    ///     the reason is not also logged. It, `log` and `makeSink` run on the player's control queue; they may call
    ///     `stop()`.
    public init(configuration: Configuration, makeSink: @escaping SinkFactory,
                log: @escaping @Sendable (String) -> Void = { _ in },
                onGiveUp: @escaping @Sendable (String) -> Void = { _ in }) throws {
        self.configuration = configuration
        self.makeSink = makeSink
        self.log = log
        self.onGiveUp = onGiveUp
        peer = configuration.identity.peerID
        // The host sends control messages (≤ 267 bytes) and audio, nothing else: no file transfers into $TMPDIR.
        var sessionConfiguration = Session.Configuration(peerTimeout: configuration.peerTimeout, bindHost: configuration.bindHost,
                                                         maximumMessageSize: RelayHost.maximumControlMessageSize,
                                                         maximumResourceSize: 0, topology: .star)
        sessionConfiguration.datagramDelivery = .reader
        // A host that asks its operator (`--accept ask`) holds the invitation while a person compares the check
        // code: its answer may take up to `answerTimeout`. Reaching it may not: an address where nothing answers
        // fails in `reachTimeout`, as every invitation did before.
        sessionConfiguration.reachTimeout = Self.reachTimeout
        let session = try Session(securityIdentity: configuration.identity, encryptionPreference: configuration.encryption,
                                  configuration: sessionConfiguration)
        self.session = session
        packets = SessionPackets(reader: session.datagramReader!, arrivals: arrivals)
        if case .discover = configuration.target {
            browser = try NearbyServiceBrowser(peer: peer, serviceType: configuration.serviceType, discovery: configuration.discovery)
        } else {
            browser = nil
        }
        join = Mutex(JoinStateMachine(target: configuration.target, maximumAttempts: configuration.maximumConnectAttempts,
                                      inviteTimeoutNanos: Self.answerTimeout.nanoseconds))
        let target = Audience()
        talkTarget = target
        talkCapture = try configuration.talkSource.map { source in
            // The host's talkback pipeline plays one format: talk in another would reach it as packets it drops
            // (counted as format mismatches), and the host would hear nothing while the player shows TALKING.
            guard source.format == Self.talkFormat else { throw TalkFormatError(format: source.format) }
            return try CapturePipeline(source: source, withAudience: { use in target.withPeers(use) }, send: { bytes, peers in
                peers.count - session.sendDatagram(bytes, toConnected: peers)
            })
        }
        control.setSpecific(key: onControlKey, value: true)
        session.delegate = self
        browser?.delegate = self
    }

    /// Runs `body` on the control queue and waits for it — or at once when called there already: `log`, `onGiveUp`
    /// and `makeSink` run on it, and an app may well stop (or restart) the player from them.
    private func onControl<T>(_ body: () throws -> T) rethrows -> T {
        if DispatchQueue.getSpecific(key: onControlKey) == true { return try body() }
        return try control.sync(execute: body)
    }

    /// Builds the playback chain, starts the sink (it plays silence until audio arrives) and starts joining.
    public func start() throws {
        started.store(monotonicNow(), ordering: .releasing)
        warnOfSharedPairedName()
        try onControl { try buildPipeline(configuration.initialFormat) }
        try browser?.startBrowsingForPeers()
        ticking.store(true, ordering: .releasing)
        // Join actions all run on the control queue, one at a time.
        onControl { perform(join.withLock { $0.start(now: monotonicNow()) }) }
        scheduleTick()
        try talkCapture?.start()
    }

    /// Says goodbye to the host, stops the sink (a WAV file is finalized) and the threads reading datagrams, and stops
    /// browsing.
    public func stop() {
        ticking.store(false, ordering: .releasing)
        talkTarget.publish([])
        talkCapture?.stop()
        join.withLock { $0.stop() }
        browser?.stopBrowsingForPeers()
        // Goodbye first (the host hears it at once, even if the device then hangs in closing); the session's socket
        // is closed last, once the threads that read it (the sink's, or pm-net) have stopped: a descriptor number
        // closed while one of them still polls it could be reused by anything.
        for peer in session.connectedPeers { session.disconnect(peer) }
        onControl { playout.replace(with: nil) }?.stop()
        pump.withLock { $0 }?.stop()
        session.disconnect()
    }

    /// A snapshot of every counter.
    public var statistics: Statistics {
        var s = Statistics()
        s.phase = join.withLock { $0.phase }
        let host = self.host.withLock { $0 }
        s.host = host
        s.hostName = host.map { h in join.withLock { $0.name(of: h) } }
        s.framesReceived = arrivals.framesReceived.load(ordering: .relaxed)
        playout.withCurrent { pipeline in
            guard let pipeline else { return }
            s.playout = pipeline.stats
            s.device = pipeline.sink.stats
            s.format = pipeline.format
        }
        s.seen = seen.withLock { Array($0.values) }.sorted { $0.name < $1.name }
        let a = accounting.withLock { $0 }
        s.concealedFrames = s.playout.concealedFrames &- min(a.waitingConcealed, s.playout.concealedFrames)
        s.concealedMilliseconds = Double(s.concealedFrames) * 1000 / Double(s.format.sampleRate)
        s.waitingMilliseconds = Double(a.waitingFrames) * 1000 / Double(s.format.sampleRate)
        s.sanitizedSamples = s.playout.sanitizedSamples
        (s.hostControl, s.malformedControl) = remote.withLock { ($0.host, $0.malformed) }
        s.volumeDB = controls.volumeDB
        s.muted = controls.muted
        s.pausedMilliseconds = Double(s.playout.heldFrames) * 1000 / Double(s.format.sampleRate)
        s.talking = !talkTarget.peers.isEmpty
        s.talkPacketsSent = talkCapture?.statistics.packetsSent ?? 0
        let st = session.statistics
        s.unauthenticDatagrams = st.unauthenticDatagrams
        s.datagrams = st.datagramsReceived
        s.strangerDatagrams = st.strangerDatagrams
        s.malformedDatagrams = st.malformedDatagrams
        if let h = host, let rtt = session.roundTripTime(to: h) {
            s.roundTripMilliseconds = Double(rtt.components.seconds) * 1000 + Double(rtt.components.attoseconds) / 1e15
        }
        let first = arrivals.firstAudio.load(ordering: .acquiring)
        if first != 0 {
            s.firstAudioSeconds = Double(first &- started.load(ordering: .acquiring)) / 1e9
            s.mouthToEarMilliseconds = (s.roundTripMilliseconds ?? 0) / 2 + s.playout.playoutLatencyMilliseconds
                + s.playout.hostLatencyMilliseconds
        }
        return s
    }

    // MARK: Pipeline (control queue only)

    /// Builds and starts a pipeline for `format`, swaps it in, then stops the one it replaces. A pipeline that never
    /// carried audio from a host (the one built before the first packet) is stopped first instead. The new sink is
    /// `fresh` (a file output written at its own path) until some pipeline of this run has carried audio, and
    /// `formatChange` (a numbered path: what was recorded is never overwritten) from then on.
    private func buildPipeline(_ format: AudioFormat) throws {
        if playout.withCurrent({ $0 != nil }) {
            if arrivals.inPipeline.load(ordering: .acquiring) {
                carriedAudio.store(true, ordering: .relaxed)
            } else {
                playout.replace(with: nil)?.stop()
            }
        }
        let request: SinkRequest = carriedAudio.load(ordering: .relaxed) ? .formatChange : .fresh
        arrivals.inPipeline.store(false, ordering: .releasing)
        let sink: any AudioSink
        do { sink = try makeSink(format, request) } catch where Self.heldByAnother(error) && playout.withCurrent({ $0 != nil }) {
            // An output that one client at a time may hold (an ALSA `hw:` device, a card without dmix) is held by
            // the pipeline being replaced: free it (the old format's packets have stopped coming) and ask once more.
            playout.replace(with: nil)?.stop()
            sink = try makeSink(format, request)
        }
        let pipeline = try PlayoutPipeline(format: format, configuration: .init(mode: configuration.latency),
                                           sink: sink, controls: controls, readingInput: sink.servesInput)
        if sink.servesInput {
            try pipeline.start(reading: packets)
        } else {
            try pipeline.start()
            try startPump()
        }
        // A device thread refused real-time priority: said once a run, with what to do (the audio still flows).
        if let note = sink.schedulingNote, !schedulingNoted.exchange(true, ordering: .relaxed) { log(note) }
        playout.replace(with: pipeline)?.stop()
    }

    /// Whether opening an output failed only because another client holds it (ALSA's EBUSY): worth asking again once
    /// it is free, unlike a format the output refuses.
    private static func heldByAnother(_ error: any Error) -> Bool { (error as? ALSAError)?.kind == .busy }

    /// Starts the `pm-net` thread that reads datagrams into the current pipeline, for sinks that do not (once).
    private func startPump() throws {
        try pump.withLock { pump in
            guard pump == nil else { return }
            let playout = self.playout, arrivals = self.arrivals
            let started = DatagramPump(reader: packets.reader) { bytes, now in
                arrivals.note(playout.withCurrent { $0?.receive(bytes, arrivalNanos: now) }, at: now)
            }
            try started.start()
            pump = started
        }
    }

    // MARK: Remote control

    /// Asks the host for `command` (pause, resume, capture, talk). The outcome is one event line: the host's answer,
    /// or why it was not sent (the host does not offer it, or no host is joined).
    public func send(_ command: PlayerCommand) {
        control.async { [self] in request(command) }
    }

    /// Push-to-talk's toggle (a key, a headset button): talk off if push-to-talk is on (`talkRequested`), else on.
    /// Decided on the control queue, in turn with the commands before it, so that presses made while it is busy
    /// alternate as they were made.
    public func toggleTalk() {
        control.async { [self] in request(.talk(!talkWanted.load(ordering: .relaxed))) }
    }

    /// The control queue: `send`'s work.
    private func request(_ command: PlayerCommand) {
        let host = self.host.withLock { $0 }
        let action: PlayerControl.Action
        if host == nil {
            action = .refused(command, "not joined to a host")
        } else if case .talk(true) = command, talkCapture == nil, remote.withLock({ $0.features.contains(.talk) }) {
            action = .refused(command, "this player has no talk input (mesh-play --talk-device DEV or --talk-input SRC)")
        } else if case .talk(true) = command, let fault = configuration.talkSource?.fault {
            action = .refused(command, "the talk input ended: \(fault)")
        } else {
            // Talk off stops sending at once, before the host answers; and whichever the listener asked for
            // last is what an answer may act on. Talk on counts as asked for once it is sent.
            if case .talk(false) = command {
                talkWanted.store(false, ordering: .relaxed)
                talkTarget.publish([])
            }
            action = remote.withLock { $0.request(command, now: monotonicNow()) }
            if case .talk(true) = command, case .send = action { talkWanted.store(true, ordering: .relaxed) }
        }
        performControl([action], host: host)
    }

    /// The control queue: what the control state machine decided.
    private func performControl(_ actions: [PlayerControl.Action], host: PeerID?) {
        for action in actions {
            switch action {
            case .send(let bytes, let id):
                do {
                    guard let host else { throw PeerMeshError.notConnected("not joined to a host") }
                    try session.send(Data(bytes), toPeers: [host], with: .reliable)
                } catch {
                    // No answer will come: the command is settled now (push-to-talk turned off, if it asked for it).
                    performControl(remote.withLock { $0.notSent(id: id, because: "\(error)") }, host: host)
                }
            case .refused(let command, let why):
                log("\(command): not sent: \(why)")
            case .answered(let command, let reply):
                if case .capture = command, reply == .recording { ownsClip.store(true, ordering: .relaxed) }
                // The answer to the listener's latest talk command (an earlier one's is `superseded`). Accepted: the
                // talk input goes to the host from the next chunk; but if the listener turned talk off since and that
                // could not be sent (its command budget), the host is told now, so that it frees the floor. Refused
                // (busy: another player talks): push-to-talk is off again, and nothing goes to the host.
                if case .talk(true) = command {
                    if reply != .ok {
                        talkWanted.store(false, ordering: .relaxed)
                        talkTarget.publish([])
                    } else if talkWanted.load(ordering: .relaxed) {
                        if let host { talkTarget.publish([host]) }
                    } else {
                        performControl([remote.withLock { $0.releaseTalk() }], host: host)
                    }
                }
                log("\(command): \(reply)")
            case .superseded(let command, let reply):
                // Said as any answer; what it means for talking is the later command's answer's to decide.
                log("\(command): \(reply)")
            case .stateChanged(let state, let previous):
                controls.held = state.paused
                if previous?.paused != state.paused, previous != nil || state.paused {
                    let talking = !talkTarget.peers.isEmpty
                    log(state.paused ? (talking ? "talking: the host holds its audio meanwhile (half duplex)"
                                                : "paused (the host holds this player's audio)") : "playing")
                }
                // The host's talkback output ended: it released this player if it talked; nothing more is sent.
                if previous?.features.contains(.talk) == true, !state.features.contains(.talk) {
                    let talked = talkWanted.exchange(false, ordering: .relaxed)
                    talkTarget.publish([])
                    log("the host's talkback ended\(talked ? "; push-to-talk is off" : "")")
                }
                if previous?.muted != state.muted, previous != nil || state.muted {
                    log(state.muted ? "the host muted its microphone" : "the host unmuted its microphone")
                }
                if previous?.capture != state.capture, previous != nil {
                    switch state.capture {
                    case .saved, .failed:
                        log("clip \(state.capture)")
                        if ownsClip.exchange(false, ordering: .relaxed), configuration.beep { controls.beep() }
                    case .recording, .armed, .off:
                        break
                    }
                }
            case .malformed(let why):
                if let held = ignoredLines.withLock({ $0.admit(0, now: MonotonicClock.nowNanos()) }) {
                    log("control: ignored a message from the host: \(why)" + (held > 0 ? " (and \(held) more since the last such line)" : ""))
                }
            }
        }
    }

    // MARK: Join driver

    private func perform(_ actions: [JoinStateMachine.Action]) {
        // Actions queued before stop() must not invite or connect after it.
        guard ticking.load(ordering: .acquiring) else { return }
        for a in actions {
            switch a {
            case .announce(let text): log(text)
            case .invite(let host):
                do { try browser?.invitePeer(host, to: session, withContext: nil, timeout: Self.answerTimeout) } catch {
                    let more = join.withLock { $0.invitationFailed(host, reason: "\(error)", now: monotonicNow()) }
                    perform(more)
                }
            case .connect(let endpoint):
                // A name's lookup may take seconds (a `.local` host that is away, tried every 2 s): it runs on a queue
                // of its own, so that the control queue serves the listener's commands, the ticks and `stop()`
                // meanwhile. One at a time: an attempt made while a lookup still runs (only after the machine's
                // safety deadline) takes that lookup's outcome, its failure or its connection.
                guard !connecting.exchange(true, ordering: .acquiringAndReleasing) else {
                    log("still looking up \(endpoint.host); this attempt waits for it")
                    continue
                }
                connector.async { [self] in
                    // stop() may have come while this waited: a stopped player opens no link. One opened as stop()
                    // came is closed either here or by stop(): the session's lock orders this invitation's start
                    // against stop()'s disconnects, which come after it clears `ticking`.
                    var failure: PeerMeshError?
                    if ticking.load(ordering: .acquiring) {
                        do throws(PeerMeshError) { try session.connect(to: endpoint, timeout: Self.answerTimeout) } catch {
                            failure = error
                        }
                        if !ticking.load(ordering: .acquiring) { session.disconnect() }
                    }
                    connecting.store(false, ordering: .releasing)
                    guard let failure else { return }
                    let unresolvable = if case .unresolvable = failure { true } else { false }
                    control.async { [self] in
                        let more = join.withLock {
                            $0.invitationFailed(nil, reason: "\(failure)", unresolvable: unresolvable, now: monotonicNow())
                        }
                        perform(more)
                    }
                }
            case .giveUp(let why):
                giveUp(why)
            }
        }
    }

    /// Whether push-to-talk is on as far as the listener is concerned: asked for, and neither turned off, refused by
    /// the host, nor ended with the host's visit or the talk input. A toggle (a key, a headset button) flips this.
    public var talkRequested: Bool { talkWanted.load(ordering: .relaxed) }

    /// Push-to-talk off without the listener asking (its talk input ended; the control queue): nothing more is sent,
    /// and a host that gave this player the floor, or is about to, is told `talk off` so that it frees it and stops
    /// holding this player's audio (the `talk off: ok` answer is logged as any other).
    private func releaseTalk() {
        talkTarget.publish([])
        guard talkWanted.exchange(false, ordering: .relaxed), let host = host.withLock({ $0 }) else { return }
        performControl([remote.withLock { $0.releaseTalk() }], host: host)
    }

    /// Ticks come every 50 ms while the player searches or joins (retries and backoffs are timed by them), every
    /// 250 ms once it plays: then they only account concealment and notice a new host format.
    private func scheduleTick() {
        let joined: Bool
        if case .joined = join.withLock({ $0.phase }) { joined = true } else { joined = false }
        control.asyncAfter(deadline: .now() + .milliseconds(joined ? 250 : 50)) { [weak self] in
            guard let self, self.ticking.load(ordering: .acquiring) else { return }
            self.tick()
            self.scheduleTick()
        }
    }

    /// Hands the reason to `onGiveUp`, the first time only. Said once, by whoever handles the end (mesh-play prints
    /// it as its exit line).
    private func giveUp(_ why: String) {
        guard !gaveUp.exchange(true, ordering: .acquiringAndReleasing) else { return }
        onGiveUp(why)
    }

    private func tick() {
        perform(join.withLock { $0.tick(now: monotonicNow()) })
        account()
        // An output that ended on its own (its sound server died, the disk filled) plays nothing more.
        if let fault = playout.withCurrent({ $0?.sink.fault }) {
            giveUp("playback ended: \(fault)")
        }
        // Push-to-talk is a side channel: playback goes on without it, and the player says so once — and lets go of
        // the floor, so that the host neither keeps it as the talker nor holds its audio for nothing.
        if let fault = configuration.talkSource?.fault, !talkInputEnded.exchange(true, ordering: .acquiringAndReleasing) {
            log("talk input ended: \(fault); push-to-talk is off")
            releaseTalk()
        }
        // The decoder is made when the first Opus packet arrives. A player that cannot make it (libopus is missing)
        // plays nothing of this host: it ends, and says why.
        if let why = playout.withCurrent({ $0?.opusFailure }) {
            giveUp("the host sends Opus, which this player cannot decode: \(why)")
        }
        // A host with another format: build a pipeline for it here, off the network thread — as often as the
        // limiter allows (a host that flaps formats would otherwise rebuild playback, and reopen its file, each time).
        if let f = playout.withCurrent({ $0?.takePendingFormat() }) {
            switch formatChanges.withLock({ $0.request(f, now: monotonicNow()) }) {
            case .allow:
                log("host sends \(f); reopening playback")
                do { try buildPipeline(f) } catch {
                    // A format the output refused is not tried again (its packets are dropped and counted as another
                    // format); one it could not open because another program holds the device is, as the host's
                    // packets ask again (at the limiter's pace).
                    if !Self.heldByAnother(error) { formatChanges.withLock { $0.cannotPlay(f) } }
                    log("cannot play \(f): \(error); its packets are dropped")
                    // The pipeline before was stopped for it: put one back in the format the player started with, so
                    // that packets are still read (and counted) and a later format can still be played. With none,
                    // nothing would be read or played: the player ends, saying why.
                    if playout.withCurrent({ $0 == nil }) {
                        do { try buildPipeline(configuration.initialFormat) } catch { giveUp("cannot reopen playback: \(error)") }
                    }
                }
            case .refuseAndSay:
                log("host switches to \(f) too often; ignoring it (its packets are dropped) and playing on")
            case .refuse:
                break
            }
        }
    }

    /// Attributes the concealment and playback since the last tick: to the stream while joined with audio, else to
    /// waiting (no host to conceal for).
    private func account() {
        let (concealed, played) = playout.withCurrent { ($0?.stats.concealedFrames ?? 0, $0?.sink.stats.framesOut ?? 0) }
        let streaming: Bool
        if case .joined = join.withLock({ $0.phase }), arrivals.sinceJoin.load(ordering: .acquiring) { streaming = true } else { streaming = false }
        accounting.withLock { a in
            // A new pipeline (format change) starts its counters at 0.
            let dc = concealed >= a.lastConcealed ? concealed - a.lastConcealed : concealed
            let dp = played >= a.lastPlayed ? played - a.lastPlayed : played
            if concealed < a.lastConcealed { a.waitingConcealed = 0 }
            a.lastConcealed = concealed
            a.lastPlayed = played
            if !streaming {
                a.waitingConcealed &+= dc
                a.waitingFrames &+= dp
            }
        }
    }

    // MARK: Delegates

    public func session(_ session: Session, peer: PeerID, didChange state: SessionState) {
        host.withLock { host in
            if state == .connected { host = peer } else if host == peer { host = nil }
        }
        if state != .connecting {
            arrivals.sinceJoin.store(false, ordering: .releasing)
            unanswered.withLock { _ = $0.byHost.removeValue(forKey: peer) }
        }
        // Trust follows the key: the paired entry notes when the host was last seen and the name it gave (the name
        // it was paired under stays).
        var pairedName: String?
        if state == .connected, case .paired(let store) = configuration.hosts, let key = peer.publicKey {
            pairedName = (try? store.touch(key, name: peer.displayName))??.name
        }
        let actions = join.withLock { $0.sessionState(peer, state, pairedName: pairedName, now: monotonicNow()) }
        let info = discoveryInfo.withLock { $0[peer] }
        control.async {
            switch state {
            case .connected:
                self.remote.withLock { r in
                    r.joined()
                    r.discovered(info)
                }
            case .notConnected:
                let left = self.remote.withLock { $0.left() }
                self.talkTarget.publish([])
                // Push-to-talk was the host's to grant: a new host, or this one back, starts with it off.
                self.talkWanted.store(false, ordering: .relaxed)
                self.controls.held = false
                self.ownsClip.store(false, ordering: .relaxed)
                self.performControl(left, host: nil)
            case .connecting:
                break
            }
            self.perform(actions)
        }
    }

    public func session(_ session: Session, didReceive data: Data, fromPeer peer: PeerID) {
        let bytes = Array(data)
        control.async {
            guard self.host.withLock({ $0 }) == peer else { return }
            self.performControl(self.remote.withLock { $0.received(bytes) }, host: peer)
        }
    }

    /// Datagrams reach the player through its session's reader, on the sink's thread (`SessionPackets`); the delegate
    /// would hear only a relayed peer's, and a player's session is a star: it has none. Ignored.
    public func session(_ session: Session, didReceiveDatagramBytes raw: UnsafeRawBufferPointer, fromPeer peer: PeerID) {}

    public func session(_ session: Session, invitationTo peer: PeerID?, failedWith reason: DeclineReason, detail: String) {
        let name = peer.map { p in join.withLock { $0.name(of: p) } } ?? "the host"
        let message: String
        switch reason {
        case .notTrusted: message = "\(name): not paired; pair with mesh-play --pair CODE"
        case .declined: message = "\(name) declined: \(detail)"
        default: message = detail
        }
        // Nothing answered at the advertised address (our own connect failed: refused, no route): the record may be
        // a killed host's. A decline or a timeout came from a live host, and is retried with backoff instead.
        let unreachable = reason == .unavailable && detail.hasPrefix("cannot connect to")
        let actions = join.withLock {
            $0.invitationFailed(peer, reason: message, permanent: reason.isPermanent, unreachable: unreachable,
                                alreadyConnected: reason == .alreadyConnected, now: monotonicNow())
        }
        control.async { self.perform(actions) }
    }

    /// Whether this player may join the host with `key`. A trust store that cannot be read trusts nobody, and the log
    /// says why.
    private func trusts(_ key: PublicKey?) -> Bool { trust(of: key).trusted }

    /// What the trust store says of a host with `key`: whether this player may join it, the name it was paired under
    /// (nil when the player joins any host), and whether some host was paired under the name `--host` asks for.
    private func trust(of key: PublicKey?) -> (trusted: Bool, pairedName: String?, nameIsPaired: Bool) {
        switch configuration.hosts {
        case .any: return (true, nil, false)
        case .paired(let store):
            do {
                let entries = try store.list()
                let entry = key.flatMap { k in entries.first { $0.publicKey == k } }
                var nameIsPaired = false
                if case .discover(let wanted?) = configuration.target {
                    nameIsPaired = !TrustStore.entries(pairedUnder: wanted, in: entries).isEmpty
                }
                return (entry != nil, entry?.name, nameIsPaired)
            } catch {
                log("\(error); no host counts as paired")
                return (false, nil, false)
            }
        }
    }

    public func session(_ session: Session, didReceiveCertificate certificate: PeerCertificate, fromPeer peer: PeerID,
                        certificateHandler: @escaping @Sendable (Bool) -> Void) {
        // Pinned by key: a host that is not paired is not joined, whatever its name.
        let trusted = trusts(certificate.publicKey)
        certificateHandler(trusted)
        guard trusted else { return }
        // A host that does not let this player in at once may be asking its operator (`--accept ask`), or have the
        // request queued behind another's: after a moment, say that this player waits (and the code, once known).
        let attempt = unanswered.withLock { w -> Int in
            w.attempts += 1
            w.byHost[peer] = Waiting(attempt: w.attempts)
            return w.attempts
        }
        control.asyncAfter(deadline: .now() + Self.answerPatience) { [weak self] in
            guard let self else { return }
            let code = unanswered.withLock { w -> String?? in
                guard w.byHost[peer]?.attempt == attempt else { return nil }
                w.byHost[peer]?.said = true
                return .some(w.byHost[peer]?.code)
            }
            guard let code else { return }
            log("waiting for \(join.withLock { $0.name(of: peer) }) to let this player in"
                + (code.map { "; its operator is asked, the check code there is \($0)" } ?? ""))
        }
    }

    public func session(_ session: Session, didReceiveShortAuthenticationString digits: String, fromPeer peer: PeerID) {
        // The host's app opened its share of the digits: its operator is being shown them (`--accept ask`), or this
        // player is being let in. This side shows the same ones when it says it waits, so that the person there can
        // tell this player's request from anyone else's; if it already said so without them, it says them now.
        let alreadySaid = unanswered.withLock { w -> Bool in
            guard w.byHost[peer] != nil else { return false }
            w.byHost[peer]?.code = digits
            return w.byHost[peer]?.said == true
        }
        if alreadySaid {
            log("\(join.withLock { $0.name(of: peer) })'s operator is asked now; the check code there is \(digits)")
        }
    }

    /// A trust store written before paired names were kept unique may hold two hosts paired under the name `--host`
    /// asks for: say so, and how to choose one.
    private func warnOfSharedPairedName() {
        guard case .discover(let wanted?) = configuration.target, case .paired(let store) = configuration.hosts,
              let entries = try? store.list() else { return }
        let named = TrustStore.entries(pairedUnder: wanted, in: entries)
        guard named.count > 1 else { return }
        log("\(named.count) paired hosts are named \"\(wanted)\" (\(named.map(\.publicKey.shortFingerprint).joined(separator: ", "))): "
            + "the first found is joined; give --host a fingerprint to choose, or --forget one and pair it again")
    }

    /// A host this player waits on (`unanswered`): which attempt, whether the player said so, and the check code.
    private struct Waiting {
        let attempt: Int
        var said = false
        var code: String?
    }

    /// The hosts this player waits on, and a counter that tells one attempt's timer from the next one's.
    private struct Unanswered {
        var byHost: [PeerID: Waiting] = [:]
        var attempts = 0
    }

    /// How long a host may take to answer before the player says it is waiting, and shows the check code.
    static let answerPatience: DispatchTimeInterval = .seconds(1)

    public func browser(_ browser: NearbyServiceBrowser, foundPeer peer: PeerID, withDiscoveryInfo info: [String: String]?) {
        let (trusted, pairedName, nameIsPaired) = trust(of: peer.publicKey)
        if trusted { discoveryInfo.withLock { $0[peer] = info } }
        let sighting = SeenHost(peer: peer, trusted: trusted, pairedName: pairedName)
        let firstSighting = seen.withLock { $0.updateValue(sighting, forKey: peer) == nil }
        // While searching, say once what else is out there: a wrong --host or a missing pairing is seen at once.
        if firstSighting, case .discover(let wanted) = configuration.target {
            let alias = pairedName.flatMap { $0 == peer.displayName ? nil : " (calls itself \"\(peer.displayName)\")" } ?? ""
            var line: String?
            if let wanted, !JoinStateMachine.matches(peer, pairedName: pairedName, name: wanted, nameIsPaired: nameIsPaired) {
                line = "found host \(sighting.name)\(alias), not \"\(wanted)\"; still searching"
            } else if !trusted {
                line = "found host \(peer.displayName) (not paired; pair with mesh-play --pair CODE); still searching"
            }
            if let line, let held = admitSightingLine() {
                log(line + (held > 0 ? " (and \(held) more hosts since the last such line)" : ""))
            }
        }
        guard trusted else { return }
        let actions = join.withLock { $0.found(peer, pairedName: pairedName, nameIsPaired: nameIsPaired, now: monotonicNow()) }
        control.async { self.perform(actions) }
    }

    /// How many hosts' TXT records are kept (tests).
    var discoveryInfoCount: Int { discoveryInfo.withLock { $0.count } }

    /// Whether a sighting line may go out now: nil to hold it back, else how many were held back before it.
    private func admitSightingLine() -> Int? {
        sightingLines.withLock { lines in
            guard lines.logged >= Self.freeSightingLines else {
                lines.logged += 1
                // The last free line opens the throttle's first interval.
                if lines.logged == Self.freeSightingLines { _ = lines.throttle.admit(0, now: MonotonicClock.nowNanos()) }
                return 0
            }
            return lines.throttle.admit(0, now: MonotonicClock.nowNanos())
        }
    }

    public func browser(_ browser: NearbyServiceBrowser, lostPeer peer: PeerID) {
        seen.withLock { _ = $0.removeValue(forKey: peer) }
        discoveryInfo.withLock { _ = $0.removeValue(forKey: peer) }
        let actions = join.withLock { $0.lost(peer) }
        control.async { self.perform(actions) }
    }

    public func browser(_ browser: NearbyServiceBrowser, didNotStartBrowsingForPeers error: PeerMeshError) {
        log("browsing failed: \(error)")
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds.
func monotonicNow() -> UInt64 { MonotonicClock.nowNanos() }
