import Dispatch
import Synchronization

/// A discovery backend that lives inside one process: advertisers and browsers that share an instance see each
/// other. It is meant for tests and for apps that wire peers by hand; it still goes through the TXT codec, so
/// it behaves like DNS-SD. Endpoints are `127.0.0.1:<advertiser port>`.
public final class InProcessDiscovery: DiscoveryBackend {
    private struct Browser {
        let serviceType: String
        let localPeer: PeerID
        let queue: DispatchQueue
        let onEvent: @Sendable (BrowseEvent) -> Void
    }

    private struct State {
        var nextID = 0
        var adverts: [Int: ServiceAdvertisement] = [:]
        var browsers: [Int: Browser] = [:]
    }

    private let state = Mutex(State())

    public init() {}

    public func publish(_ ad: ServiceAdvertisement,
                        onEvent: @escaping @Sendable (PublicationEvent) -> Void) throws(PeerMeshError) -> any DiscoveryRegistration {
        try DiscoveryValidation.validate(serviceType: ad.serviceType)
        try DiscoveryValidation.validate(discoveryInfo: ad.discoveryInfo)
        let (id, targets) = state.withLock { s in
            s.nextID += 1
            s.adverts[s.nextID] = ad
            return (s.nextID, s.browsers.values.filter { $0.serviceType == ad.serviceType && $0.localPeer != ad.peer })
        }
        DispatchQueue.global().async { onEvent(.published(instanceName: ad.peer.identityString)) }
        for b in targets { deliverFound(ad, to: b) }
        return Registration { [weak self] in self?.withdraw(advert: id) }
    }

    public func browse(serviceType: String, localPeer: PeerID,
                       onEvent: @escaping @Sendable (BrowseEvent) -> Void) throws(PeerMeshError) -> any DiscoveryRegistration {
        try DiscoveryValidation.validate(serviceType: serviceType)
        let browser = Browser(serviceType: serviceType, localPeer: localPeer,
                              queue: DispatchQueue(label: "peermesh.inprocess.browse"), onEvent: onEvent)
        let (id, existing) = state.withLock { s in
            s.nextID += 1
            s.browsers[s.nextID] = browser
            return (s.nextID, s.adverts.values.filter { $0.serviceType == serviceType && $0.peer != localPeer })
        }
        for ad in existing { deliverFound(ad, to: browser) }
        return Registration { [weak self] in self?.state.withLock { _ = $0.browsers.removeValue(forKey: id) } }
    }

    private func deliverFound(_ ad: ServiceAdvertisement, to b: Browser) {
        // Round-trip through the TXT codec, as a DNS-SD browser would.
        guard case .success(let (peer, info)) = TXTRecord.decode(instanceName: ad.peer.identityString, txt: ad.txtRecord)
        else { return }
        let found = DiscoveredPeer(peer: peer, discoveryInfo: info, endpoints: [PeerEndpoint(host: "127.0.0.1", port: ad.port)])
        b.queue.async { b.onEvent(.found(found)) }
    }

    private func withdraw(advert id: Int) {
        let (ad, targets) = state.withLock { s -> (ServiceAdvertisement?, [Browser]) in
            guard let ad = s.adverts.removeValue(forKey: id) else { return (nil, []) }
            let stillThere = s.adverts.values.contains { $0.peer == ad.peer && $0.serviceType == ad.serviceType }
            if stillThere { return (nil, []) }
            return (ad, s.browsers.values.filter { $0.serviceType == ad.serviceType && $0.localPeer != ad.peer })
        }
        guard let ad else { return }
        for b in targets { b.queue.async { b.onEvent(.lost(ad.peer)) } }
    }

    private final class Registration: DiscoveryRegistration {
        private let onCancel: Mutex<(@Sendable () -> Void)?>
        init(_ onCancel: @escaping @Sendable () -> Void) { self.onCancel = Mutex(onCancel) }
        func cancel() { onCancel.withLock { f in let g = f; f = nil; return g }?() }
        deinit { cancel() }
    }
}
