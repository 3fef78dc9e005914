import MeshAudio
import MeshPipeline
import PeerMesh

// What a host is made with and what it reports: the types `RelayHost` takes and returns.
extension RelayHost {
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
        /// How many clips each player may start (`ClipQuota.default`: 4 at once, then one every 10 s).
        public var clipQuota: ClipQuota = .default
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
        /// Frames those overruns lost, as the capture clock measured them (players conceal them as a gap).
        public var captureOverrunFrames: UInt64 = 0
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
        /// Control messages dropped unanswered because their player sent them faster than its budget (50 a second,
        /// 100 at once), every player together, those that left included.
        public var droppedControl: UInt64 = 0
        /// Clip starts refused because their player was over its clip quota (`Configuration.clipQuota`), every player
        /// together, those that left included.
        public var refusedClips: UInt64 = 0
        /// Callers that spoke and were not admitted (`AdvertiserStatistics.unadmittedHandshakes`).
        public var unadmittedHandshakes: UInt64 = 0
        /// Connections refused because their address had used its ration of tries
        /// (`AdvertiserStatistics.rationedConnections`).
        public var rationedConnections: UInt64 = 0
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
        /// The name it was paired under, when the trust store admitted it (raw text too).
        public var pairedName: String?
        /// The numeric address its invitation came from.
        public var address: String?
        /// The short fingerprint of the key its handshake proved.
        public var fingerprint: String?
        /// Whether the player paused its audio (the host sends it none meanwhile).
        public var paused = false
        /// Whether the player talks back now.
        public var talking = false
        /// Its control messages dropped unanswered because it sent them faster than its budget (50 a second, 100 at
        /// once).
        public var droppedCommands: UInt64 = 0
        /// Its clip starts refused since it joined because it was over its clip quota (`Configuration.clipQuota`).
        public var refusedClips: UInt64 = 0

        /// What to call it: the name it was paired under, else the one it gives.
        public var name: String { pairedName ?? peer.displayName }
        /// The name it gives, when it was paired under another; nil otherwise.
        public var callsItself: String? { pairedName.flatMap { $0 == peer.displayName ? nil : peer.displayName } }
    }
}
