/// Who is in a full-mesh session, and who must be introduced to whom, as a pure state machine.
///
/// When a peer joins this member by an invitation, the member asks every other member it is connected to for
/// connection data for the newcomer (MESH_INTRO_REQUEST), and hands each answer to the newcomer (MESH_INTRODUCE),
/// which connects directly, its key pinned and a one-time ticket presented. Links made by an introduction introduce
/// no one, so introductions never loop. Each member enforces its own peer limit: a full member makes no data.
struct MembershipStateMachine: Sendable {
    /// What the driver must do.
    enum Action: Equatable, Sendable {
        /// Send `frame` to the connected peer `peer`.
        case send(PeerID, MeshFrame)
        /// Make connection data that lets `newcomer` connect to us, and send it to `introducer` (MESH_INTRO_DATA).
        case makeData(for: PeerID, replyTo: PeerID)
        /// Connect to `peer` with the connection data `introducer` passed on (through it, if not directly).
        case connect(PeerID, data: [UInt8], introducer: PeerID)
        /// `peer` broke the mesh protocol: count it and close its link.
        case fault(PeerID, PeerFault)
    }

    let me: PeerID
    let topology: Session.Topology
    let maximumPeers: Int
    /// Peers connected now.
    private(set) var members: Set<PeerID> = []
    /// Peers whose link to us came from an introduction (ours or theirs): they introduce no one.
    private var introduced: Set<UInt64> = []
    /// For each newcomer we introduce, the members we asked and have not heard from.
    private var asked: [UInt64: Set<UInt64>] = [:]

    init(me: PeerID, topology: Session.Topology, maximumPeers: Int) {
        self.me = me
        self.topology = topology
        self.maximumPeers = maximumPeers
    }

    /// `peer` is connected.
    ///
    /// Introductions pin keys: a peer whose link carries none (a plaintext link of an `.optional` session) is
    /// neither introduced to the others nor asked to make data for a newcomer.
    mutating func connected(_ peer: PeerID) -> [Action] {
        guard members.insert(peer).inserted, topology == .mesh, !introduced.contains(peer.identity),
              peer.publicKey != nil else { return [] }
        let others = members.filter { $0 != peer && $0.publicKey != nil }.sorted { $0.identity < $1.identity }
        guard !others.isEmpty else { return [] }
        asked[peer.identity] = Set(others.map(\.identity))
        return others.map { .send($0, .introRequest(peer: peer)) }
    }

    /// `peer` is no longer connected.
    mutating func disconnected(_ peer: PeerID) -> [Action] {
        members.remove(peer)
        introduced.remove(peer.identity)
        asked[peer.identity] = nil
        for key in asked.keys {
            asked[key]?.remove(peer.identity)
            if asked[key]?.isEmpty == true { asked[key] = nil }
        }
        return []
    }

    /// `frame` arrived from the connected peer `from`.
    mutating func received(_ frame: MeshFrame, from peer: PeerID) -> [Action] {
        guard members.contains(peer) else { return [] }
        switch frame {
        case .introRequest(let newcomer):
            // Data is made only when it is needed and there is room: an empty answer says so.
            guard topology == .mesh, newcomer != me, newcomer != peer, !members.contains(newcomer),
                  members.count + 1 < maximumPeers
            else { return [.send(peer, .introData(forIdentity: newcomer.identity, data: []))] }
            introduced.insert(newcomer.identity)
            return [.makeData(for: newcomer, replyTo: peer)]
        case .introData(let id, let data):
            guard var waiting = asked[id], waiting.remove(peer.identity) != nil else {
                return [.fault(peer, .unexpectedFrame("MESH_INTRO_DATA that was not asked for"))]
            }
            asked[id] = waiting.isEmpty ? nil : waiting
            guard !data.isEmpty, let newcomer = members.first(where: { $0.identity == id }) else { return [] }
            return [.send(newcomer, .introduce(peer: peer, data: data))]
        case .introduce(let other, let data):
            guard topology == .mesh, other != me, !members.contains(other), members.count + 1 < maximumPeers else { return [] }
            introduced.insert(other.identity)
            return [.connect(other, data: data, introducer: peer)]
        }
    }
}
