import Dispatch
import Synchronization

/// DNS-SD discovery through the system's avahi-daemon (over D-Bus, with libavahi-client).
///
/// An advertisement is published as the service `_<serviceType>._tcp` in `local`, instance name
/// `peer.identityString`, TXT record `ServiceAdvertisement.txtRecord`. After a name collision it is re-published
/// under Avahi's alternative name (`0123456789abcdef #2`); browsers strip that suffix to recover the identity.
///
/// Browsing resolves every instance to IPv4 and IPv6 endpoints (link-local ones with their interface), merges instances of one identity seen on several
/// interfaces (found once, lost when the last instance goes), skips (and logs once) instances whose TXT record
/// is malformed, and ignores the local peer's own advertisement.
///
/// When avahi-daemon restarts, the backend reconnects by itself, publishes again and browses again: peers that
/// are seen again are reported `.found` again, and peers not seen again within `reconfirmWindow` are reported
/// `.lost`. Events for one registration are delivered in order on a serial queue of that registration.
///
/// All calls into libavahi live in `Avahi.swift`; this file holds the public face and the pure browse table.
public final class AvahiDiscovery: DiscoveryBackend {
    /// Text of the error thrown when avahi-daemon (or the system bus it needs) cannot be reached.
    public static let daemonMissingMessage =
        "avahi-daemon is not running: start it (systemctl start avahi-daemon); without it, peers must be given by address"

    private let core: AvahiCore

    /// Connects to avahi-daemon.
    /// - Parameter reconfirmWindow: after the daemon comes back from a restart, how long a previously found peer
    ///   may take to be seen again before it is reported lost.
    /// - Parameter log: receives the backend's diagnostics (a skipped malformed record, a resolver that could not
    ///   start), in order, on a queue of its own (it may call back into discovery); by default they are dropped.
    ///   Libraries never write to stderr themselves.
    /// - Throws: `PeerMeshError.discovery(AvahiDiscovery.daemonMissingMessage)` when the daemon is not reachable
    ///   (followed by avahi's own words when the cause is not simply its absence: a bus that refused access, say).
    /// - Parameter waitForDaemon: when avahi-daemon is not running, wait for it (publications go out and browses
    ///   start as soon as it appears; publications report `.waitingForDaemon` meanwhile) instead of throwing.
    ///   The system bus must be up either way.
    public init(reconfirmWindow: Duration = .seconds(5), waitForDaemon: Bool = false,
                log: @escaping @Sendable (String) -> Void = { _ in }) throws(PeerMeshError) {
        core = try AvahiCore(reconfirmWindow: reconfirmWindow, waitForDaemon: waitForDaemon, log: log)
    }

    deinit { core.shutdown() }

    public func publish(_ advertisement: ServiceAdvertisement,
                        onEvent: @escaping @Sendable (PublicationEvent) -> Void) throws(PeerMeshError) -> any DiscoveryRegistration {
        try DiscoveryValidation.validate(serviceType: advertisement.serviceType)
        try DiscoveryValidation.validate(discoveryInfo: advertisement.discoveryInfo)
        let sink = EventSink(label: "peermesh.avahi.publish", handler: onEvent)
        let id = try core.publish(advertisement, sink: sink)
        return AvahiRegistration(sink: sink) { [core] in core.cancelPublication(id) }
    }

    public func browse(serviceType: String, localPeer: PeerID,
                       onEvent: @escaping @Sendable (BrowseEvent) -> Void) throws(PeerMeshError) -> any DiscoveryRegistration {
        try DiscoveryValidation.validate(serviceType: serviceType)
        let sink = EventSink(label: "peermesh.avahi.browse", handler: onEvent)
        let id = try core.browse(serviceType: serviceType, localIdentity: localPeer.identity, sink: sink)
        return AvahiRegistration(sink: sink) { [core] in core.cancelBrowse(id) }
    }

    /// The DNS-SD service type for an MC-style `serviceType`: `_<serviceType>._tcp`.
    public static func dnssdType(_ serviceType: String) -> String { "_\(serviceType)._tcp" }

    /// The identity part of an instance name: Avahi's collision suffix (`" #2"`, `" #3"`…) removed.
    public static func identityPart(ofInstanceName name: String) -> String {
        guard let hash = name.lastIndex(of: "#"), hash > name.startIndex else { return name }
        let space = name.index(before: hash)
        let digits = name[name.index(after: hash)...]
        guard name[space] == " ", !digits.isEmpty, digits.allSatisfy({ $0.isASCII && $0.isNumber }) else { return name }
        return String(name[..<space])
    }
}

/// Delivers one registration's events, in order, on its own serial queue; nothing after `close()`.
final class EventSink<Event: Sendable>: Sendable {
    private let queue: DispatchQueue
    private let closed = Atomic<Bool>(false)
    private let handler: @Sendable (Event) -> Void

    init(label: String, handler: @escaping @Sendable (Event) -> Void) {
        queue = DispatchQueue(label: label)
        self.handler = handler
    }

    func send(_ event: Event) {
        queue.async { [self] in
            if !closed.load(ordering: .acquiring) { handler(event) }
        }
    }

    func close() { closed.store(true, ordering: .releasing) }
}

/// A publication or browse of `AvahiDiscovery`; cancelling twice is harmless, releasing it cancels.
private final class AvahiRegistration<Event: Sendable>: DiscoveryRegistration {
    private let sink: EventSink<Event>
    private let onCancel: Mutex<(@Sendable () -> Void)?>

    init(sink: EventSink<Event>, onCancel: @escaping @Sendable () -> Void) {
        self.sink = sink
        self.onCancel = Mutex(onCancel)
    }

    func cancel() {
        sink.close()
        onCancel.withLock { f in let g = f; f = nil; return g }?()
    }

    deinit { cancel() }
}

/// The pure state machine behind one Avahi browse: resolved instances in, `BrowseEvent`s out.
///
/// An *item* is one instance seen on one interface and protocol. Items with the same identity are one peer,
/// found once, with the endpoints of all its items (first seen first), lost when its last item goes.
/// No I/O: the driver feeds it avahi's browse/resolve events and acts on the returned actions.
struct AvahiBrowseTable {
    /// One instance on one interface/protocol, as avahi reports it.
    struct ItemKey: Hashable {
        var interface: Int32
        var proto: Int32
        var name: String
        var domain: String
    }

    /// What the driver must do.
    enum Action: Equatable {
        case deliver(BrowseEvent)
        /// Write this line to stderr (an instance was skipped; each instance name is reported once).
        case log(String)
    }

    private struct Peer {
        var peer: PeerID
        var info: [String: String]
        var items: [ItemKey] = []
        /// False between a daemon restart and the first sighting after it.
        var confirmed = true
        var endpoints: [PeerEndpoint] = []
    }

    /// One resolved item: whose it is, where the resolver said it answers, and the SRV target host it named.
    private struct Item {
        var identity: UInt64
        var resolved: PeerEndpoint
        var hostName: String?
    }

    /// An SRV record of an item, as avahi's record browser reports it (port and target host).
    struct SRVRecord: Equatable {
        var port: UInt16
        var target: String
    }

    /// Most SRV records remembered per item (a restarted advertiser has two for a second: the old and the new).
    static let maximumSRVRecordsPerItem = 4

    let serviceType: String
    let localIdentity: UInt64
    private var items: [ItemKey: Item] = [:]
    /// SRV records of each item, oldest first, as the record browser saw them come and go. The newest one whose
    /// target is the resolved host gives the item's port: a restarted advertiser's new port is known the moment it
    /// announces, while avahi's resolver keeps reporting the old one until the cache flushes it a second later.
    private var srvRecords: [ItemKey: [SRVRecord]] = [:]
    private var peers: [UInt64: Peer] = [:]
    private var reported: Set<String> = []

    init(serviceType: String, localIdentity: UInt64) {
        self.serviceType = serviceType
        self.localIdentity = localIdentity
    }

    /// Identities currently known (confirmed or awaiting reconfirmation).
    var knownIdentities: Set<UInt64> { Set(peers.keys) }

    /// How many items and SRV records the table holds (bounded by what avahi reports and by
    /// `maximumSRVRecordsPerItem`).
    var size: (items: Int, srvRecords: Int) { (items.count, srvRecords.values.reduce(0) { $0 + $1.count }) }

    /// An item resolved (first time, or its data changed). `hostName` is the SRV target the resolver followed.
    mutating func resolved(_ key: ItemKey, txt: [String], endpoint: PeerEndpoint, hostName: String? = nil) -> [Action] {
        let decoded = TXTRecord.decode(instanceName: AvahiDiscovery.identityPart(ofInstanceName: key.name), txt: txt)
        guard case .success(let (peer, info)) = decoded else {
            guard case .failure(let why) = decoded else { return [] }
            var out = removed(key)
            if reported.count >= 1024 { reported.removeAll() }   // bounded: a flood of bad records costs at most this
            if reported.insert(key.name).inserted {
                out.append(.log("peermesh: skipping DNS-SD service \"\(key.name)\" of type "
                    + "\(AvahiDiscovery.dnssdType(serviceType)): \(why)"))
            }
            return out
        }
        guard peer.identity != localIdentity else { return [] }

        var out: [Action] = []
        if let old = items[key], old.identity != peer.identity { out += removed(key) }
        items[key] = Item(identity: peer.identity, resolved: endpoint, hostName: hostName)

        var record = peers[peer.identity] ?? Peer(peer: peer, info: info, confirmed: false)
        let wasConfirmed = record.confirmed
        let before = (record.peer.displayName, record.info, record.endpoints)
        // The name and info of an instance named exactly by its identity win over those of an alternative name
        // (`<id> #2`), which is what a copy of the record republished by someone else gets.
        if Self.isPlainName(key) || !record.items.contains(where: { $0 != key && Self.isPlainName($0) }) {
            record.peer = peer
            record.info = info
        }
        if !record.items.contains(key) { record.items.append(key) }
        record.confirmed = true
        record.endpoints = endpoints(of: record.items)
        peers[peer.identity] = record
        let changed = before.0 != record.peer.displayName || before.1 != record.info || before.2 != record.endpoints
        if !wasConfirmed || changed {
            out.append(.deliver(.found(DiscoveredPeer(peer: record.peer, discoveryInfo: record.info, endpoints: record.endpoints))))
        }
        return out
    }

    /// The record browser saw an SRV record of `key` appear (a new announcement: a restarted advertiser's new port).
    mutating func srvAdded(_ key: ItemKey, _ srv: SRVRecord) -> [Action] {
        var list = srvRecords[key] ?? []
        list.removeAll { $0 == srv }
        list.append(srv)
        if list.count > Self.maximumSRVRecordsPerItem { list.removeFirst(list.count - Self.maximumSRVRecordsPerItem) }
        srvRecords[key] = list
        return endpointsChanged(for: key)
    }

    /// The record browser saw an SRV record of `key` go (flushed from the cache, or withdrawn).
    mutating func srvRemoved(_ key: ItemKey, _ srv: SRVRecord) -> [Action] {
        guard var list = srvRecords[key] else { return [] }
        list.removeAll { $0 == srv }
        srvRecords[key] = list.isEmpty ? nil : list
        return endpointsChanged(for: key)
    }

    /// The item's endpoint: the resolver's address, at the port of the newest SRV record that names the same host.
    private func endpoint(of key: ItemKey) -> PeerEndpoint? {
        guard let item = items[key] else { return nil }
        guard let host = item.hostName?.lowercased(),
              let srv = srvRecords[key]?.last(where: { Self.sameHost($0.target, host) }) else { return item.resolved }
        return PeerEndpoint(host: item.resolved.host, port: srv.port)
    }

    private static func sameHost(_ a: String, _ b: String) -> Bool {
        func trimmed(_ s: String) -> String { s.hasSuffix(".") ? String(s.dropLast()).lowercased() : s.lowercased() }
        return trimmed(a) == trimmed(b)
    }

    /// After an SRV change: a confirmed peer whose endpoints moved is found again, with the new ones.
    private mutating func endpointsChanged(for key: ItemKey) -> [Action] {
        guard let item = items[key], var record = peers[item.identity], record.confirmed else { return [] }
        let endpoints = endpoints(of: record.items)
        guard endpoints != record.endpoints else { return [] }
        record.endpoints = endpoints
        peers[item.identity] = record
        return [.deliver(.found(DiscoveredPeer(peer: record.peer, discoveryInfo: record.info, endpoints: endpoints)))]
    }

    /// An item went away (browser REMOVE, or its TXT became unusable).
    mutating func removed(_ key: ItemKey) -> [Action] {
        srvRecords[key] = nil
        guard let item = items.removeValue(forKey: key), var record = peers[item.identity] else { return [] }
        record.items.removeAll { $0 == key }
        if record.items.isEmpty {
            peers[item.identity] = nil
            return [.deliver(.lost(record.peer))]
        }
        let endpoints = endpoints(of: record.items)
        let changed = endpoints != record.endpoints
        record.endpoints = endpoints
        peers[item.identity] = record
        guard changed, record.confirmed else { return [] }
        return [.deliver(.found(DiscoveredPeer(peer: record.peer, discoveryInfo: record.info, endpoints: endpoints)))]
    }

    /// The daemon went away: every item is gone; peers wait for reconfirmation.
    mutating func daemonLost() {
        items.removeAll()
        srvRecords.removeAll()
        for id in peers.keys {
            peers[id]!.items.removeAll()
            peers[id]!.confirmed = false
        }
    }

    /// The reconfirmation window after a restart closed: peers not seen again are lost.
    mutating func reconfirmExpired() -> [Action] {
        var out: [Action] = []
        for (id, record) in peers.sorted(by: { $0.key < $1.key }) where !record.confirmed {
            peers[id] = nil
            out.append(.deliver(.lost(record.peer)))
        }
        return out
    }

    /// Whether the item's instance name is its identity alone, not an alternative name (`<id> #2`).
    private static func isPlainName(_ key: ItemKey) -> Bool {
        AvahiDiscovery.identityPart(ofInstanceName: key.name) == key.name
    }

    /// The endpoints of `keys`: those of instances named plainly by their identity first (an alternative name is
    /// what a peer gets when its name is taken: by a copy of its record, or by its own other self), then IPv4, then
    /// global IPv6, then link-local IPv6. A browser tries them in this order until one proves the key.
    private func endpoints(of keys: [ItemKey]) -> [PeerEndpoint] {
        var out: [(endpoint: PeerEndpoint, plain: Bool)] = []
        for key in keys {
            if let e = endpoint(of: key), !out.contains(where: { $0.endpoint == e }) { out.append((e, Self.isPlainName(key))) }
        }
        func family(_ e: PeerEndpoint) -> Int { !e.host.contains(":") ? 0 : (e.host.lowercased().hasPrefix("fe80") ? 2 : 1) }
        func order(_ e: (offset: Int, element: (endpoint: PeerEndpoint, plain: Bool))) -> (Int, Int, Int) {
            (e.element.plain ? 0 : 1, family(e.element.endpoint), e.offset)
        }
        return out.enumerated().sorted { order($0) < order($1) }.map(\.element.endpoint)
    }
}
