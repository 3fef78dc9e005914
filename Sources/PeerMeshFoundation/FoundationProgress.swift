import Foundation
import PeerMesh

/// Holds a Foundation `Progress` for the session's I/O thread: `Progress` is documented thread-safe (its unit
/// counts and `cancel()` may be used from any thread), which Swift cannot see.
private struct ProgressHandle: @unchecked Sendable {
    let progress: Progress
}

extension ResourceProgress {
    /// This transfer as the Foundation `Progress` MultipeerConnectivity returns from `sendResource` and passes to
    /// `didStartReceivingResourceWithName…with progress`: its `totalUnitCount` and `completedUnitCount` follow the
    /// bytes moved (so `fractionCompleted` and KVO work as in MC), it is cancelled when the transfer is, and
    /// `cancel()` on it cancels the transfer on both sides. Each call makes a new `Progress` that follows the same
    /// transfer. Foundation runs a `Progress`'s cancellation handler later, on a queue of its own, so the transfer
    /// stops a moment after `cancel()` returns (and a transfer that ends first completes); `ResourceProgress.cancel()`
    /// acts at once.
    ///
    /// PeerMesh itself returns `ResourceProgress`, so that its binaries need not link all of Foundation and ICU;
    /// an app that uses Foundation anyway imports `PeerMeshFoundation` and writes
    /// `try session.sendResource(at: url, withName: name, toPeer: peer).foundationProgress()`.
    public func foundationProgress() -> Progress {
        let progress = Progress(totalUnitCount: totalUnitCount)
        progress.isCancellable = true
        progress.isPausable = false
        let handle = ProgressHandle(progress: progress)
        progress.cancellationHandler = { [weak self] in self?.cancel() }
        observe { transfer in
            handle.progress.completedUnitCount = transfer.completedUnitCount
            if transfer.isCancelled, !handle.progress.isCancelled { handle.progress.cancel() }
        }
        // Bytes that moved before the follower was added, and a transfer already over.
        progress.completedUnitCount = completedUnitCount
        if isCancelled { progress.cancel() }
        return progress
    }
}
