@testable import PeerMesh

/// Makes `session` send `frames` to `peer` on their link as they are, bypassing its own driver: a peer that lies,
/// over the real encrypted link.
func injectFrames(_ frames: [ControlFrame], from session: Session, to peer: PeerID) {
    let core = session.core
    core.loop.execute {
        guard let link = core.shared.withLock({ $0.machine.primaryLink(for: peer) }) else { return }
        let connection = core.io.value.connections[link]
        for f in frames { connection?.send(f) }
    }
}
