// The one file that calls libavahi-client. Everything here runs either on avahi's poll thread (inside a
// callback) or while holding avahi_threaded_poll_lock; `AvahiCore` documents that invariant.
import CAvahi
import Dispatch
import FoundationEssentials
import Glibc
import MeshPOSIX

/// The error funnel: an avahi error code (negative) becomes a `PeerMeshError.discovery` carrying `avahi_strerror`.
private func avahiError(_ code: Int32, _ what: String) -> PeerMeshError {
    .discovery("\(what): \(String(cString: avahi_strerror(code)))")
}


private let ifUnspec = AvahiIfIndex(AVAHI_IF_UNSPEC)
private let protoUnspec = AvahiProtocol(AVAHI_PROTO_UNSPEC)
/// Most resolvers a browse keeps open for TXT updates; beyond it, instances are resolved once and closed.
private let maximumOpenResolvers = 128
/// Most resolvers a browse runs at once, open or still resolving: a flood of instances on the LAN costs at most
/// this many; each further instance waits its turn (`WaitingInstances`) until some resolve, fail or go.
private let maximumResolvers = 512

/// Owns the threaded poll, the client and every entry group, browser and resolver made from it, and frees them
/// in order (resolvers, browsers, groups, client, then the poll).
///
/// `@unchecked Sendable`: all mutable state is touched only on avahi's poll thread or under avahi_threaded_poll_lock.
final class AvahiCore: @unchecked Sendable {
    /// One publication: its advertisement, current instance name and entry group.
    final class Publication {
        let id: Int
        let advertisement: ServiceAdvertisement
        let type: String
        let sink: EventSink<PublicationEvent>
        var name: String
        var group: OpaquePointer?
        weak var core: AvahiCore?

        init(id: Int, advertisement: ServiceAdvertisement, sink: EventSink<PublicationEvent>, core: AvahiCore) {
            self.id = id
            self.core = core
            self.advertisement = advertisement
            self.type = AvahiDiscovery.dnssdType(advertisement.serviceType)
            self.sink = sink
            self.name = advertisement.peer.identityString
        }
    }

    /// One browse: its service browser, open resolvers and dedup table.
    final class Browse {
        let id: Int
        let type: String
        let sink: EventSink<BrowseEvent>
        var table: AvahiBrowseTable
        var browser: OpaquePointer?
        var resolvers: [AvahiBrowseTable.ItemKey: OpaquePointer] = [:]
        /// Record browsers on each item's SRV record, which see a re-announced port at once.
        var srvWatches: [AvahiBrowseTable.ItemKey: SRVWatch] = [:]
        /// Instances seen while every resolver was busy, in the order they came: each is resolved when one frees.
        var waiting = WaitingInstances<AvahiBrowseTable.ItemKey>(capacity: 4_096)
        /// Whether the resolver bound, and the waiting list's, have been reported (once per browse each).
        var saidTooMany = false
        var saidSkipping = false
        weak var core: AvahiCore?

        init(id: Int, serviceType: String, localIdentity: UInt64, sink: EventSink<BrowseEvent>, core: AvahiCore) {
            self.id = id
            self.type = AvahiDiscovery.dnssdType(serviceType)
            self.sink = sink
            self.table = AvahiBrowseTable(serviceType: serviceType, localIdentity: localIdentity)
            self.core = core
        }
    }

    /// A record browser on one item's SRV record: the box its callback reaches.
    final class SRVWatch {
        let key: AvahiBrowseTable.ItemKey
        weak var browse: Browse?
        var browser: OpaquePointer?

        init(key: AvahiBrowseTable.ItemKey, browse: Browse) {
            self.key = key
            self.browse = browse
        }
    }

    private let poll: OpaquePointer
    /// Where the backend's own diagnostics go (a skipped TXT record, a resolver that could not start).
    private let log: @Sendable (String) -> Void
    private let reconfirmSeconds: Double
    private var client: OpaquePointer?
    private var running = false
    private var isShutDown = false
    /// Set when the daemon went away; the next RUNNING starts the reconfirmation window.
    private var reconnecting = false
    private var generation = 0
    private var nextID = 0
    private var publications: [Int: Publication] = [:]
    private var browses: [Int: Browse] = [:]

    init(reconfirmWindow: Duration, waitForDaemon: Bool, log: @escaping @Sendable (String) -> Void) throws(PeerMeshError) {
        // The lines arise inside avahi's callbacks, with its poll lock held: the app's handler runs on a queue of its
        // own, in order, so that it may call back into discovery (stop a browse, update a publication) or wait.
        let lines = DispatchQueue(label: "peermesh.avahi.log")
        self.log = { line in lines.async { log(line) } }
        let (s, atto) = reconfirmWindow.components
        reconfirmSeconds = max(0, Double(s) + Double(atto) / 1e18)
        guard let p = avahi_threaded_poll_new() else { throw .discovery("avahi: cannot create a poll loop (out of memory)") }
        poll = p
        // The poll thread is not started yet, so the client's first callbacks run here, on this thread.
        var error: Int32 = 0
        guard let c = avahi_client_new(avahi_threaded_poll_get(poll), AVAHI_CLIENT_NO_FAIL, clientTrampoline,
                                       Unmanaged.passUnretained(self).toOpaque(), &error) else {
            throw Self.unreachable(error)
        }
        client = c
        let state = avahi_client_get_state(c)
        if state == AVAHI_CLIENT_FAILURE || (state == AVAHI_CLIENT_CONNECTING && !waitForDaemon) {
            let code = state == AVAHI_CLIENT_FAILURE ? avahi_client_errno(c) : Int32(AVAHI_ERR_NO_DAEMON)
            avahi_client_free(c)
            client = nil
            throw Self.unreachable(code)
        }
        // The first thing the poll thread runs: name it, so `top -H` shows it.
        let api = avahi_threaded_poll_get(poll)
        var now = timeval()
        _ = api?.pointee.timeout_new(api, &now, nameThreadTrampoline, nil)
        let rc = avahi_threaded_poll_start(poll)
        if rc < 0 {
            avahi_client_free(c)
            client = nil
            throw avahiError(rc, "avahi: cannot start the poll thread")
        }
    }

    /// Why the daemon cannot be used: not there (or no system bus to find it on), the usual line; anything else
    /// (the bus refused us, the daemon is in a bad state), that line with avahi's own words.
    private static func unreachable(_ code: Int32) -> PeerMeshError {
        guard code != Int32(AVAHI_ERR_NO_DAEMON), code != 0 else { return .discovery(AvahiDiscovery.daemonMissingMessage) }
        return .discovery("\(AvahiDiscovery.daemonMissingMessage) (avahi: \(String(cString: avahi_strerror(code))))")
    }

    deinit {
        shutdown()
        avahi_threaded_poll_free(poll)
    }

    /// Stops the poll thread and frees every avahi object. Later calls are no-ops. Never call on the poll thread
    /// (it is only called from `AvahiDiscovery.deinit` and `deinit`, which never run there).
    func shutdown() {
        avahi_threaded_poll_lock(poll)
        let wasShutDown = isShutDown
        isShutDown = true
        avahi_threaded_poll_unlock(poll)
        guard !wasShutDown else { return }
        avahi_threaded_poll_stop(poll)
        // The poll thread is gone: free in order, children before the client.
        for b in browses.values { freeBrowseObjects(b) }
        for p in publications.values {
            if let g = p.group { avahi_entry_group_free(g) }
            p.group = nil
        }
        if let c = client { avahi_client_free(c) }
        client = nil
        running = false
    }

    private func withPollLock<T>(_ body: () throws(PeerMeshError) -> T) throws(PeerMeshError) -> T {
        avahi_threaded_poll_lock(poll)
        defer { avahi_threaded_poll_unlock(poll) }
        return try body()
    }

    // MARK: Publishing

    func publish(_ ad: ServiceAdvertisement, sink: EventSink<PublicationEvent>) throws(PeerMeshError) -> Int {
        try withPollLock { () throws(PeerMeshError) -> Int in
            guard !isShutDown else { throw .discovery("avahi: the discovery backend has been released") }
            nextID += 1
            let p = Publication(id: nextID, advertisement: ad, sink: sink, core: self)
            publications[p.id] = p
            if !running { sink.send(.waitingForDaemon) }
            if running {
                do throws(PeerMeshError) { try commit(p) } catch {
                    publications[p.id] = nil
                    if let g = p.group { avahi_entry_group_free(g) }
                    p.group = nil
                    throw error
                }
            }
            return p.id
        }
    }

    func cancelPublication(_ id: Int) {
        avahi_threaded_poll_lock(poll)
        defer { avahi_threaded_poll_unlock(poll) }
        guard let p = publications.removeValue(forKey: id) else { return }
        if !isShutDown, let g = p.group { avahi_entry_group_free(g) }
        p.group = nil
    }

    /// Adds the service to the publication's (new or empty) entry group and commits it. A synchronous name
    /// collision moves to the next alternative name.
    private func commit(_ p: Publication) throws(PeerMeshError) {
        guard let c = client else { return }
        if p.group == nil {
            guard let g = avahi_entry_group_new(c, groupTrampoline, Unmanaged.passUnretained(p).toOpaque()) else {
                throw avahiError(avahi_client_errno(c), "avahi could not create an entry group")
            }
            p.group = g
        }
        guard let g = p.group, avahi_entry_group_is_empty(g) != 0 else { return }

        var txt: UnsafeMutablePointer<AvahiStringList>?
        for entry in p.advertisement.txtRecord.reversed() {
            txt = entry.withCString { avahi_string_list_add(txt, $0) }
        }
        defer { avahi_string_list_free(txt) }

        for _ in 0..<32 {
            let rc = avahi_entry_group_add_service_strlst(g, ifUnspec, protoUnspec, AvahiPublishFlags(0), p.name, p.type,
                                                          nil, nil, p.advertisement.port, txt)
            if rc == Int32(AVAHI_ERR_COLLISION) {
                p.name = Self.alternativeName(p.name)
                continue
            }
            if rc < 0 { throw avahiError(rc, "avahi could not add service \"\(p.name)\" \(p.type)") }
            let committed = avahi_entry_group_commit(g)
            if committed < 0 { throw avahiError(committed, "avahi could not publish \"\(p.name)\" \(p.type)") }
            return
        }
        throw .discovery("avahi could not publish \(p.type): every alternative instance name collided")
    }

    private static func alternativeName(_ name: String) -> String {
        guard let alt = avahi_alternative_service_name(name) else { return name + " #2" }
        defer { avahi_free(alt) }
        return String(cString: alt)
    }

    fileprivate func groupChanged(_ p: Publication, _ g: OpaquePointer?, _ state: AvahiEntryGroupState) {
        guard !isShutDown, publications[p.id] === p else { return }
        switch state {
        case AVAHI_ENTRY_GROUP_ESTABLISHED:
            p.sink.send(.published(instanceName: p.name))
        case AVAHI_ENTRY_GROUP_COLLISION:
            p.name = Self.alternativeName(p.name)
            if let g { avahi_entry_group_reset(g) }
            do throws(PeerMeshError) { try commit(p) } catch { p.sink.send(.failed(error)) }
        case AVAHI_ENTRY_GROUP_FAILURE:
            let code = g.map { avahi_client_errno(avahi_entry_group_get_client($0)) } ?? Int32(AVAHI_ERR_FAILURE)
            p.sink.send(.failed(avahiError(code, "avahi could not publish \"\(p.name)\" \(p.type)")))
        default:
            break
        }
    }

    // MARK: Browsing

    func browse(serviceType: String, localIdentity: UInt64, sink: EventSink<BrowseEvent>) throws(PeerMeshError) -> Int {
        try withPollLock { () throws(PeerMeshError) -> Int in
            guard !isShutDown else { throw .discovery("avahi: the discovery backend has been released") }
            nextID += 1
            let b = Browse(id: nextID, serviceType: serviceType, localIdentity: localIdentity, sink: sink, core: self)
            browses[b.id] = b
            if running {
                do throws(PeerMeshError) { try startBrowser(b) } catch {
                    browses[b.id] = nil
                    throw error
                }
            }
            return b.id
        }
    }

    func cancelBrowse(_ id: Int) {
        avahi_threaded_poll_lock(poll)
        defer { avahi_threaded_poll_unlock(poll) }
        guard let b = browses.removeValue(forKey: id) else { return }
        if !isShutDown { freeBrowseObjects(b) }
    }

    private func startBrowser(_ b: Browse) throws(PeerMeshError) {
        guard let c = client, b.browser == nil else { return }
        guard let browser = avahi_service_browser_new(c, ifUnspec, protoUnspec, b.type, nil, AvahiLookupFlags(0),
                                                      browseTrampoline, Unmanaged.passUnretained(b).toOpaque()) else {
            throw avahiError(avahi_client_errno(c), "avahi could not browse for \(b.type)")
        }
        b.browser = browser
    }

    private func freeBrowseObjects(_ b: Browse) {
        for r in b.resolvers.values { avahi_service_resolver_free(r) }
        b.resolvers.removeAll()
        for w in b.srvWatches.values { if let rb = w.browser { avahi_record_browser_free(rb) } }
        b.srvWatches.removeAll()
        b.waiting.removeAll()
        if let browser = b.browser { avahi_service_browser_free(browser) }
        b.browser = nil
    }

    private func perform(_ actions: [AvahiBrowseTable.Action], for b: Browse) {
        for action in actions {
            switch action {
            case .deliver(let event): b.sink.send(event)
            case .log(let line): log(line)
            }
        }
    }

    fileprivate func browseEvent(_ b: Browse, interface: AvahiIfIndex, proto: AvahiProtocol, event: AvahiBrowserEvent,
                                 name: String, type: String, domain: String) {
        guard !isShutDown, browses[b.id] === b, let c = client else { return }
        let key = AvahiBrowseTable.ItemKey(interface: interface, proto: proto, name: name, domain: domain)
        switch event {
        case AVAHI_BROWSER_NEW:
            guard b.resolvers[key] == nil else { return }
            guard b.resolvers.count < maximumResolvers else {
                let queued = b.waiting.append(key)
                if !b.saidTooMany {
                    b.saidTooMany = true
                    log("peermesh: more than \(maximumResolvers) DNS-SD instances of \(type) at once; the rest are resolved "
                        + "as resolvers free")
                }
                if !queued, !b.saidSkipping {
                    b.saidSkipping = true
                    log("peermesh: more than \(b.waiting.capacity) DNS-SD instances of \(type) wait to be resolved; "
                        + "further ones are skipped until they are announced again")
                }
                return
            }
            resolve(b, key, client: c)
        case AVAHI_BROWSER_REMOVE:
            b.waiting.remove(key)
            if let r = b.resolvers.removeValue(forKey: key) { avahi_service_resolver_free(r) }
            if let w = b.srvWatches.removeValue(forKey: key), let rb = w.browser { avahi_record_browser_free(rb) }
            perform(b.table.removed(key), for: b)
            resolveWaiting(b, client: c)
        case AVAHI_BROWSER_FAILURE:
            let code = avahi_client_errno(c)
            // A disconnect is recovered by the client callback; anything else ends this browse.
            if code != Int32(AVAHI_ERR_DISCONNECTED) {
                b.sink.send(.failed(avahiError(code, "avahi stopped browsing for \(b.type)")))
            }
        default:
            break
        }
    }

    /// Starts resolving `key`. The resolver stays open so that TXT changes arrive as further FOUND events (up to a
    /// bound: past it, an instance is resolved once and its resolver closed). Each record is resolved in its own
    /// family.
    private func resolve(_ b: Browse, _ key: AvahiBrowseTable.ItemKey, client c: OpaquePointer) {
        if let r = avahi_service_resolver_new(c, key.interface, key.proto, key.name, b.type, key.domain, key.proto,
                                              AvahiLookupFlags(0), resolveTrampoline, Unmanaged.passUnretained(b).toOpaque()) {
            b.resolvers[key] = r
            watchSRV(b, key: key, type: b.type, client: c)
        } else {
            log(avahiError(avahi_client_errno(c), "avahi could not resolve \"\(key.name)\" \(b.type)").description)
        }
    }

    /// Resolves waiting instances while there are resolvers free.
    private func resolveWaiting(_ b: Browse, client c: OpaquePointer) {
        while b.resolvers.count < maximumResolvers, let key = b.waiting.next() {
            if b.resolvers[key] == nil { resolve(b, key, client: c) }
        }
    }

    /// Opens a record browser on the item's SRV record (within the same bound as resolvers): when an advertiser is
    /// restarted under the same instance name, its new port is seen as soon as it announces.
    private func watchSRV(_ b: Browse, key: AvahiBrowseTable.ItemKey, type: String, client c: OpaquePointer) {
        guard b.srvWatches[key] == nil, b.srvWatches.count < maximumOpenResolvers else { return }
        var full = [CChar](repeating: 0, count: Int(AVAHI_DOMAIN_NAME_MAX))
        guard avahi_service_name_join(&full, full.count, key.name, type, key.domain) == 0 else { return }
        let w = SRVWatch(key: key, browse: b)
        guard let rb = avahi_record_browser_new(c, key.interface, key.proto, full, UInt16(AVAHI_DNS_CLASS_IN),
                                                UInt16(AVAHI_DNS_TYPE_SRV), AvahiLookupFlags(0), srvTrampoline,
                                                Unmanaged.passUnretained(w).toOpaque()) else { return }
        w.browser = rb
        b.srvWatches[key] = w
    }

    fileprivate func srvEvent(_ w: SRVWatch, _ rb: OpaquePointer?, event: AvahiBrowserEvent, rdata: UnsafeRawBufferPointer) {
        guard !isShutDown, let b = w.browse, browses[b.id] === b, b.srvWatches[w.key] === w, w.browser == rb else { return }
        guard let srv = Self.parseSRV(rdata) else { return }
        switch event {
        case AVAHI_BROWSER_NEW: perform(b.table.srvAdded(w.key, srv), for: b)
        case AVAHI_BROWSER_REMOVE: perform(b.table.srvRemoved(w.key, srv), for: b)
        default: break
        }
    }

    /// An SRV record's data (RFC 2782: priority, weight, port, then the target as uncompressed DNS labels).
    static func parseSRV(_ d: UnsafeRawBufferPointer) -> AvahiBrowseTable.SRVRecord? {
        guard d.count >= 7 else { return nil }
        let port = UInt16(d[4]) << 8 | UInt16(d[5])
        var labels: [String] = []
        var i = 6
        while i < d.count {
            let n = Int(d[i])
            if n == 0 { break }
            guard n < 64, i + 1 + n <= d.count else { return nil }
            labels.append(String(decoding: UnsafeRawBufferPointer(rebasing: d[(i + 1)..<(i + 1 + n)]), as: UTF8.self))
            i += 1 + n
        }
        guard port != 0, !labels.isEmpty else { return nil }
        return AvahiBrowseTable.SRVRecord(port: port, target: labels.joined(separator: "."))
    }

    fileprivate func resolveEvent(_ b: Browse, _ r: OpaquePointer?, interface: AvahiIfIndex, proto: AvahiProtocol,
                                  event: AvahiResolverEvent, name: String, domain: String, hostName: String?,
                                  address: UnsafePointer<AvahiAddress>?, port: UInt16,
                                  txt: UnsafeMutablePointer<AvahiStringList>?) {
        guard !isShutDown, browses[b.id] === b else { return }
        let key = AvahiBrowseTable.ItemKey(interface: interface, proto: proto, name: name, domain: domain)
        guard let r, b.resolvers[key] == r else { return }
        switch event {
        case AVAHI_RESOLVER_FOUND:
            guard let address else { return }
            var buf = [CChar](repeating: 0, count: Int(AVAHI_ADDRESS_STR_MAX))
            avahi_address_snprint(&buf, buf.count, address)
            var host = String(decoding: buf.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            // A link-local IPv6 address is only usable with its interface.
            if address.pointee.proto == AvahiProtocol(AVAHI_PROTO_INET6), host.lowercased().hasPrefix("fe80"), interface > 0 {
                var name = [CChar](repeating: 0, count: 32)
                if if_indextoname(UInt32(interface), &name) != nil {
                    host += "%" + String(decoding: name.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
                }
            }
            var strings: [String] = []
            var node = txt
            while let n = node {
                let size = avahi_string_list_get_size(n)
                if let text = avahi_string_list_get_text(n) {
                    strings.append(String(decoding: UnsafeBufferPointer(start: text, count: size), as: UTF8.self))
                }
                node = avahi_string_list_get_next(n)
            }
            guard port != 0 else { return }
            perform(b.table.resolved(key, txt: strings, endpoint: PeerEndpoint(host: host, port: port), hostName: hostName), for: b)
            if b.resolvers.count > maximumOpenResolvers, b.resolvers[key] == r {
                b.resolvers[key] = nil
                avahi_service_resolver_free(r)
            }
        default:
            // Resolution timed out or failed: drop the resolver; a later NEW (or a restart) tries again.
            b.resolvers[key] = nil
            avahi_service_resolver_free(r)
        }
        if let c = client { resolveWaiting(b, client: c) }
    }

    // MARK: The client and daemon restarts

    fileprivate func clientChanged(_ c: OpaquePointer?, _ state: AvahiClientState) {
        guard !isShutDown, let c else { return }
        client = c
        switch state {
        case AVAHI_CLIENT_S_RUNNING:
            running = true
            for p in publications.values.sorted(by: { $0.id < $1.id }) {
                do throws(PeerMeshError) { try commit(p) } catch { p.sink.send(.failed(error)) }
            }
            for b in browses.values.sorted(by: { $0.id < $1.id }) {
                do throws(PeerMeshError) { try startBrowser(b) } catch { b.sink.send(.failed(error)) }
            }
            if reconnecting {
                reconnecting = false
                scheduleReconfirm()
            }
        case AVAHI_CLIENT_S_COLLISION, AVAHI_CLIENT_S_REGISTERING:
            // The host name is being (re-)established: withdraw, and publish again once RUNNING.
            running = false
            for p in publications.values { if let g = p.group { avahi_entry_group_reset(g) } }
        case AVAHI_CLIENT_FAILURE:
            running = false
            let code = avahi_client_errno(c)
            if code == Int32(AVAHI_ERR_DISCONNECTED) {
                reconnect(c)
            } else {
                failAll(avahiError(code, "avahi client failed"))
            }
        default: // CONNECTING: waiting for the daemon to appear on the bus.
            running = false
        }
    }

    /// The daemon went away: free the client and everything made from it, and wait for the daemon with a new one.
    private func reconnect(_ old: OpaquePointer) {
        for b in browses.values {
            b.resolvers.removeAll()
            b.srvWatches.removeAll()
            b.browser = nil
            b.table.daemonLost()
        }
        for p in publications.values {
            p.group = nil
            p.name = p.advertisement.peer.identityString
            p.sink.send(.waitingForDaemon)
        }
        avahi_client_free(old) // frees its groups, browsers and resolvers too
        client = nil
        reconnecting = true
        generation += 1
        var error: Int32 = 0
        if let c = avahi_client_new(avahi_threaded_poll_get(poll), AVAHI_CLIENT_NO_FAIL, clientTrampoline,
                                    Unmanaged.passUnretained(self).toOpaque(), &error) {
            client = c
        } else {
            failAll(avahiError(error, "avahi: lost the daemon and cannot reconnect (is the system bus still up?)"))
        }
    }

    private func failAll(_ error: PeerMeshError) {
        for p in publications.values { p.sink.send(.failed(error)) }
        for b in browses.values { b.sink.send(.failed(error)) }
    }

    private func scheduleReconfirm() {
        let expected = generation
        DispatchQueue.global().asyncAfter(deadline: .now() + reconfirmSeconds) { [weak self] in
            guard let self else { return }
            avahi_threaded_poll_lock(self.poll)
            defer { avahi_threaded_poll_unlock(self.poll) }
            guard !self.isShutDown, self.generation == expected else { return }
            for b in self.browses.values.sorted(by: { $0.id < $1.id }) {
                self.perform(b.table.reconfirmExpired(), for: b)
            }
        }
    }
}

// MARK: Trampolines (C callbacks; userdata is an unretained box owned by the core's dictionaries)

private func nameThreadTrampoline(_ t: OpaquePointer?, _ userdata: UnsafeMutableRawPointer?) {
    ThreadName.setCurrent("pm-avahi")
}

private func clientTrampoline(_ c: OpaquePointer?, _ state: AvahiClientState, _ userdata: UnsafeMutableRawPointer?) {
    guard let userdata else { return }
    Unmanaged<AvahiCore>.fromOpaque(userdata).takeUnretainedValue().clientChanged(c, state)
}

private func groupTrampoline(_ g: OpaquePointer?, _ state: AvahiEntryGroupState, _ userdata: UnsafeMutableRawPointer?) {
    guard let userdata, let g else { return }
    let p = Unmanaged<AvahiCore.Publication>.fromOpaque(userdata).takeUnretainedValue()
    // During avahi_entry_group_new the group is not stored yet; only UNCOMMITED is reported then.
    guard p.group == nil || p.group == g else { return }
    p.core?.groupChanged(p, g, state)
}

private func browseTrampoline(_ browser: OpaquePointer?, _ interface: AvahiIfIndex, _ proto: AvahiProtocol,
                              _ event: AvahiBrowserEvent, _ name: UnsafePointer<CChar>?, _ type: UnsafePointer<CChar>?,
                              _ domain: UnsafePointer<CChar>?, _ flags: AvahiLookupResultFlags,
                              _ userdata: UnsafeMutableRawPointer?) {
    guard let userdata else { return }
    let b = Unmanaged<AvahiCore.Browse>.fromOpaque(userdata).takeUnretainedValue()
    b.core?.browseEvent(b, interface: interface, proto: proto, event: event,
                        name: name.map { String(cString: $0) } ?? "", type: type.map { String(cString: $0) } ?? b.type,
                        domain: domain.map { String(cString: $0) } ?? "local")
}

private func resolveTrampoline(_ r: OpaquePointer?, _ interface: AvahiIfIndex, _ proto: AvahiProtocol,
                               _ event: AvahiResolverEvent, _ name: UnsafePointer<CChar>?, _ type: UnsafePointer<CChar>?,
                               _ domain: UnsafePointer<CChar>?, _ host: UnsafePointer<CChar>?,
                               _ address: UnsafePointer<AvahiAddress>?, _ port: UInt16,
                               _ txt: UnsafeMutablePointer<AvahiStringList>?, _ flags: AvahiLookupResultFlags,
                               _ userdata: UnsafeMutableRawPointer?) {
    guard let userdata else { return }
    let b = Unmanaged<AvahiCore.Browse>.fromOpaque(userdata).takeUnretainedValue()
    b.core?.resolveEvent(b, r, interface: interface, proto: proto, event: event,
                         name: name.map { String(cString: $0) } ?? "", domain: domain.map { String(cString: $0) } ?? "local",
                         hostName: host.map { String(cString: $0) }, address: address, port: port, txt: txt)
}

private func srvTrampoline(_ rb: OpaquePointer?, _ interface: AvahiIfIndex, _ proto: AvahiProtocol, _ event: AvahiBrowserEvent,
                           _ name: UnsafePointer<CChar>?, _ clazz: UInt16, _ type: UInt16, _ rdata: UnsafeRawPointer?,
                           _ size: Int, _ flags: AvahiLookupResultFlags, _ userdata: UnsafeMutableRawPointer?) {
    guard let userdata else { return }
    let w = Unmanaged<AvahiCore.SRVWatch>.fromOpaque(userdata).takeUnretainedValue()
    w.browse?.core?.srvEvent(w, rb, event: event, rdata: UnsafeRawBufferPointer(start: rdata, count: rdata == nil ? 0 : size))
}
