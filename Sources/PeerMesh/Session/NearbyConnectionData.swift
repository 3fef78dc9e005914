import FoundationEssentials
import MeshPOSIX
import Synchronization

/// What `Session.nearbyConnectionData(forPeer:)` hands out so that one peer can connect to another without DNS-SD
/// (a QR code, a chat message, a file): where this session takes connections, the key it will prove, whom the data
/// is for, and a one-time ticket that lets that peer in without an invitation prompt. See docs/PROTOCOL.md §3.7.
///
/// Wire: `"PMNC"` · version u8 (1) · protocol u8 · name length u8 · name · public key (32) · for-identity u64 ·
/// ticket (16) · TCP port u16 · address count u8 (1–16) · each: length u8 · a numeric IPv4 or IPv6 address.
struct NearbyConnectionData: Equatable, Sendable {
    /// The peer the data leads to, with the key its handshake must prove.
    var peer: PeerID
    /// The identity of the only peer the data lets in.
    var forIdentity: UInt64
    /// The one-time ticket, presented in the invitation's context.
    var ticket: [UInt8]
    /// The TCP port connections go to.
    var port: UInt16
    /// Numeric addresses to try, in order (IPv4 first, loopback last; see `listedAddresses`).
    var addresses: [String]

    static let magic: [UInt8] = Array("PMNC".utf8)
    static let version: UInt8 = 1
    static let ticketSize = 16
    static let maximumAddresses = 16
    /// The invitation context that carries a ticket: this prefix, then the ticket.
    static let contextPrefix: [UInt8] = Array("PMOOB1".utf8)
    /// The same, for an invitation that follows a member's introduction (MESH_INTRODUCE). Only such an invitation, with
    /// a ticket made for that member's request, makes an introduced link (its peer is introduced only to members the
    /// request did not list): the same ticket handed over any other way (a member could pass it to a peer out of band)
    /// makes a newcomer's link, introduced to the others.
    static let introducedContextPrefix: [UInt8] = Array("PMINT1".utf8)

    /// The ticket an invitation's context carries, and whether the inviter says it follows an introduction.
    static func ticket(inContext context: [UInt8]) -> (ticket: [UInt8], followsIntroduction: Bool)? {
        if context.starts(with: contextPrefix) { return (Array(context.dropFirst(contextPrefix.count)), false) }
        if context.starts(with: introducedContextPrefix) { return (Array(context.dropFirst(introducedContextPrefix.count)), true) }
        return nil
    }

    func encoded() -> [UInt8] {
        var w = ByteWriter(capacity: 128)
        w.raw(Self.magic)
        w.u8(Self.version)
        w.u8(peerMeshProtocolVersion)
        let name = Array(peer.displayName.utf8)
        w.u8(UInt8(name.count))
        w.raw(name)
        w.raw(peer.publicKey?.bytes ?? [UInt8](repeating: 0, count: 32))
        w.u64(forIdentity)
        w.raw(ticket)
        w.u16(port)
        w.u8(UInt8(addresses.count))
        for a in addresses {
            let b = Array(a.utf8)
            w.u8(UInt8(b.count))
            w.raw(b)
        }
        return w.bytes
    }

    /// Why connection data was refused.
    enum DecodeError: Error, Equatable, CustomStringConvertible {
        case notConnectionData
        case unsupportedVersion(UInt8, protocol: UInt8)
        case truncated
        case badField(String)
        case trailingBytes

        var description: String {
            switch self {
            case .notConnectionData: "not PeerMesh connection data"
            case .unsupportedVersion(let v, let p): "connection data version \(v), protocol \(p) (this build reads 1 and \(peerMeshProtocolVersion))"
            case .truncated: "the connection data is cut short"
            case .badField(let f): "the connection data has a bad \(f)"
            case .trailingBytes: "the connection data has bytes after its end"
            }
        }
    }

    /// The addresses to list, in the order to try, at most `maximumAddresses`: `preferred` first (the local end of
    /// the link an introduction came over: where the introducer reaches this session), then `candidates` as given.
    /// A loopback address leads only to the machine it is tried on, so when `preferred` is not loopback — the
    /// newcomer is on another machine — loopback addresses are left out; without `preferred` (data for a QR code, a
    /// file) they stay. A scoped `preferred` (`fe80::1%eth0`) names one of our interfaces and is ignored. Pure.
    static func listedAddresses(_ candidates: [String], preferring preferred: String?) -> [String] {
        guard let preferred, !preferred.contains("%") else { return Array(candidates.prefix(maximumAddresses)) }
        let isLoopback = { (host: String) in SocketAddress(numericHost: host, port: 0)?.isLoopback ?? false }
        let remoteNewcomer = !isLoopback(preferred)
        let rest = candidates.filter { $0 != preferred && !(remoteNewcomer && isLoopback($0)) }
        return Array(([preferred] + rest).prefix(maximumAddresses))
    }

    /// Decodes connection data from outside. Pure; never traps.
    static func decode(_ bytes: [UInt8]) -> Result<NearbyConnectionData, DecodeError> {
        bytes.withUnsafeBytes { raw in
            var r = ByteReader(raw)
            guard let m = r.bytes(4), Array(m) == magic else { return .failure(.notConnectionData) }
            guard let v = r.u8(), let p = r.u8() else { return .failure(.truncated) }
            guard v == version, p == peerMeshProtocolVersion else { return .failure(.unsupportedVersion(v, protocol: p)) }
            guard let n = r.u8(), let nameBytes = r.bytes(Int(n)), let keyBytes = r.bytes(32), let forIdentity = r.u64(),
                  let ticket = r.bytes(ticketSize), let port = r.u16(), let count = r.u8() else { return .failure(.truncated) }
            guard let name = String(validating: nameBytes, as: UTF8.self), let key = PublicKey(bytes: Array(keyBytes)),
                  let peer = try? PeerID(displayName: name, publicKey: key) else { return .failure(.badField("peer")) }
            guard port != 0 else { return .failure(.badField("port")) }
            guard (1...maximumAddresses).contains(Int(count)) else { return .failure(.badField("address count")) }
            var addresses: [String] = []
            for _ in 0..<count {
                guard let len = r.u8(), let a = r.bytes(Int(len)) else { return .failure(.truncated) }
                // A scope (`%eth0`) names an interface of the maker's: it need not exist here, only the address must parse.
                guard let text = String(validating: a, as: UTF8.self),
                      SocketAddress(numericHost: String(text.prefix { $0 != "%" }), port: port) != nil else {
                    return .failure(.badField("address"))
                }
                addresses.append(text)
            }
            guard r.remaining == 0 else { return .failure(.trailingBytes) }
            return .success(NearbyConnectionData(peer: peer, forIdentity: forIdentity, ticket: Array(ticket), port: port,
                                                 addresses: addresses))
        }
    }
}

/// Takes the connections that `NearbyConnectionData` leads to: a listener with no DNS-SD publication (an advertiser
/// over a private in-process discovery) that lets in only a peer presenting a live ticket made for it, proving the
/// key the ticket was made for, straight into its session: the app consented when it made the data.
final class DirectAcceptor: NearbyServiceAdvertiserDelegate, Sendable {
    private struct Ticket {
        var forPeer: PeerID
        var expires: Nanos
        /// The member's introduction whose MESH_INTRO_REQUEST it was made for (nil: the app asked).
        var introduction: MembershipStateMachine.Introduction?
    }

    /// Whose share a ticket made for a member's request counts in: the member's (whatever its membership), by kind.
    private struct Holder: Hashable {
        let member: UInt64
        let fillsGap: Bool

        init(_ introduction: MembershipStateMachine.Introduction) {
            (member, fillsGap) = (introduction.member, introduction.fillsGap)
        }

        init?(_ ticket: Ticket) {
            guard let introduction = ticket.introduction else { return nil }
            self.init(introduction)
        }
    }

    /// How long connection data stays good.
    static let lifetime: Nanos = 600_000_000_000

    let advertiser: NearbyServiceAdvertiser
    private weak let session: Session?
    private let tickets = Mutex<[[UInt8]: Ticket]>([:])

    init(session: Session, bindHost: String) throws(PeerMeshError) {
        self.session = session
        advertiser = try NearbyServiceAdvertiser(peer: session.myPeerID, discoveryInfo: nil, serviceType: "pm-direct",
                                                 discovery: InProcessDiscovery(), bindHost: bindHost,
                                                 encryptionPreference: session.encryptionPreference)
        advertiser.delegate = self
        try advertiser.startAdvertisingPeer()
    }

    deinit { advertiser.stopAdvertisingPeer() }

    /// Live tickets the app made at most, and as many made for members' introductions: two budgets, so that neither
    /// kind evicts the other. Past the app's, its oldest goes; past the introductions', the oldest of the member and
    /// kind that holds the most (so that members, each within its own share, flush the largest holders first: a
    /// holder of k tickets loses one only when no holder has more, that is with 256/k holders or more, identities that
    /// asked within a ticket's lifetime; its last one only with more than 256).
    static let maximumTickets = 256
    /// Live tickets made for one member's requests of one kind at most (for its newcomers, or to fill a gap, §3.8);
    /// past it that member's oldest of that kind goes, so that a member that asks for introductions without end
    /// spends its own tickets first; and a lying member whose introduced peers make another member fill gaps without
    /// end spends that member's gap tickets, not those made for its newcomers (until the budget for all members'
    /// requests is full: then the largest holders lose theirs first).
    static let maximumTicketsPerIntroducer = 16

    /// A new ticket for `peer`, made at the app's request or, with `introduction`, for a member's introduction.
    func issue(for peer: PeerID, introduction: MembershipStateMachine.Introduction? = nil) -> [UInt8] {
        let ticket = Sodium.randomBytes(NearbyConnectionData.ticketSize)
        let now = MonotonicClock.nowNanos()
        tickets.withLock { t in
            t = t.filter { $0.value.expires > now }
            func evictOldest(where matches: (Ticket) -> Bool) {
                if let oldest = t.filter({ matches($0.value) }).min(by: { $0.value.expires < $1.value.expires }) { t[oldest.key] = nil }
            }
            if let own = introduction.map(Holder.init) {
                // Counted by member, whatever its membership (one that leaves and comes back gets no more), and kind.
                if t.values.count(where: { Holder($0) == own }) >= Self.maximumTicketsPerIntroducer {
                    evictOldest { Holder($0) == own }
                }
                // Past the budget, the largest holder loses its oldest; on a tie, the requester's own kind, then the
                // holder whose oldest is oldest.
                var held: [Holder: (count: Int, oldest: Nanos)] = [:]
                for ticket in t.values {
                    guard let h = Holder(ticket) else { continue }
                    let was = held[h] ?? (0, .max)
                    held[h] = (was.count + 1, min(was.oldest, ticket.expires))
                }
                func rank(_ e: (key: Holder, value: (count: Int, oldest: Nanos))) -> (Int, Int, Nanos) {
                    (e.value.count, e.key == own ? 1 : 0, .max - e.value.oldest)
                }
                if held.values.reduce(0, { $0 + $1.count }) >= Self.maximumTickets,
                   let most = held.max(by: { rank($0) < rank($1) })?.key {
                    evictOldest { Holder($0) == most }
                }
            } else if t.values.count(where: { $0.introduction == nil }) >= Self.maximumTickets {
                evictOldest { $0.introduction == nil }
            }
            t[ticket] = Ticket(forPeer: peer, expires: now + Self.lifetime, introduction: introduction)
        }
        return ticket
    }

    /// Whether a live ticket was made for `peer` (a relayed call from it may come in).
    func hasTicket(for peer: PeerID) -> Bool {
        let now = MonotonicClock.nowNanos()
        return tickets.withLock { t in t.values.contains { $0.forPeer.identity == peer.identity && $0.expires > now } }
    }

    /// Withdraws every ticket made for `peer`.
    func revoke(for peer: PeerID) { tickets.withLock { t in t = t.filter { $0.value.forPeer != peer } } }

    func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceiveInvitationFromPeer peer: PeerID, withContext context: Data?,
                    invitationHandler: @escaping @Sendable (Bool, Session?) -> Void) {
        invitationHandler(false, nil) // not used: `didReceive invitation` below answers every invitation
    }

    func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceive invitation: Invitation) {
        let presented = NearbyConnectionData.ticket(inContext: Array(invitation.context ?? Data()))
        let now = MonotonicClock.nowNanos()
        let admitted = tickets.withLock { t -> Ticket? in
            guard let ticket = presented?.ticket, let entry = t[ticket], entry.expires > now,
                  entry.forPeer.identity == invitation.peer.identity,
                  entry.forPeer.publicKey == nil || entry.forPeer.publicKey == invitation.certificate?.publicKey
            else { return nil }
            t[ticket] = nil  // one use
            return entry
        }
        guard let admitted, let session else {
            return invitation.decline(.notTrusted, message: "no valid connection data for \(invitation.peer.displayName)")
        }
        // A ticket made for a member's introduction, presented by a peer that says it follows that introduction, makes
        // an introduced link (§3.8); the app's own data, or such a ticket handed over otherwise, a newcomer's.
        let followsIntroduction = presented?.followsIntroduction == true
        guard admitted.introduction != nil else { return invitation.accept(into: session, introducedBy: nil) }
        // A member's ticket does not bring back a peer this side ended by choice (its app disconnected it, or its link
        // was closed for a fault), however it is presented, even one made before (§3.8): asked on the session's loop.
        let core = session.core
        core.loop.execute {
            if core.io.value.membership.refuses(invitation.peer) {
                return invitation.decline(.declined, message: "this member ended its link to \(invitation.peer.displayName); an introduction does not make it again")
            }
            invitation.accept(into: session, introducedBy: followsIntroduction ? admitted.introduction : nil)
        }
    }
}

extension Session {
    /// Data that lets `peer` connect to this session directly, with `connectPeer(_:withNearbyConnectionData:)`
    /// and no DNS-SD, as MC's `nearbyConnectionData(forPeer:withCompletionHandler:)`. Send it over any channel
    /// (a QR code, a message): it holds this session's addresses and port, its public key (the connecting side
    /// refuses any other), and a one-time ticket good for 10 minutes that only `peer`, proving its own key, can
    /// use; it lets that peer in without an invitation prompt. The session listens for such connections from the
    /// first call on (on `bindHost`, or every interface).
    ///
    /// - Throws: `invalidParameter` on a session without encryption (the data pins keys); `transport` if the
    ///   listener cannot be opened.
    public func nearbyConnectionData(forPeer peer: PeerID) throws(PeerMeshError) -> Data {
        try nearbyConnectionData(forPeer: peer, preferring: nil)
    }

    /// The same, listing `preferred` (an address this session is reached at, such as the local end of the link an
    /// introduction came over) first; `introduction` is the member's introduction it is for (its tickets are counted
    /// apart, and the link they make is an introduced one, §3.8).
    func nearbyConnectionData(forPeer peer: PeerID, preferring preferred: String?,
                              introduction: MembershipStateMachine.Introduction? = nil) throws(PeerMeshError) -> Data {
        guard encryptionPreference != .none, myPeerID.publicKey != nil else {
            throw .invalidParameter("nearbyConnectionData needs an encrypted session (the data pins the keys)")
        }
        let acceptor = try directAcceptor()
        guard let port = acceptor.advertiser.port else { throw .transport("the direct listener is not running") }
        var addresses: [String]
        if core.configuration.bindHost.isEmpty {
            // Not IPv6 link-local ones: their scope names one of our interfaces, which means nothing to the peer.
            addresses = SocketAddress.localInterfaceAddresses(port: port).filter { !$0.isLinkLocalV6 }.map(\.host)
        } else {
            addresses = [core.configuration.bindHost]
        }
        addresses = NearbyConnectionData.listedAddresses(addresses, preferring: preferred)
        guard !addresses.isEmpty else { throw .transport("this machine has no address to give") }
        let data = NearbyConnectionData(peer: myPeerID, forIdentity: peer.identity, ticket: acceptor.issue(for: peer, introduction: introduction),
                                        port: port, addresses: addresses)
        return Data(data.encoded())
    }

    /// Connects to `peer` with the data its session made for this one (`nearbyConnectionData(forPeer:)`), with no
    /// DNS-SD, as MC's `connectPeer(_:withNearbyConnectionData:)`. The data's addresses are tried in turn: one that
    /// refuses, shows another key, or has not proved the peer's key within `peerTimeout` (5 to 30 s) gives way to the
    /// next; each invitation's connect races the addresses left (`ConnectRace`: an address that drops connection
    /// attempts costs 250 ms a race, not those seconds). Once the peer has proved its key on one, that invitation has 30 s,
    /// and however it ends (the peer declines, it times out) ends the attempt. The peer goes `connecting` once, then
    /// `connected`, or, when no address led to it, `notConnected`, with `invitationTo…failedWith` saying why the last
    /// invitation failed.
    /// `cancelConnectPeer` stops the attempt where it is. The handshake must prove the key in the data. The first
    /// invitation is started on the session's event loop, which this call waits for (at once when called from a
    /// delegate callback).
    ///
    /// - Throws: `invalidParameter` when the data does not decode, is `peer`'s for another peer, or is not `peer`'s;
    ///   the error of the last address when no connection could be started to any of them (nothing is reported then).
    public func connectPeer(_ peer: PeerID, withNearbyConnectionData data: Data) throws(PeerMeshError) {
        let blob: NearbyConnectionData
        switch NearbyConnectionData.decode(Array(data)) {
        case .success(let b): blob = b
        case .failure(let e): throw .invalidParameter("connectPeer: \(e)")
        }
        guard blob.peer.identity == peer.identity, peer.publicKey == nil || peer.publicKey == blob.peer.publicKey else {
            throw .invalidParameter("connectPeer: the connection data is \(blob.peer)'s, not \(peer)'s")
        }
        guard blob.forIdentity == myPeerID.identity else {
            throw .invalidParameter("connectPeer: the connection data was made for another peer, not \(myPeerID)")
        }
        guard encryptionPreference != .none else {
            throw .invalidParameter("connectPeer: connection data needs an encrypted session (it pins the keys)")
        }
        // Each address in turn, on the loop, until one connects (see `SessionCore.connectDirect`).
        if let error = core.loop.submitAndWait({ [core] in core.connectDirect(blob) }) { throw error }
    }

    /// Cancels a connection to `peer` in progress or made, on both sides, as MC's `cancelConnectPeer(_:)`: the
    /// invitation is withdrawn (or the link closed with GOODBYE) and any connection data made for `peer` stops
    /// working. A link it ends is the app's choice, as with `disconnect(_:)`.
    public func cancelConnectPeer(_ peer: PeerID) {
        direct.withLock { $0 }?.revoke(for: peer)
        disconnect(peer)
    }

    /// The listener behind `nearbyConnectionData` (and its tickets), started on first use.
    func directAcceptor() throws(PeerMeshError) -> DirectAcceptor {
        if let existing = direct.withLock({ $0 }) { return existing }
        let made = try DirectAcceptor(session: self, bindHost: core.configuration.bindHost)
        return direct.withLock { d in
            if let existing = d { return existing }
            d = made
            return made
        }
    }
}
