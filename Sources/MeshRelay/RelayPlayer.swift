import Foundation
import MeshAudio
import MeshPipeline
import PeerMesh
import Synchronization
import MeshPOSIX

/// The playback side of the relay: finds a host (DNS-SD or a direct address), joins its session, and plays what
/// it sends. When the host goes away it says so, searches again and rejoins by itself.
///
/// The chain is MeshPipeline's `PlayoutPipeline` (ingress → jitter buffer → conceal → drift/resample → sink); the
/// player gives it the sink, built for the host's format by `makeSink`, and hands it each datagram on the session's
/// I/O thread without taking a lock. When the host switches format, the pipeline reports it and the control queue
/// builds a new one and swaps it in.
public final class RelayPlayer: SessionDelegate, NearbyServiceBrowserDelegate, Sendable {
    /// What the player needs to run.
    public struct Configuration: Sendable {
        /// Where the host is.
        public var target: JoinTarget
        /// The service type browsed.
        public var serviceType: String = "mesh-audio"
        /// The player's display name.
        public var name: String
        /// Jitter-buffer policy (`--latency`).
        public var latency: JitterBuffer.Mode = .auto
        /// Discovery backend; `nil` means Avahi.
        public var discovery: (any DiscoveryBackend)?
        /// Host silent this long is gone.
        public var peerTimeout: Duration = .seconds(2)
        /// Direct connects in a row before giving up.
        public var maximumConnectAttempts: Int = 5
        /// The format assumed before the first packet says otherwise.
        public var initialFormat: AudioFormat = .default

        public init(target: JoinTarget, name: String, serviceType: String = "mesh-audio",
                    latency: JitterBuffer.Mode = .auto, discovery: (any DiscoveryBackend)? = nil) {
            self.target = target
            self.name = name
            self.serviceType = serviceType
            self.latency = latency
            self.discovery = discovery
        }
    }

    /// A snapshot for the status line and `--json`.
    public struct Statistics: Sendable {
        public var phase: JoinStateMachine.Phase = .searching
        public var host: PeerID?
        public var playout = PlayoutStats()
        public var device = AudioStats()
        public var roundTripMilliseconds: Double?
        /// Network one-way (half the RTT) + jitter buffer + both devices' delays.
        public var mouthToEarMilliseconds: Double?
        public var datagrams: UInt64 = 0
        public var strangerDatagrams: UInt64 = 0
        public var malformedDatagrams: UInt64 = 0
        /// Seconds from `start()` to the first datagram of audio, or nil before.
        public var firstAudioSeconds: Double?
        /// Frames of audio that arrived from hosts (before the jitter buffer).
        public var framesReceived: UInt64 = 0
        public var format: AudioFormat = .default
    }

    /// Builds the sink for a format (an ALSA `Player`, or a `WAVFileSink`).
    public typealias SinkFactory = @Sendable (AudioFormat) throws -> any AudioSink

    public let configuration: Configuration
    public let session: Session
    public let peer: PeerID
    private let makeSink: SinkFactory
    private let browser: NearbyServiceBrowser?
    private let join: Mutex<JoinStateMachine>
    /// The pipeline playing now: read by the datagram path, replaced only on `control`.
    private let playout = CurrentPipeline()
    private let host = Mutex<PeerID?>(nil)
    private let framesReceived = Atomic<UInt64>(0)
    /// When the first audio arrived (0: not yet).
    private let firstAudio = Atomic<UInt64>(0)
    private let control = DispatchQueue(label: "peermesh.relay-player.control")
    private let ticking = Atomic<Bool>(false)
    private let log: @Sendable (String) -> Void
    private let onGiveUp: @Sendable (String) -> Void
    private let started = Atomic<UInt64>(0)

    /// - Parameters:
    ///   - log: one human-readable line per event.
    ///   - onGiveUp: called once when joining cannot succeed (direct connects exhausted).
    public init(configuration: Configuration, makeSink: @escaping SinkFactory,
                log: @escaping @Sendable (String) -> Void = { _ in },
                onGiveUp: @escaping @Sendable (String) -> Void = { _ in }) throws {
        self.configuration = configuration
        self.makeSink = makeSink
        self.log = log
        self.onGiveUp = onGiveUp
        let name = String(decoding: configuration.name.utf8.prefix(PeerID.maximumDisplayNameBytes), as: UTF8.self)
        peer = try PeerID(displayName: name.isEmpty ? "mesh-play" : name)
        session = try Session(peer: peer, configuration: .init(peerTimeout: configuration.peerTimeout))
        if case .discover = configuration.target {
            browser = try NearbyServiceBrowser(peer: peer, serviceType: configuration.serviceType, discovery: configuration.discovery)
        } else {
            browser = nil
        }
        join = Mutex(JoinStateMachine(target: configuration.target, maximumAttempts: configuration.maximumConnectAttempts))
        session.delegate = self
        browser?.delegate = self
    }

    /// Builds the playback chain, starts the sink (it plays silence until audio arrives) and starts joining.
    public func start() throws {
        started.store(monotonicNow(), ordering: .releasing)
        try control.sync { try buildPipeline(configuration.initialFormat) }
        try browser?.startBrowsingForPeers()
        ticking.store(true, ordering: .releasing)
        // Join actions all run on the control queue, one at a time.
        control.sync { perform(join.withLock { $0.start(now: monotonicNow()) }) }
        scheduleTick()
    }

    /// Says goodbye to the host, stops the sink (a WAV file is finalized) and stops browsing.
    public func stop() {
        ticking.store(false, ordering: .releasing)
        join.withLock { $0.stop() }
        browser?.stopBrowsingForPeers()
        session.disconnect()
        control.sync { playout.replace(with: nil) }?.stop()
    }

    /// A snapshot of every counter.
    public var statistics: Statistics {
        var s = Statistics()
        s.phase = join.withLock { $0.phase }
        let host = self.host.withLock { $0 }
        s.host = host
        s.framesReceived = framesReceived.load(ordering: .relaxed)
        playout.withCurrent { pipeline in
            guard let pipeline else { return }
            s.playout = pipeline.stats
            s.device = pipeline.sink.stats
            s.format = pipeline.format
        }
        let st = session.statistics
        s.datagrams = st.datagramsReceived
        s.strangerDatagrams = st.strangerDatagrams
        s.malformedDatagrams = st.malformedDatagrams
        if let h = host, let rtt = session.roundTripTime(to: h) {
            s.roundTripMilliseconds = Double(rtt.components.seconds) * 1000 + Double(rtt.components.attoseconds) / 1e15
        }
        let first = firstAudio.load(ordering: .acquiring)
        if first != 0 {
            s.firstAudioSeconds = Double(first &- started.load(ordering: .acquiring)) / 1e9
            s.mouthToEarMilliseconds = (s.roundTripMilliseconds ?? 0) / 2 + s.playout.playoutLatencyMilliseconds
                + s.playout.hostLatencyMilliseconds
        }
        return s
    }

    // MARK: Pipeline (control queue only)

    /// Builds and starts a pipeline for `format`, swaps it in, then stops the one it replaces.
    private func buildPipeline(_ format: AudioFormat) throws {
        let pipeline = try PlayoutPipeline(format: format, configuration: .init(mode: configuration.latency),
                                           sink: try makeSink(format))
        try pipeline.start()
        playout.replace(with: pipeline)?.stop()
    }

    // MARK: Join driver

    private func perform(_ actions: [JoinStateMachine.Action]) {
        // Actions queued before stop() must not invite or connect after it.
        guard ticking.load(ordering: .acquiring) else { return }
        for a in actions {
            switch a {
            case .announce(let text): log(text)
            case .invite(let host):
                do { try browser?.invitePeer(host, to: session, withContext: nil, timeout: .seconds(5)) } catch {
                    let more = join.withLock { $0.invitationFailed(host, reason: "\(error)", now: monotonicNow()) }
                    perform(more)
                }
            case .connect(let endpoint):
                do { try session.connect(to: endpoint, timeout: .seconds(5)) } catch {
                    let more = join.withLock { $0.invitationFailed(nil, reason: "\(error)", now: monotonicNow()) }
                    perform(more)
                }
            case .giveUp(let why):
                log(why)
                onGiveUp(why)
            }
        }
    }

    private func scheduleTick() {
        control.asyncAfter(deadline: .now() + .milliseconds(50)) { [weak self] in
            guard let self, self.ticking.load(ordering: .acquiring) else { return }
            self.tick()
            self.scheduleTick()
        }
    }

    private func tick() {
        perform(join.withLock { $0.tick(now: monotonicNow()) })
        // A host with another format: build a pipeline for it here, off the network thread.
        if let f = playout.withCurrent({ $0?.takePendingFormat() }) {
            log("host sends \(f); reopening playback")
            do { try buildPipeline(f) } catch { log("cannot play \(f): \(error)") }
        }
    }

    // MARK: Delegates

    public func session(_ session: Session, peer: PeerID, didChange state: SessionState) {
        host.withLock { host in
            if state == .connected { host = peer } else if host == peer { host = nil }
        }
        let actions = join.withLock { $0.sessionState(peer, state, now: monotonicNow()) }
        control.async { self.perform(actions) }
    }

    /// The datagram path (the session's I/O thread): no lock, no allocation.
    public func session(_ session: Session, didReceiveDatagramBytes raw: UnsafeRawBufferPointer, fromPeer peer: PeerID) {
        let now = monotonicNow()
        let outcome = playout.withCurrent { $0?.receive(raw, arrivalNanos: now) }
        guard case .queued(let frames) = outcome else { return }
        framesReceived.wrappingAdd(UInt64(frames), ordering: .relaxed)
        _ = firstAudio.compareExchange(expected: 0, desired: max(1, now), ordering: .acquiringAndReleasing)
    }

    public func session(_ session: Session, invitationTo peer: PeerID?, failedWith reason: DeclineReason, detail: String) {
        let actions = join.withLock { $0.invitationFailed(peer, reason: detail, now: monotonicNow()) }
        control.async { self.perform(actions) }
    }

    public func browser(_ browser: NearbyServiceBrowser, foundPeer peer: PeerID, withDiscoveryInfo info: [String: String]?) {
        let actions = join.withLock { $0.found(peer, now: monotonicNow()) }
        control.async { self.perform(actions) }
    }

    public func browser(_ browser: NearbyServiceBrowser, lostPeer peer: PeerID) {
        let actions = join.withLock { $0.lost(peer) }
        control.async { self.perform(actions) }
    }

    public func browser(_ browser: NearbyServiceBrowser, didNotStartBrowsingForPeers error: PeerMeshError) {
        log("browsing failed: \(error)")
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds.
func monotonicNow() -> UInt64 { MonotonicClock.nowNanos() }
