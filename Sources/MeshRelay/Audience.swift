import MeshPOSIX
import PeerMesh
import Synchronization

/// The peers a capture chain sends to now, shared with its capture thread: the host's listening players, or a
/// player's host while push-to-talk is on. The list is published whole (`SnapshotCell`), so the capture thread reads
/// it once per chunk with no lock and no allocation; a list replaced meanwhile is freed by its writer, never on that
/// thread.
final class Audience: Sendable {
    /// One published list (nil: nobody, so the capture thread skips the chunk without touching an array).
    private final class Snapshot: Sendable {
        let peers: [PeerID]?
        init(_ peers: [PeerID]) { self.peers = peers.isEmpty ? nil : peers }
    }
    private let published = SnapshotCell<Snapshot>(Snapshot([]))
    /// Keeps writers in turn (the cell takes one at a time).
    private let writer = Mutex(())

    init() {}

    /// Lends `use` the peers audio goes to now; does not call it when there are none. Lock-free (the capture
    /// thread), and the list stays alive through `use`.
    func withPeers(_ use: ([PeerID]) -> Void) {
        published.withCurrent { if let peers = $0?.peers { use(peers) } }
    }

    /// The peers audio goes to now (any thread; it copies the list).
    var peers: [PeerID] { published.withCurrent { $0?.peers ?? [] } }

    /// Makes `peers` the audience from the next chunk on. The list it replaces is freed here, after the writers'
    /// lock. Callers that compute the list from state of their own publish under that state's lock, so that lists
    /// are published in the order the state changed.
    func publish(_ peers: [PeerID]) {
        let new = Snapshot(peers)
        _ = writer.withLock { _ in published.replace(with: new) }
    }
}
