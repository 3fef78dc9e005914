import MeshAudio
import MeshPipeline
import PeerMesh

// What a player is made with and what it reports: the types `RelayPlayer` takes and returns.
extension RelayPlayer {
    /// Which hosts a player joins.
    public enum HostPolicy: Sendable {
        /// Only hosts whose key is in the trust store (paired). The default.
        case paired(TrustStore)
        /// Any host (still encrypted, but not authenticated to anyone you know): for tests and demos.
        case any
    }

    /// What the player needs to run.
    public struct Configuration: Sendable {
        /// Where the host is.
        public var target: JoinTarget
        /// The service type browsed.
        public var serviceType: String = "mesh-audio"
        /// Who the player is: its key pair and the name hosts see.
        public var identity: PeerIdentity
        /// Which hosts it joins.
        public var hosts: HostPolicy
        /// Local address to use ("" = every address, IPv4 and IPv6).
        public var bindHost: String = ""
        /// Jitter-buffer policy (`--latency`).
        public var latency: JitterBuffer.Mode = .auto
        /// Discovery backend; `nil` means Avahi.
        public var discovery: (any DiscoveryBackend)?
        /// Host silent this long is gone.
        public var peerTimeout: Duration = .seconds(2)
        /// Direct connects in a row before giving up, until the first join; after it, a host lost is tried every 2 s
        /// until it is back (`JoinStateMachine`).
        public var maximumConnectAttempts: Int = 5
        /// The format assumed before the first packet says otherwise.
        public var initialFormat: AudioFormat = .default
        /// The session's encryption: `.required` (the default); `.none` only for `scripts/bench`'s comparison (with no
        /// proven key, only `.any` hosts are joined).
        public var encryption: EncryptionPreference = .required
        /// A short local beep confirms a clip the player asked for (`--no-beep` turns it off).
        public var beep = true
        /// Push-to-talk: what the player captures while talk is on (`--talk-device`, `--talk-input`); nil has none.
        /// It must produce `RelayPlayer.talkFormat` (the host plays talk in that format only): `init` refuses another.
        public var talkSource: (any AudioSource)?

        /// The settings most players set; every other one keeps its default.
        public init(target: JoinTarget, identity: PeerIdentity, hosts: HostPolicy, serviceType: String = "mesh-audio",
                    latency: JitterBuffer.Mode = .auto, discovery: (any DiscoveryBackend)? = nil) {
            self.target = target
            self.identity = identity
            self.hosts = hosts
            self.serviceType = serviceType
            self.latency = latency
            self.discovery = discovery
        }
    }

    /// A snapshot for the status line and `--json`.
    public struct Statistics: Sendable {
        /// Where joining stands: searching, joining a host, joined, stopped.
        public var phase: JoinStateMachine.Phase = .searching
        /// The host joined (nil while none is).
        public var host: PeerID?
        /// What to call the host joined: the name it was paired under, else the name it gives (nil while none is
        /// joined). Raw remote text when it is the latter: escape it before printing.
        public var hostName: String?
        /// The playout pipeline's counters and levels (jitter buffer, ingress, drift, concealment).
        public var playout = PlayoutStats()
        /// The output device's counters (frames written, xruns, delay).
        public var device = AudioStats()
        /// The session's latest round-trip time to the host (`Session.roundTripTime(to:)`; nil before one is measured).
        public var roundTripMilliseconds: Double?
        /// Network one-way (half the RTT) + jitter buffer + both devices' delays.
        public var mouthToEarMilliseconds: Double?
        /// Datagrams delivered by the session (audio and control).
        public var datagrams: UInt64 = 0
        /// Well-formed datagrams from an address or token that is not the host's link (dropped by the session).
        public var strangerDatagrams: UInt64 = 0
        /// Datagrams that were not PeerMesh's or not well formed (dropped by the session).
        public var malformedDatagrams: UInt64 = 0
        /// Seconds from `start()` to the first datagram of audio, or nil before.
        public var firstAudioSeconds: Double?
        /// Frames of audio that arrived from hosts (before the jitter buffer).
        public var framesReceived: UInt64 = 0
        /// The format of the pipeline now playing (the host's).
        public var format: AudioFormat = .default
        /// Hosts the browser saw, and whether each is paired (trusted).
        public var seen: [SeenHost] = []
        /// Concealed audio while joined to a host and after its first packet (what loss cost), frames.
        public var concealedFrames: UInt64 = 0
        /// The same in milliseconds.
        public var concealedMilliseconds: Double = 0
        /// Time played with no host (searching, joining, or after the host left), milliseconds: not concealment.
        public var waitingMilliseconds: Double = 0
        /// Samples from the host that had to be clamped or zeroed.
        public var sanitizedSamples: UInt64 = 0
        /// Datagrams that came with a link's token but did not authenticate.
        public var unauthenticDatagrams: UInt64 = 0
        /// The host's control state for this player (nil until it sends one; hosts without control never do).
        public var hostControl: HostControlState?
        /// The listener's volume, dB.
        public var volumeDB: Double = 0
        /// Whether the listener muted its own output.
        public var muted = false
        /// Time played as silence because the host holds this player's audio (paused): not loss, not concealment.
        public var pausedMilliseconds: Double = 0
        /// Control messages from the host that were not valid answers.
        public var malformedControl: UInt64 = 0
        /// Whether talk is on (the host accepted it and the talk input is being sent).
        public var talking = false
        /// Talkback packets sent to the host.
        public var talkPacketsSent: UInt64 = 0
    }

    /// A host the browser saw.
    public struct SeenHost: Sendable, Equatable {
        /// The host as its advertisement names it.
        public var peer: PeerID
        /// Whether its key is in the trust store (paired), or the player joins any host.
        public var trusted: Bool
        /// The name it was paired under (nil when it is not paired, or the player keeps no trust store).
        public var pairedName: String?

        /// What to call it: the name it was paired under, else the one it advertises.
        public var name: String { pairedName ?? peer.displayName }
    }

    /// Why a sink is asked for.
    public enum SinkRequest: Sendable, Equatable {
        /// No sink of this run has carried audio from a host yet: the first, or one replacing such a sink (stopped
        /// first, so a file at the same path may be written again: nothing in it is lost).
        case fresh
        /// A sink of this run has carried audio from a host (a file output must not be truncated: write another one).
        /// The host changed format mid-stream, or its new format could not be played and the player falls back.
        case formatChange
    }

    /// Builds the sink for a format (an ALSA `Player`, or a `WAVFileSink`). A factory that opens a device which
    /// takes one client at a time throws the `ALSAError` (kind `.busy`) as it is: when a pipeline that carried audio
    /// still holds the device, the player frees it and asks once more; otherwise the error stands (and a player left
    /// with no pipeline at all ends, saying why).
    public typealias SinkFactory = @Sendable (AudioFormat, SinkRequest) throws -> any AudioSink
}
