/// Who is in a full-mesh session, and who must be introduced to whom, as a pure state machine.
///
/// When a peer joins this member by an invitation, the member asks every other member it is connected to for
/// connection data for the newcomer (MESH_INTRO_REQUEST), and hands each answer to the newcomer (MESH_INTRODUCE),
/// which connects directly, its key pinned and a one-time ticket presented. The driver says which links an
/// introduction made (`connected(_:introducedBy:)`), from how the link was made (we followed an introduction to it,
/// or it came with connection data we made for a member), never from what a member said of a peer, which a lying
/// member can say of anyone. Each member enforces its own peer limit: a full member makes no data.
///
/// A link made by an introduction introduces its peer only to members its introducer did not know of. Two
/// newcomers that join two members at the same moment (X joins M while N joins H) are each introduced only to the
/// members their host had then; so a request lists the introducer's other members (each asked about the peer by
/// this request or another), and the member that lets an introduced peer in (M, as N comes with M's data for H's
/// request) introduces it to those of its own members the request did not list, other than peers the same
/// introducer's membership introduced to it (it introduced those to each other itself): here X. H, as X comes, may
/// do the same for N; the two invitations cross, and the session keeps one link (the lower identity's invitation
/// wins, or the later finds the pair connected). A member answers with data only for a peer it is not connected
/// to, and each answer makes at most one link, so these introductions end.
///
/// A link between two members that is lost (it ended with no GOODBYE either way) is made again the same way: each
/// end asks the other members to introduce them again (MESH_RELINK), unless this side ended that peer by choice.
/// See docs/PROTOCOL.md §3.8, "Links that break".
struct MembershipStateMachine: Sendable {
    /// What the driver must do.
    enum Action: Equatable, Sendable {
        /// Send `frame` to the connected peer `peer`.
        case send(PeerID, MeshFrame)
        /// Make connection data that lets `newcomer` connect to us, and send it to `introducer` (MESH_INTRO_DATA);
        /// its ticket carries `introduction`, which the link it makes brings back to `connected(_:introducedBy:)`.
        case makeData(for: PeerID, replyTo: PeerID, introduction: Introduction)
        /// Connect to `peer` with the connection data `introducer` passed on (through it, if not directly).
        case connect(PeerID, data: [UInt8], introducer: PeerID)
        /// `peer` broke the mesh protocol: count it and close its link.
        case fault(PeerID, PeerFault)
        /// An introduction by the member `introducer` is not followed: there is no room for its peer, or the member's
        /// share is spent. Count it (`SessionStatistics.introductionsNotFollowed`).
        case notFollowed(introducer: PeerID)
        /// A request of `member`'s was answered with empty data: it asks faster than `requestPace`. Count it
        /// (`SessionStatistics.introRequestsRationed`).
        case rationed(PeerID)
    }

    /// A member's introduction, as the link it made carries it (`introduction(by:)`): the member, and which of its
    /// memberships it came from. A member that leaves and comes back is another membership: a link its earlier one
    /// introduced comes up as a newcomer's (the member may not have introduced its peer to everyone before it left).
    struct Introduction: Hashable, Sendable {
        let member: UInt64
        let membership: UInt64
        /// On data we made for the member's request: the members the request listed (the member's other members,
        /// each asked about the peer). Nil on an introduction we followed.
        var listed: Set<UInt64>? = nil
        /// On data we made for the member's request: the request filled a gap (MESH_INTRO_REQUEST `fillsGap`), so its
        /// ticket is counted apart from those made for the member's newcomers.
        var fillsGap = false

        /// The member's membership alone, without what a request said.
        var membershipOnly: Introduction { Introduction(member: member, membership: membership) }
    }

    let me: PeerID
    let topology: Session.Topology
    let maximumPeers: Int
    /// Peers connected now.
    private(set) var members: Set<PeerID> = []
    /// For each member whose link an introduction made while its introducer's membership stood: that membership.
    private var introducedVia: [UInt64: Introduction] = [:]
    /// Each member's membership: a number no other membership in this session's life had.
    private var memberships: [UInt64: UInt64] = [:]
    private var nextMembership: UInt64 = 1
    /// For each member: its introductions (MESH_INTRODUCE) we followed whose peers have not joined us yet, oldest
    /// first (a peer introduced twice is there twice). A member introduces us to the others when we join it, so at
    /// most `maximumIntroducedPerMember` are followed while it is a member: each is a connection we start to
    /// addresses the member chose, and one that introduced without end would have us connect wherever it likes, as
    /// often as it likes.
    private var introducedBy: [UInt64: [UInt64]] = [:]
    /// How many introductions one member may have us follow: the most an honest one sends, one per other member of a
    /// session as large as ours, and at least `leastIntroducedPerMember`.
    var maximumIntroducedPerMember: Int { max(Self.leastIntroducedPerMember, maximumPeers - 1) }
    static let leastIntroducedPerMember = 16
    /// For each newcomer we introduce, the members we asked and how many of our requests each has yet to answer.
    /// Each member answers every request, in order, on its link; so a newcomer that leaves (and may come back) keeps
    /// its entry until those answers come: an answer about a peer that has gone is late, not unasked for.
    private var asked: [UInt64: [UInt64: Int]] = [:]
    /// Newcomers that left while answers about them were owed, oldest first. Only the latest `maximumDeparted` keep
    /// their entries, so that a member that never answers cannot make the table grow with every newcomer that comes
    /// and goes (newcomers choose their identities); what older ones were still owed moves to `owedUntracked`.
    private var departed: [UInt64] = []
    static let maximumDeparted = 32
    /// Peers we asked the members to introduce us to again (MESH_RELINK), and when: kept `relinkInterval`.
    private var relinked: [UInt64: Nanos] = [:]
    /// Peers lost again within `relinkInterval` of being asked for: asked for when it ends, if still lost.
    private var waitingRelinks: [UInt64: PeerID] = [:]
    /// How long after asking for a lost peer we do not ask for it again.
    static let relinkInterval: Nanos = 10_000_000_000
    /// Peers this side ended by choice, and until when the mesh does not bring them back (`endedByChoice(_:until:)`).
    private var refusedUntil: [UInt64: Nanos] = [:]
    static let maximumEndedByChoice = 256
    /// How long a peer whose link we closed for a fault is not brought back by the mesh.
    static let faultQuarantine: Nanos = 60_000_000_000
    /// Each member's requests for connection data (MESH_INTRO_REQUEST), as a ration's debt (`requestPace`), apart for
    /// its newcomers' and for gaps (as tickets are counted: a member that another makes ask about gaps over and over,
    /// with MESH_RELINK, spends its gap requests, not its newcomers'). Making data costs this side a look at its
    /// interfaces and a ticket, so a member that asks without end is answered with empty data past its pace. Kept
    /// across visits (coming back buys nothing); an entry whose debt is paid is dropped.
    private var requestDebt: [RequestKind: Nanos] = [:]
    private struct RequestKind: Hashable {
        let member: UInt64
        let fillsGap: Bool
    }
    /// `2 × maximumPeers` requests at once (a limit of a million or more counts as a million), and at least 64 (more
    /// than an honest member sends when a whole session joins it, or relinks: the asker does not ask again after an
    /// empty answer), then 10 a second.
    let requestPace: RationPace
    /// For each member asked: answers it still owes about newcomers whose entries were forgotten. One count per member,
    /// so that no number of newcomers coming and going makes an honest member's late answer a fault.
    private var owedUntracked: [UInt64: Int] = [:]

    init(me: PeerID, topology: Session.Topology, maximumPeers: Int) {
        self.me = me
        self.topology = topology
        self.maximumPeers = maximumPeers
        requestPace = RationPace(burst: max(64, 2 * min(maximumPeers, 1 << 20)), interval: 100_000_000)
    }

    /// The introduction by `member` as a link it makes will carry it (taken when we follow one of its introductions,
    /// or make connection data for one of its requests); nil when `member` is not connected.
    func introduction(by member: PeerID) -> Introduction? {
        memberships[member.identity].map { Introduction(member: member.identity, membership: $0) }
    }

    /// `peer` is connected. `introduction`: the introduction that made its link (we followed it to `peer`, or `peer`
    /// came with connection data we made for it), nil for a link an invitation of its own made.
    ///
    /// A newcomer is introduced to the other members unless its link came from an introduction by a membership that
    /// still stands: whatever any member said of it before, a peer that joins by an invitation of its own is
    /// introduced (a lying member's MESH_INTRO_REQUEST cannot keep it out of the mesh), and so is one whose introducer
    /// has left meanwhile, even if it came back (it may never have introduced the peer to the others). One that comes
    /// with data we made for a member's request is introduced to the members that request did not list (but not to
    /// those the same member introduced to us); one whose introduction we followed, to no one.
    ///
    /// Introductions pin keys: a peer whose link carries none (a plaintext link of an `.optional` session) is
    /// neither introduced to the others nor asked to make data for a newcomer.
    mutating func connected(_ peer: PeerID, introducedBy introduction: Introduction?) -> [Action] {
        guard members.insert(peer).inserted else { return [] }
        // Connected again by the app's invitation, one it accepted, or its connection data: no choice against it
        // stands (an introduced link leaves a choice as it is: the introduction was not the app's doing).
        if introduction == nil { refusedUntil[peer.identity] = nil }
        waitingRelinks[peer.identity] = nil
        memberships[peer.identity] = nextMembership
        nextMembership += 1
        // It has joined: no member's introduction of it is outstanding any more.
        for member in introducedBy.keys { introducedBy[member]?.removeAll { $0 == peer.identity } }
        // Back, by whatever path: its entry is a member's again, not a departed newcomer's.
        departed.removeAll { $0 == peer.identity }
        let byIntroduction = introduction.map { $0.member != peer.identity && memberships[$0.member] == $0.membership } ?? false
        if byIntroduction, let introduction { introducedVia[peer.identity] = introduction.membershipOnly }
        guard topology == .mesh, peer.publicKey != nil else { return [] }
        let others = members.filter { $0 != peer && $0.publicKey != nil }.sorted { $0.identity < $1.identity }
        guard byIntroduction, let introduction else {
            // A newcomer: introduced to every other member.
            return ask(others, about: peer, fillsGap: false)
        }
        // Introduced, with data we made for its introducer's request: to those of our members the request did not
        // list (the introducer did not know them then); not to peers the same membership introduced to us (it
        // introduced them to each other itself). Followed: to no one.
        guard let listed = introduction.listed else { return [] }
        let unknown = others.filter {
            $0.identity != introduction.member && !listed.contains($0.identity)
                && introducedVia[$0.identity] != introduction.membershipOnly
        }
        return ask(unknown, about: peer, fillsGap: true)
    }

    /// Asks each of `askees` for connection data that lets `peer` connect to it, listing our other members (those we
    /// ask about `peer` now, and those we asked before or that the peer's introducer asked).
    private mutating func ask(_ askees: [PeerID], about peer: PeerID, fillsGap: Bool) -> [Action] {
        guard !askees.isEmpty else { return [] }
        let listed = Array(members.filter { $0 != peer && $0.publicKey != nil }.map(\.identity).sorted()
            .prefix(MeshFrame.maximumListed))
        return askees.map { member in
            asked[peer.identity, default: [:]][member.identity, default: 0] += 1
            return .send(member, .introRequest(peer: peer, members: listed, fillsGap: fillsGap))
        }
    }

    /// `peer` is no longer connected (the driver also says so of a peer that never joined: an invitation to it, or
    /// an introduction's last attempt, failed; what is expected of it stays as it was). `lost`: its link ended
    /// without a GOODBYE either way (its socket closed under it, or it went silent), at `now`.
    ///
    /// A member lost so may still be in the mesh, cut off from us alone (a path between two members that failed, or
    /// the member that relayed our link left): we ask each other member with a key to introduce us to each other again
    /// (MESH_RELINK), at most once per `relinkInterval` for each peer (a loss within it is asked about when it ends,
    /// by `tick`). The peer asks too, as it lost us: whichever of the two finds the other no longer connected to itself
    /// gets the introduction. A link that ended by a GOODBYE was ended by choice, and one this side ended by choice
    /// (`endedByChoice(_:until:)`) may look lost to us too: neither is asked about.
    mutating func disconnected(_ peer: PeerID, lost: Bool = false, now: Nanos) -> [Action] {
        guard members.remove(peer) != nil else { return [] }
        memberships[peer.identity] = nil
        introducedVia[peer.identity] = nil
        introducedBy[peer.identity] = nil
        // Requests to `peer` will not be answered; requests about it stay open, as its answers are still coming.
        for key in asked.keys {
            asked[key]?[peer.identity] = nil
            if asked[key]?.isEmpty == true { asked[key] = nil }
        }
        owedUntracked[peer.identity] = nil
        departed.removeAll { $0 == peer.identity || asked[$0] == nil }
        if asked[peer.identity] != nil {
            departed.append(peer.identity)
            if departed.count > Self.maximumDeparted, let gone = asked.removeValue(forKey: departed.removeFirst()) {
                for (member, count) in gone { owedUntracked[member, default: 0] += count }
            }
        }
        guard lost, topology == .mesh, peer.publicKey != nil, refusedUntil[peer.identity] == nil else { return [] }
        forgetRelinks(before: now)
        guard relinked[peer.identity] == nil else {
            // Asked for less than `relinkInterval` ago: asked for again when the interval ends (`tick`), if still lost.
            waitingRelinks[peer.identity] = peer
            return []
        }
        return relink(peer, now: now)
    }

    /// Asks every other member with a key to introduce us to `peer` again.
    private mutating func relink(_ peer: PeerID, now: Nanos) -> [Action] {
        let askees = members.filter { $0.publicKey != nil }.sorted { $0.identity < $1.identity }
        guard !askees.isEmpty else { return [] }
        relinked[peer.identity] = now
        return askees.map { .send($0, .relink(identity: peer.identity)) }
    }

    /// This side ended its link to `peer` by choice, until `until`: the app disconnected it (`.max`: until it connects
    /// again other than by an introduction), or we closed it for a fault (`faultQuarantine`; nothing is asked again
    /// when it ends). The far side may take that link as lost (a GOODBYE can be lost with the connection, and a
    /// garbage stream carries none) and ask the members to introduce us again; meanwhile a request about `peer` gets
    /// empty data, its introductions are not followed, it is not asked for again after a loss, and the driver turns
    /// away a caller that comes with an introduction's ticket for it (`refuses`). At most `maximumEndedByChoice` are
    /// kept: past that, the one that ends first goes.
    mutating func endedByChoice(_ peer: PeerID, until: Nanos) {
        refusedUntil[peer.identity] = max(until, refusedUntil[peer.identity] ?? 0)
        waitingRelinks[peer.identity] = nil
        if refusedUntil.count > Self.maximumEndedByChoice,
           let first = refusedUntil.min(by: { ($0.value, $0.key) < ($1.value, $1.key) }) {
            refusedUntil[first.key] = nil
        }
    }

    /// Whether a choice of this side's against `peer` stands (`endedByChoice(_:until:)`): a caller that comes with a
    /// ticket made for a member's introduction of it, however it presents it, is turned away (`DirectAcceptor`).
    func refuses(_ peer: PeerID) -> Bool { refusedUntil[peer.identity] != nil }

    /// The app left the session (`disconnect()`): no relink waits, none is held back, and no choice stands (the app
    /// starts again from nothing).
    mutating func leftSession() {
        waitingRelinks.removeAll()
        relinked.removeAll()
        refusedUntil.removeAll()
    }

    /// The earliest time `tick` has something to do: a relink waiting for its interval, or a choice that expires.
    var nextDeadline: Nanos? {
        let relinks = waitingRelinks.keys.map(relinkDue)
        let choices = refusedUntil.values.filter { $0 != .max }
        return (relinks + choices).min()
    }

    /// Time passed: relinks whose interval ended are asked for (if their peers are still lost), and choices that
    /// expired are forgotten.
    mutating func tick(now: Nanos) -> [Action] {
        refusedUntil = refusedUntil.filter { $0.value > now }
        var actions: [Action] = []
        for (id, peer) in waitingRelinks.sorted(by: { $0.key < $1.key })
        where now >= relinkDue(id) {
            waitingRelinks[id] = nil
            guard !members.contains(peer), refusedUntil[id] == nil else { continue }
            actions += relink(peer, now: now)
        }
        // A relink still waiting is due after `now`, so its ask is younger than the interval and stays.
        forgetRelinks(before: now)
        return actions
    }

    /// When the peer with `id` may be asked for again: `relinkInterval` after the last ask (at once if none is kept).
    private func relinkDue(_ id: UInt64) -> Nanos { (relinked[id] ?? 0) &+ Self.relinkInterval }

    /// Forgets asks that `relinkInterval` has passed since, by `now`.
    private mutating func forgetRelinks(before now: Nanos) {
        relinked = relinked.filter { now &- $0.value < Self.relinkInterval }
    }

    /// `frame` arrived from the connected peer `from`, at `now`.
    mutating func received(_ frame: MeshFrame, from peer: PeerID, now: Nanos) -> [Action] {
        guard members.contains(peer) else { return [] }
        switch frame {
        case .introRequest(let newcomer, let listed, let fillsGap):
            // Data is made only when it is needed and there is room: an empty answer says so. A member whose link
            // carries no key (a plaintext link of an `.optional` session) proved no identity: it may not bring anyone in.
            guard topology == .mesh, peer.publicKey != nil, newcomer != me, newcomer != peer, !members.contains(newcomer),
                  refusedUntil[newcomer.identity] == nil,
                  members.count + 1 < maximumPeers, var introduction = introduction(by: peer)
            else { return [.send(peer, .introData(forIdentity: newcomer.identity, data: []))] }
            let kind = RequestKind(member: peer.identity, fillsGap: fillsGap)
            let debt = requestDebt[kind] ?? 0
            if requestPace.isRationed(debt, now: now) {
                return [.send(peer, .introData(forIdentity: newcomer.identity, data: [])), .rationed(peer)]
            }
            requestDebt = requestDebt.filter { $0.value > now }
            requestDebt[kind] = requestPace.charged(debt, now: now)
            // Nothing is kept of it here: the data's ticket (`DirectAcceptor`, at most 16 live per member and kind)
            // carries this member's introduction and whom it listed, and the link a newcomer makes with it by
            // following that introduction ("PMINT1") introduces it only to members the introducer did not list.
            introduction.listed = Set(listed)
            introduction.fillsGap = fillsGap
            return [.makeData(for: newcomer, replyTo: peer, introduction: introduction)]
        case .introData(let id, let data):
            guard var waiting = asked[id], let open = waiting[peer.identity] else {
                // About a newcomer long gone, perhaps: the member may owe that much.
                guard let owed = owedUntracked[peer.identity] else {
                    return [.fault(peer, .unexpectedFrame("MESH_INTRO_DATA that was not asked for"))]
                }
                owedUntracked[peer.identity] = owed > 1 ? owed - 1 : nil
                return []
            }
            waiting[peer.identity] = open > 1 ? open - 1 : nil
            asked[id] = waiting.isEmpty ? nil : waiting
            if asked[id] == nil { departed.removeAll { $0 == id } }
            guard !data.isEmpty, let newcomer = members.first(where: { $0.identity == id }) else { return [] }
            return [.send(newcomer, .introduce(peer: peer, data: data))]
        case .introduce(let other, let data):
            // Not from a member that proved no identity (its link carries no key): it may not bring anyone in.
            guard topology == .mesh, peer.publicKey != nil, other != me, !members.contains(other),
                  refusedUntil[other.identity] == nil else { return [] }
            // No room, or past its share: not followed.
            var list = introducedBy[peer.identity, default: []]
            guard members.count + 1 < maximumPeers, list.count < maximumIntroducedPerMember else {
                return [.notFollowed(introducer: peer)]
            }
            list.append(other.identity)
            introducedBy[peer.identity] = list
            return [.connect(other, data: data, introducer: peer)]
        case .relink(let id):
            // The member lost its link to our member `lost` (or says so): introduced to each other again as a newcomer
            // of ours is, filling a gap (its ticket counted apart). Not while a request about the asker is open with
            // `lost`: asking again could only have `lost` make another ticket for it. A peer we do not have (it left,
            // or we lost it too) is no fault: nothing to do.
            guard topology == .mesh, peer.publicKey != nil,
                  let lost = members.first(where: { $0.identity == id && $0 != peer && $0.publicKey != nil }),
                  asked[peer.identity]?[id] == nil
            else { return [] }
            return ask([lost], about: peer, fillsGap: true)
        }
    }

    /// The driver did not follow `member`'s introduction of `peer` (its data led nowhere, or the introductions in
    /// flight were at their limit, or there was no room for `peer`): it neither counts against the member's share nor
    /// makes `peer` expected.
    mutating func notFollowed(_ peer: PeerID, introducedBy member: PeerID) {
        guard var list = introducedBy[member.identity], let last = list.lastIndex(of: peer.identity) else { return }
        list.remove(at: last)
        introducedBy[member.identity] = list.isEmpty ? nil : list
    }

    /// Peers we follow an introduction to that have not joined, and how many each member has introduced us to (tests).
    var expectedIntroductions: (introduced: Int, introducedBy: [UInt64: Int]) {
        (Set(introducedBy.values.joined()).count, introducedBy.mapValues(\.count))
    }
}
