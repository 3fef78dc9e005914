import FoundationEssentials
import Synchronization

/// Receives a browser's events, as MC's `MCNearbyServiceBrowserDelegate`. Called on the browser's queue, in order.
public protocol NearbyServiceBrowserDelegate: AnyObject, Sendable {
    /// A peer advertising the service appeared, or re-advertised with other addresses, another name or other
    /// discovery info (a restarted peer announcing its new port, a host opening a pairing window): then this is
    /// called again for the same peer, with what it says now.
    func browser(_ browser: NearbyServiceBrowser, foundPeer peer: PeerID, withDiscoveryInfo info: [String: String]?)
    /// A peer went away.
    func browser(_ browser: NearbyServiceBrowser, lostPeer peer: PeerID)
    /// Browsing failed; the error says what to do.
    func browser(_ browser: NearbyServiceBrowser, didNotStartBrowsingForPeers error: PeerMeshError)
}

public extension NearbyServiceBrowserDelegate {
    func browser(_ browser: NearbyServiceBrowser, didNotStartBrowsingForPeers error: PeerMeshError) {}
}

/// Finds peers advertising a service type and invites them into sessions, as MC's `MCNearbyServiceBrowser`.
public final class NearbyServiceBrowser: Sendable {
    /// This peer (its own advertisement is ignored).
    public let myPeerID: PeerID
    /// The MC-style service type.
    public let serviceType: String

    private let discovery: any DiscoveryBackend
    private let found = Mutex<[PeerID: DiscoveredPeer]>([:])
    private let registration = Mutex<(any DiscoveryRegistration)?>(nil)
    private let delegateBox = Mutex(WeakBrowserDelegate(nil))

    /// Validates the service type. `discovery` defaults to `AvahiDiscovery`.
    public init(peer: PeerID, serviceType: String, discovery: (any DiscoveryBackend)? = nil) throws(PeerMeshError) {
        try DiscoveryValidation.validate(serviceType: serviceType)
        myPeerID = peer
        self.serviceType = serviceType
        if let discovery { self.discovery = discovery } else { self.discovery = try AvahiDiscovery() }
    }

    deinit { stopBrowsingForPeers() }

    /// The delegate, held weakly.
    public var delegate: (any NearbyServiceBrowserDelegate)? {
        get { delegateBox.withLock { $0.value } }
        set { delegateBox.withLock { $0 = WeakBrowserDelegate(newValue) } }
    }

    /// Peers currently visible, with what discovery said of them.
    public var foundPeers: [DiscoveredPeer] { found.withLock { Array($0.values) } }

    /// Starts browsing. Found and lost events go to the delegate.
    public func startBrowsingForPeers() throws(PeerMeshError) {
        guard registration.withLock({ $0 == nil }) else { return }
        let r = try discovery.browse(serviceType: serviceType, localPeer: myPeerID) { [weak self] event in
            guard let self else { return }
            switch event {
            case .found(let p):
                // New, or moved (endpoints), renamed or with other discovery info: tell the delegate.
                let isNew = self.found.withLock { f in
                    let old = f[p.peer]
                    f[p.peer] = p
                    return old == nil || old!.endpoints != p.endpoints || old!.peer.displayName != p.peer.displayName
                        || old!.discoveryInfo != p.discoveryInfo
                }
                if isNew { self.delegate?.browser(self, foundPeer: p.peer, withDiscoveryInfo: p.discoveryInfo.isEmpty ? nil : p.discoveryInfo) }
            case .lost(let peer):
                let known = self.found.withLock { $0.removeValue(forKey: peer) != nil }
                if known { self.delegate?.browser(self, lostPeer: peer) }
            case .failed(let e):
                self.delegate?.browser(self, didNotStartBrowsingForPeers: e)
            }
        }
        registration.withLock { $0 = r }
    }

    /// Stops browsing. Peers already found are forgotten.
    public func stopBrowsingForPeers() {
        let r = registration.withLock { r in let old = r; r = nil; return old }
        r?.cancel()
        found.withLock { $0.removeAll() }
    }

    /// Invites a found peer into `session`. A timeout of 0 or less means 30 s. A decline or a timeout leaves the
    /// peer `notConnected` in `session`, and the session's delegate hears why.
    ///
    /// The peer's addresses are tried in turn until one answers and proves the advertised key: anyone can announce
    /// a copy of a peer's record at an address of their own, and that copy must not hide the peer. An address that
    /// refuses, shows another key (counted as a peer fault) or has not answered in its share of the time gives way to
    /// the next; once the peer has proved its key, how that invitation ends is the answer. Each invitation's connect
    /// races the addresses left (`ConnectRace`, Happy Eyeballs): one that drops connection attempts costs 250 ms a
    /// race.
    /// All of it within `timeout`: each address left gets its share of the time left to answer in, and the one
    /// that answers keeps the rest. The peer goes `connecting` once, then `connected` or `notConnected`. The first
    /// invitation is started on the session's event loop, which this call waits for (at once when called on that
    /// loop, from a session's delegate callback; a browser's delegate is called on a queue of its own, and waits).
    ///
    /// - Throws: `invalidParameter` for a peer this browser has not found or a context over 64 KiB; the error of the
    ///   last address when no connection could be started to any of them (nothing is reported then).
    public func invitePeer(_ peer: PeerID, to session: Session, withContext context: Data?, timeout: Duration) throws(PeerMeshError) {
        guard let p = found.withLock({ $0[peer] }), !p.endpoints.isEmpty else {
            throw .invalidParameter("invitePeer: \(peer) has not been found by this browser")
        }
        let context = context ?? Data()
        guard context.count <= ControlFrame.maximumContext else {
            throw .invalidParameter("invitation context is \(context.count) bytes; at most \(ControlFrame.maximumContext)")
        }
        let timeout = timeout <= .zero ? .seconds(30) : timeout
        // The found record's identity, with its advertised key: what every address must prove.
        let expected = p.peer
        let core = session.core
        if let error = core.loop.submitAndWait({ core.inviteFound(expected, at: p.endpoints, context: context, timeout: timeout) }) {
            throw error
        }
    }
}

private struct WeakBrowserDelegate {
    weak var value: (any NearbyServiceBrowserDelegate)?
    init(_ v: (any NearbyServiceBrowserDelegate)?) { value = v }
}
