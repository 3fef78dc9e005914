import FoundationEssentials
import MeshPOSIX
import Synchronization

/// How `Session.send` delivers data, as MultipeerConnectivity's `MCSessionSendDataMode`.
public enum SendMode: Sendable, Equatable {
    /// In order, exactly once (TCP). Up to `Session.Configuration.maximumMessageSize` (1 MiB by default).
    case reliable
    /// A UDP datagram: may be lost, never corrupted or duplicated. Up to `Session.maximumDatagramSize` bytes.
    case unreliable
}

/// Receives a session's events. Every method is called on the session's I/O thread, in order, never on the
/// thread that caused the event. Keep the methods short: a slow delegate delays the session's I/O. Never wait there
/// for a thread that may be stopping or releasing a session: that waits for the I/O thread, and both would hang.
public protocol SessionDelegate: AnyObject, Sendable {
    /// `peer` changed state. Each change is reported exactly once, in order.
    func session(_ session: Session, peer: PeerID, didChange state: SessionState)
    /// A reliable message arrived.
    func session(_ session: Session, didReceive data: Data, fromPeer peer: PeerID)
    /// An unreliable datagram arrived.
    func session(_ session: Session, didReceiveDatagram data: Data, fromPeer peer: PeerID)
    /// An unreliable datagram arrived, as bytes valid only during the call: the zero-copy form for hot paths
    /// such as audio. The default implementation copies the bytes into a `Data` and calls the method above.
    func session(_ session: Session, didReceiveDatagramBytes bytes: UnsafeRawBufferPointer, fromPeer peer: PeerID)
    /// An invitation this session sent ended without a connection (declined, timed out, refused…).
    /// `peer` is `nil` for a direct connect that failed before the peer said who it is.
    func session(_ session: Session, invitationTo peer: PeerID?, failedWith reason: DeclineReason, detail: String)
    /// An encrypted link's handshake proved `peer`'s key, as MC's `didReceiveCertificate`: call
    /// `certificateHandler(true)` to let the peer join, `false` to refuse it — now or later, from any thread, once.
    /// Until then the peer stays `connecting` (bounded by the invitation's timeout). The default accepts.
    func session(_ session: Session, didReceiveCertificate certificate: PeerCertificate, fromPeer peer: PeerID,
                 certificateHandler: @escaping @Sendable (Bool) -> Void)
    /// Inviter: the advertiser `peer` opened its share of the short authentication string — its app showed the
    /// digits to a person (`Invitation.revealShortAuthenticationString()`) or let this session in — and they are `digits`
    /// (`123 456`). Someone comparing them with the advertiser's screen (a prompt such as mesh-record's
    /// `--accept ask`) rules out a man in the middle. At most once per handshake, after the certificate check and
    /// before `connected`; never in plaintext, nor for an invitation declined unshown. On a link that connection
    /// data made (an introduction by a member, `connectPeer`), the data already pinned the key, and whoever gave it
    /// chose that key: judge such a peer by its key or by who introduced it, not by these digits (its invitations
    /// are not rationed, docs/PROTOCOL.md §3.2). The default does nothing.
    func session(_ session: Session, didReceiveShortAuthenticationString digits: String, fromPeer peer: PeerID)
    /// `peer` started sending a resource (`sendResource`); `progress` follows it and can cancel it.
    func session(_ session: Session, didStartReceivingResourceWithName name: String, fromPeer peer: PeerID,
                 with progress: ResourceProgress)
    /// A resource from `peer` ended. On success `localURL` is the received file, its SHA-256 verified: move it
    /// during this call (as in MC, what is left there is deleted when the call returns). On failure `localURL` is
    /// nil, nothing of it is left on disk, and `error` says why (`.cancelled`, `.resource`, `.notConnected`).
    func session(_ session: Session, didFinishReceivingResourceWithName name: String, fromPeer peer: PeerID,
                 at localURL: URL?, withError error: PeerMeshError?)
    /// `peer` opened a byte stream to us (`startStream`). Read it from an app thread; the default closes it.
    func session(_ session: Session, didReceive stream: InputByteStream, withName name: String, fromPeer peer: PeerID)
}

/// What an encrypted handshake proved about a peer: the key it holds, and the short authentication string both
/// sides derive from the handshake (people compare it to rule out a man in the middle).
public struct PeerCertificate: Sendable, Equatable {
    /// The peer's long-term public key.
    public let publicKey: PublicKey
    /// Six digits (`123 456`) that are the same on both sides of this handshake, and tell it from another one. Each
    /// side commits to its share before it sees the other's, so a man in the middle can neither search for matching
    /// digits offline nor choose them; and it learns what the advertiser shows only once the advertiser's app has
    /// shown them to a person (`Invitation.revealShortAuthenticationString()`) or let it in, so every guess it makes
    /// costs an invitation a person sees (one chance in 10⁶ each; the advertiser opens its share to at most one caller
    /// a second and rations tries per address: docs/PROTOCOL.md §3.2). That holds where the advertiser's app shows
    /// them at the invitation, before answering: shown only here, in its certificate check, they reach the inviter
    /// once the check says yes.
    ///
    /// On the advertiser's side (`weInvited` false) they are here. The inviter's certificate check comes before the
    /// advertiser has opened its share, so there they are empty: the inviter gets them from
    /// `SessionDelegate.session(_:didReceiveShortAuthenticationString:fromPeer:)`. An inviter that wants people to
    /// compare them approves the certificate and disconnects if they differ.
    public let shortAuthenticationString: String
    /// Where the peer connected from (or was reached at).
    public let address: String?
    /// Whether this side invited (the peer is the advertiser).
    public let weInvited: Bool
}

public extension SessionDelegate {
    func session(_ session: Session, didReceive data: Data, fromPeer peer: PeerID) {}
    func session(_ session: Session, didStartReceivingResourceWithName name: String, fromPeer peer: PeerID,
                 with progress: ResourceProgress) {}
    func session(_ session: Session, didFinishReceivingResourceWithName name: String, fromPeer peer: PeerID,
                 at localURL: URL?, withError error: PeerMeshError?) {}
    func session(_ session: Session, didReceive stream: InputByteStream, withName name: String, fromPeer peer: PeerID) {
        stream.close()
    }
    func session(_ session: Session, didReceiveDatagram data: Data, fromPeer peer: PeerID) {}
    func session(_ session: Session, didReceiveDatagramBytes bytes: UnsafeRawBufferPointer, fromPeer peer: PeerID) {
        self.session(session, didReceiveDatagram: Data(bytes), fromPeer: peer)
    }
    func session(_ session: Session, invitationTo peer: PeerID?, failedWith reason: DeclineReason, detail: String) {}
    func session(_ session: Session, didReceiveCertificate certificate: PeerCertificate, fromPeer peer: PeerID,
                 certificateHandler: @escaping @Sendable (Bool) -> Void) {
        certificateHandler(true)
    }
    func session(_ session: Session, didReceiveShortAuthenticationString digits: String, fromPeer peer: PeerID) {}
}

/// Counters of a session's traffic. Exact: every datagram the session reads lands in one of them.
public struct SessionStatistics: Sendable, Equatable, BitwiseCopyable {
    /// Datagrams sent.
    public var datagramsSent: UInt64 = 0
    /// Datagrams the kernel refused (socket buffer full, or no route): lost before the network.
    public var datagramsNotSent: UInt64 = 0
    /// Datagrams delivered to the delegate.
    public var datagramsReceived: UInt64 = 0
    /// Datagrams that are not PeerMesh's or not well formed.
    public var malformedDatagrams: UInt64 = 0
    /// Well-formed datagrams from an address or token that is not a connected peer's.
    public var strangerDatagrams: UInt64 = 0
    /// Datagrams seen before (network duplication or replay).
    public var duplicateDatagrams: UInt64 = 0
    /// Datagrams whose token and source matched a link but that did not authenticate under its keys.
    public var unauthenticDatagrams: UInt64 = 0
    /// TCP connections closed because they sent bytes that are not frames.
    public var garbageConnections: UInt64 = 0
    /// Protocol violations by peers (garbage, frames out of turn…); each closed that peer's connection.
    public var peerFaults: UInt64 = 0
    /// Invitations whose handshake waited before opening this side's share of the digits (message 3), because
    /// too many earlier ones had opened theirs and were not (or not yet) accepted (docs/PROTOCOL.md §3.2): a man in
    /// the middle that lets them fail, an app that keeps inviting peers that decline, or more than 16 in flight at
    /// once.
    public var pacedInvitations: UInt64 = 0
    /// Introductions by members (MESH_INTRODUCE) that this side did not follow: too many from that member, or from all
    /// members, in flight at once; no room for the peer under `maximumPeers`; or connection data that leads nowhere
    /// (docs/PROTOCOL.md §3.8). Many of them point at a member that has us connect wherever it likes.
    public var introductionsNotFollowed: UInt64 = 0
    /// MESH_INTRO_REQUESTs this member sent: one to each other member each time a peer joined it by a link that no
    /// introduction made, or one made by a member that has left since, even if it came back; and one to each member
    /// an introduced peer's introducer did not know of when it asked (docs/PROTOCOL.md §3.8). In a mesh whose members
    /// all joined its founder, only the founder asks.
    public var introductionsAsked: UInt64 = 0
    /// Those of `introductionsAsked` that filled a gap: a peer came to us by a member's introduction whose request did
    /// not list one of our members (docs/PROTOCOL.md §3.8): two joins crossed, or the member lacks a link we have (one
    /// that dropped, or past the 255 members a request lists); and those asked because a member lost its link to
    /// another and asked us to introduce the two again (MESH_RELINK).
    public var gapIntroductionsAsked: UInt64 = 0
    /// MESH_RELINKs this member sent: one to each other member with a key each time a member's link to us ended
    /// without a GOODBYE (its socket closed under it, it went silent, or the member relaying it left), asking to be
    /// introduced to it again; at most once per 10 s for each peer, a loss within them asked about when they end;
    /// not for a peer this side ended by choice (docs/PROTOCOL.md §3.8). A member that died is asked about too, by
    /// each survivor: the others drop the request, or ask the dead member until its link ends.
    public var relinksAsked: UInt64 = 0
    /// MESH_INTRO_REQUESTs from members answered with empty data because the member asked faster than twice
    /// `maximumPeers` (at least 64) at once and then 10 a second, its requests that fill gaps counted apart (making
    /// data costs a look at the interfaces and a ticket; docs/PROTOCOL.md §3.8). An honest member never does.
    public var introRequestsRationed: UInt64 = 0

    public init() {}
}

/// A MultipeerConnectivity-style session: a set of peers that exchange reliable messages (TCP) and unreliable
/// datagrams (UDP).
///
/// Peers join through invitations: a `NearbyServiceBrowser` invites a peer it found, the peer's
/// `NearbyServiceAdvertiser` hands the invitation to its app, and the app accepts into a session. `connect(to:)`
/// invites an advertiser at a known address without discovery.
public final class Session: Sendable {
    /// Whether members connect to each other (as in MC) or only to the peer they joined.
    public enum Topology: Sendable, Equatable {
        /// A peer that joins is introduced to every member, and they connect directly: every member's
        /// `connectedPeers` lists all the others (the default, as MC).
        case mesh
        /// Peers are connected only to whom they invited or accepted (the relay: players never see each other).
        case star
    }

    /// Which thread datagrams reach the app on.
    public enum DatagramDelivery: Sendable, Equatable {
        /// The delegate's `didReceiveDatagram…`, on the session's I/O thread (as in MC; the default).
        case delegate
        /// A `DatagramReader` the app reads on a thread of its own (`Session.datagramReader`): the session's I/O
        /// thread no longer wakes for datagrams.
        case reader
    }

    /// Limits, timing and topology.
    public struct Configuration: Sendable {
        /// Peers in the session, ourselves included (MC's default is 8).
        public var maximumPeers: Int = 8
        /// A connected peer silent for this long is `notConnected` (default 2 s).
        public var peerTimeout: Duration = .seconds(2)
        /// How often each side proves it is alive (default: a quarter of `peerTimeout`, and at most
        /// `longestDefaultHeartbeat`).
        public var heartbeatInterval: Duration?
        /// The longest default `heartbeatInterval`: a quarter of the default `peerTimeout`. The wire does not tell a
        /// peer the other side's timeout, so a session that waits longer than the default for its peers still proves
        /// it is alive this often: a peer with the default timeout hears from it in time even where no datagram
        /// does it (a relayed link, or an app that has stopped reading its `DatagramReader`).
        public static let longestDefaultHeartbeat: Duration = .milliseconds(500)
        /// The default `maximumQueuedBytes`: 8 MiB.
        public static let defaultMaximumQueuedBytes = 8 << 20
        /// UDP port for datagrams; 0 picks one. Give it the advertiser's port to keep one port number per host.
        public var udpPort: UInt16 = 0
        /// Local address to bind the UDP socket to, and to connect from: a numeric IPv4 or IPv6 address, or `""`
        /// (the default) for every address, IPv4 and IPv6.
        public var bindHost: String = ""
        /// Largest reliable message accepted from, or sent to, a peer (default 1 MiB). A peer that sends a larger one
        /// breaks this side's limit: its link is closed (`PeerFault.malformedFrame`), so two sides that exchange
        /// large messages set the same limit.
        public var maximumMessageSize: Int = 1 << 20
        /// Most peers (connected or connecting) from one source address (default 4): one host cannot fill the
        /// session's slots.
        public var maximumPeersPerHost: Int = 4
        /// Most bytes queued towards one peer before `send` refuses with `.busy` (default 8 MiB).
        public var maximumQueuedBytes: Int = Self.defaultMaximumQueuedBytes
        /// Where incoming resources are written, each in a new directory of its own with mode 0700 (default `""`:
        /// `$TMPDIR`, else `/tmp`).
        public var resourceDirectory: String = ""
        /// Largest resource accepted from a peer, in bytes (default 64 GiB); a larger one is refused, and 0 refuses
        /// every resource (an empty one too: no file is made). Values above `Int64.max` (what `ResourceProgress`
        /// counts) mean `Int64.max`.
        public var maximumResourceSize: UInt64 = 1 << 36
        /// Free space kept on `resourceDirectory`'s filesystem (default 256 MiB), so that peers cannot fill the disk,
        /// however many send at once: a resource whose bytes, with those the other transfers on its link still owe,
        /// would leave less is refused at its start (the sender hears "not enough free space"), and one being written
        /// when the free space falls under it (checked every 4 MiB written) fails, its file deleted.
        public var resourceFreeSpaceReserve: UInt64 = 256 << 20
        /// `.mesh` (default) or `.star`. A session without encryption is always a star (introductions pin keys).
        public var topology: Topology = .mesh
        /// `.delegate` (default) or `.reader`: see `DatagramDelivery`.
        public var datagramDelivery: DatagramDelivery = .delegate
        /// How long one of this session's invitations may take to reach its peer: the TCP connect, the handshake and
        /// the peer's first frame (default nil: the invitation's whole timeout). The rest of an invitation's timeout
        /// is its peer's app's, to answer. An app whose peers may put the question to a person (a host that asks its
        /// operator) invites with a timeout long enough for a person, and sets this short, so that an address where
        /// nothing answers fails as fast as before.
        public var reachTimeout: Duration?
        /// Tests only: introduced members skip the direct connection and call through the introducer at once.
        var relaysIntroductions = false
        /// Tests only: an introduction is followed this long after it came, so that a test can have joins cross it.
        var introductionDelayNanos: Nanos = 0
        /// Tests only: the bytes free on the filesystem of a path (nil: unknown), in place of `statvfs`'s.
        var freeSpace: @Sendable (String) -> UInt64? = { try? FileSystem.availableBytes(at: $0) }
        /// Whether admitting a caller forgives its try at the advertiser that handed it over (docs/PROTOCOL.md
        /// §3.6). A pairing session sets false: being let in to try a code is not being admitted, and a caller that
        /// joins it and leaves without a word must not get its handshakes for free.
        package var admissionForgivesTry = true

        /// How many of this session's invitations may have given its share of the digits away (handshake message 3)
        /// and not yet been accepted before the next one waits a turn, one a second (`InviterShareRation`). Tests
        /// make it small; apps keep 16.
        package var unansweredInvitationBurst = 16

        /// The settings, each named for its property above and with the same default.
        public init(maximumPeers: Int = 8, peerTimeout: Duration = .seconds(2), heartbeatInterval: Duration? = nil,
                    udpPort: UInt16 = 0, bindHost: String = "", maximumMessageSize: Int = 1 << 20,
                    maximumPeersPerHost: Int = 4, maximumQueuedBytes: Int = Self.defaultMaximumQueuedBytes, resourceDirectory: String = "",
                    maximumResourceSize: UInt64 = 1 << 36, topology: Topology = .mesh) {
            self.maximumPeers = maximumPeers
            self.peerTimeout = peerTimeout
            self.heartbeatInterval = heartbeatInterval
            self.udpPort = udpPort
            self.bindHost = bindHost
            self.maximumMessageSize = maximumMessageSize
            self.maximumPeersPerHost = maximumPeersPerHost
            self.maximumQueuedBytes = maximumQueuedBytes
            self.resourceDirectory = resourceDirectory
            self.maximumResourceSize = maximumResourceSize
            self.topology = topology
        }
    }

    /// Largest unreliable payload: 1184 bytes. With PeerMesh's 20-byte header, the 16-byte authentication tag,
    /// UDP's 8 and IPv6's 40 bytes, a datagram is at most 1268 bytes: under IPv6's minimum MTU (1280), so it is
    /// never fragmented on Ethernet (1500), PPPoE (1492), common VPN tunnels, or any IPv6 path.
    public static let maximumDatagramSize = 1184

    /// The most any session accepts as one reliable message (the per-session limit is
    /// `Configuration.maximumMessageSize`).
    public static let maximumReliableMessageSize = ControlFrame.maximumReliableMessage

    /// This peer.
    public let myPeerID: PeerID
    /// How much this session insists on encryption.
    public let encryptionPreference: EncryptionPreference
    let core: SessionCore
    /// The listener behind `nearbyConnectionData`, once used.
    let direct = Mutex<DirectAcceptor?>(nil)

    /// Opens the session's UDP socket and joins the process's I/O loop, as MC's
    /// `MCSession(peer:securityIdentity:encryptionPreference:)`.
    ///
    /// - Parameters:
    ///   - peer: this peer. A `PeerID(displayName:)` has a key pair for this run; `securityIdentity` gives the
    ///     persistent one (then `peer` must be its `peerID`, or nil).
    ///   - encryptionPreference: `.required` (the default) encrypts and authenticates every link; `.none` is
    ///     INSECURE and meant for tests and benchmarks.
    public init(peer: PeerID? = nil, securityIdentity: PeerIdentity? = nil, encryptionPreference: EncryptionPreference = .required,
                configuration: Configuration = Configuration()) throws(PeerMeshError) {
        guard configuration.maximumPeers >= 2 else {
            throw .invalidParameter("maximumPeers must be at least 2 (it counts the local peer)")
        }
        guard configuration.peerTimeout > .milliseconds(100) else {
            throw .invalidParameter("peerTimeout must be more than 100 ms")
        }
        guard (1...ControlFrame.maximumReliableMessage).contains(configuration.maximumMessageSize) else {
            throw .invalidParameter("maximumMessageSize must be 1…\(ControlFrame.maximumReliableMessage) bytes")
        }
        guard configuration.maximumPeersPerHost >= 1, configuration.maximumQueuedBytes >= 1 << 16 else {
            throw .invalidParameter("maximumPeersPerHost must be at least 1 and maximumQueuedBytes at least 64 KiB")
        }
        guard (1...1_000_000).contains(configuration.unansweredInvitationBurst) else {
            throw .invalidParameter("unansweredInvitationBurst must be from 1 to 1,000,000")
        }
        let me: PeerID
        switch (peer, securityIdentity) {
        case (nil, nil): throw .invalidParameter("a session needs a peer or a securityIdentity")
        case (let p?, nil): me = p
        case (nil, let id?): me = id.peerID
        case (let p?, let id?):
            guard p.identity == id.peerID.identity else {
                throw .invalidParameter("peer \(p) is not the securityIdentity's peer (\(id.peerID))")
            }
            me = id.peerID
        }
        if encryptionPreference != .none, me.keys == nil {
            throw .invalidParameter("peer \(me) has no key pair (a PeerID decoded or made from an identity number cannot encrypt); use PeerID(displayName:) or a PeerIdentity")
        }
        myPeerID = me
        self.encryptionPreference = encryptionPreference
        core = try SessionCore(peer: me, preference: encryptionPreference, configuration: configuration)
        core.owner.withLock { $0 = WeakSession(self) }
        core.start()
    }

    deinit { core.shutdown() }

    /// The delegate, held weakly (as in MC).
    public var delegate: (any SessionDelegate)? {
        get { core.delegate.withLock { $0.value } }
        set { core.delegate.withLock { $0 = WeakDelegate(newValue) } }
    }

    /// Peers currently `connected`.
    public var connectedPeers: [PeerID] { core.shared.withLock { $0.machine.connectedPeers } }

    /// `peer`'s current state.
    public func state(of peer: PeerID) -> SessionState { core.shared.withLock { $0.machine.state(of: peer) } }

    /// The UDP port datagrams arrive on.
    public var udpPort: UInt16 { core.udpPort }

    /// Where the app reads datagrams when the session was made with `datagramDelivery: .reader` (nil otherwise).
    public var datagramReader: DatagramReader? { core.reader }

    /// A snapshot of the traffic counters.
    public var statistics: SessionStatistics { core.counters.load() }

    /// The smoothed UDP round-trip time to `peer`, measured by pings every heartbeat interval; `nil` before the
    /// first answer.
    public func roundTripTime(to peer: PeerID) -> Duration? {
        core.roundTripTime(to: peer).map { Duration(nanos: $0) }
    }

    /// Sends `data` to every peer in `peers`.
    ///
    /// - Throws: `invalidParameter` for empty data, an empty peer list or an oversize message;
    ///   `notConnected` if any listed peer is not connected — then a reliable send sends nothing to anyone, while an
    ///   unreliable one has still gone to the connected peers.
    public func send(_ data: Data, toPeers peers: [PeerID], with mode: SendMode) throws(PeerMeshError) {
        guard !peers.isEmpty else { throw .invalidParameter("send: the peer list is empty") }
        guard !data.isEmpty else { throw .invalidParameter("send: the data is empty") }
        switch mode {
        case .reliable:
            guard data.count <= core.configuration.maximumMessageSize else {
                throw .invalidParameter("send: \(data.count) bytes exceeds the reliable limit of \(core.configuration.maximumMessageSize)")
            }
            try core.sendReliable(Array(data), to: peers)
        case .unreliable:
            guard data.count <= Session.maximumDatagramSize else {
                throw .invalidParameter("send: \(data.count) bytes exceeds maximumDatagramSize (\(Session.maximumDatagramSize)) for unreliable mode")
            }
            let result: Result<Void, PeerMeshError> = data.withUnsafeBytes { raw in
                Result { () throws(PeerMeshError) in try core.sendDatagram(raw, to: peers) }
            }
            try result.get()
        }
    }

    /// Sends a datagram from raw bytes, without building a `Data`: the audio path's hot call.
    public func sendDatagram(_ bytes: UnsafeRawBufferPointer, toPeers peers: [PeerID]) throws(PeerMeshError) {
        guard !peers.isEmpty else { throw .invalidParameter("send: the peer list is empty") }
        guard !bytes.isEmpty else { throw .invalidParameter("send: the data is empty") }
        guard bytes.count <= Session.maximumDatagramSize else {
            throw .invalidParameter("send: \(bytes.count) bytes exceeds maximumDatagramSize (\(Session.maximumDatagramSize)) for unreliable mode")
        }
        try core.sendDatagram(bytes, to: peers)
    }

    /// `sendDatagram(_:toPeers:)` for a real-time thread (an audio capture callback): no error is built, and a peer
    /// with a UDP path costs no lock and no allocation. Sends to each of `peers` that is connected now and returns
    /// how many were not (they just left, or are not up yet: each is skipped); empty or oversize `bytes` reach no one
    /// and count all of `peers`. (A peer reached only through a relay pipe has no UDP path: its datagram is copied
    /// into a preallocated outbox that the I/O thread sends from, still with no lock and no allocation; a burst of more
    /// than 64 before the I/O thread runs drops the rest, counted in `datagramsNotSent`.)
    @discardableResult
    public func sendDatagram(_ bytes: UnsafeRawBufferPointer, toConnected peers: [PeerID]) -> Int {
        guard !bytes.isEmpty, bytes.count <= Session.maximumDatagramSize else { return peers.count }
        return core.sendDatagramCountingMissing(bytes, to: peers)
    }

    /// Sends the file at `url` to `peer` as a resource named `name`, as MC's
    /// `sendResource(at:withName:toPeer:withCompletionHandler:)`. It goes in 64 KiB chunks over the peer's reliable
    /// connection, taking turns with messages, and is hashed (SHA-256) on both sides; the peer gets it only whole
    /// and verified.
    ///
    /// - Parameters:
    ///   - name: what the peer's app sees, and its file name there: one path component of 1–255 bytes.
    ///   - completion: called once on the session's I/O thread: nil when the peer has the verified file, else why
    ///     not (`.cancelled`, `.resource`, `.notConnected`) — also while the session shuts down, so it must not wait
    ///     for the thread that releases the session.
    /// - Returns: the transfer's progress, which also cancels it.
    /// - Throws: `invalidParameter` for a bad name or a URL that is not a file URL, `notConnected`, or `resource`
    ///   when the file cannot be opened; then nothing was sent.
    @discardableResult
    public func sendResource(at url: URL, withName name: String, toPeer peer: PeerID,
                             withCompletionHandler completion: (@Sendable (PeerMeshError?) -> Void)? = nil) throws(PeerMeshError) -> ResourceProgress {
        guard url.isFileURL else { throw .invalidParameter("sendResource: \(url) is not a file URL") }
        return try core.sendResource(at: url.path, name: name, to: peer, completion: completion)
    }

    /// Opens a byte stream named `name` to `peer`, as MC's `startStream(withName:toPeer:)`; the peer's delegate
    /// gets its reading end in `didReceive stream…withName`. Bytes arrive in order, exactly once, over the peer's
    /// encrypted connection; the reader's window (256 KiB) holds the writer back when the reader's app is slow, and
    /// closing either end reaches the other.
    ///
    /// - Throws: `invalidParameter` for a name outside 1–255 bytes, `notConnected`.
    public func startStream(withName name: String, toPeer peer: PeerID) throws(PeerMeshError) -> OutputByteStream {
        try core.startStream(name: name, to: peer)
    }

    /// Invites the advertiser at `endpoint` without discovery (`--connect host:port`). The peer is learned from
    /// its HELLO; it appears as `connecting`, then `connected` or, with a delegate call saying why, `notConnected`.
    /// A timeout of 0 or less means 30 s.
    public func connect(to endpoint: PeerEndpoint, context: Data? = nil, timeout: Duration = .seconds(30)) throws(PeerMeshError) {
        try core.invite(expected: nil, endpoint: endpoint, context: context, timeout: timeout)
    }

    /// Says goodbye to every peer and reports each `notConnected`. The session stays usable, and starts again from
    /// nothing: no choice stands (a `disconnect(_:)`'s, or a fault's 60 s; docs/PROTOCOL.md §3.8).
    public func disconnect() { core.disconnect() }

    /// Says goodbye to `peer` only (and cancels an invitation to it in progress). In a full mesh, a peer whose link
    /// this ends is not brought back by the other members' introductions until this app connects it again (an
    /// invitation either way, or its own connection data) — docs/PROTOCOL.md §3.8.
    public func disconnect(_ peer: PeerID) { core.disconnect(peer) }

    /// The short authentication string of the encrypted link to `peer` (six digits, the same on both sides), or
    /// nil when the peer is not connected over an encrypted link. (While it is still connecting, the inviter learns
    /// them from `SessionDelegate.session(_:didReceiveShortAuthenticationString:fromPeer:)`.)
    public func shortAuthenticationString(for peer: PeerID) -> String? { core.shortAuthenticationString(for: peer) }

    /// 32 bytes unique to the encrypted link to `peer`, the same on both ends (a channel binding, like a TLS
    /// exporter): bind an application-level proof to this link with it (PeerMesh's pairing does). Nil when the
    /// peer is not connected over an encrypted link.
    public func channelBinding(for peer: PeerID) -> [UInt8]? { core.channelBinding(for: peer) }

    /// Whether the link to `peer` is encrypted and authenticated.
    public func isEncrypted(_ peer: PeerID) -> Bool { core.isEncrypted(peer) }

    /// Whether the link to `peer` is relayed: in a full-mesh session, two members that cannot reach each other
    /// directly are connected through a member both reach, over an end-to-end encrypted connection that member
    /// only passes on (it sees ciphertext). Datagrams to such a peer travel on that connection. False for a peer
    /// that is not connected.
    public func isRelayed(_ peer: PeerID) -> Bool { core.isRelayed(peer) }
}
