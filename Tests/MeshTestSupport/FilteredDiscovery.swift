import PeerMesh

/// A discovery backend that publishes through `inner` as it is, and hands each browse event of `inner` to `filter`,
/// which delivers it — now, later, changed, or not at all: what a browser sees of a LAN that an attacker (copies of a
/// record at its own addresses) or a slow network (one record found after another) has shaped.
package struct FilteredDiscovery: DiscoveryBackend {
    let inner: any DiscoveryBackend
    let filter: @Sendable (BrowseEvent, _ deliver: @escaping @Sendable (BrowseEvent) -> Void) -> Void

    package init(_ inner: any DiscoveryBackend,
                 filter: @escaping @Sendable (BrowseEvent, _ deliver: @escaping @Sendable (BrowseEvent) -> Void) -> Void) {
        self.inner = inner
        self.filter = filter
    }

    package func publish(_ advertisement: ServiceAdvertisement,
                         onEvent: @escaping @Sendable (PublicationEvent) -> Void) throws(PeerMeshError) -> any DiscoveryRegistration {
        try inner.publish(advertisement, onEvent: onEvent)
    }

    package func browse(serviceType: String, localPeer: PeerID,
                        onEvent: @escaping @Sendable (BrowseEvent) -> Void) throws(PeerMeshError) -> any DiscoveryRegistration {
        try inner.browse(serviceType: serviceType, localPeer: localPeer) { [filter] event in filter(event, onEvent) }
    }
}
