import FoundationEssentials
import MeshPOSIX
import Synchronization

/// An outgoing transfer's file and hash (loop thread only).
final class OutgoingResource {
    let file: SequentialFile
    let hasher: OpenSSL.SHA256
    let progress: ResourceProgress
    let completion: (@Sendable (PeerMeshError?) -> Void)?

    init(file: SequentialFile, hasher: OpenSSL.SHA256, progress: ResourceProgress,
         completion: (@Sendable (PeerMeshError?) -> Void)?) {
        self.file = file
        self.hasher = hasher
        self.progress = progress
        self.completion = completion
    }
}

/// An incoming transfer's partial file, in a directory of its own (mode 0700), and its hash (loop thread only).
final class IncomingResource {
    let name: String
    let peer: PeerID
    let directory: String
    let file: SequentialFile
    let hasher: OpenSSL.SHA256
    let progress: ResourceProgress

    /// Where the bytes go until the hash is verified.
    var partialPath: String { file.path }
    /// Where the verified file is handed to the app.
    var finalPath: String { "\(directory)/\(name)" }

    init(name: String, peer: PeerID, directory: String, file: SequentialFile, hasher: OpenSSL.SHA256,
         progress: ResourceProgress) {
        self.name = name
        self.peer = peer
        self.directory = directory
        self.file = file
        self.hasher = hasher
        self.progress = progress
    }
}

/// Resource transfers: the driver of `ResourceStateMachine`. Files are read and written on the loop thread, one
/// chunk (≤ 64 KiB) at a time, and a link's queue is kept under `highWater` so other messages never wait long.
extension SessionCore {
    /// A link's outbound queue is topped up with chunks to this many bytes, no more.
    static let resourceHighWater = 256 << 10

    // MARK: Commands from the app (any thread)

    func sendResource(at path: String, name: String, to peer: PeerID,
                      completion: (@Sendable (PeerMeshError?) -> Void)?) throws(PeerMeshError) -> ResourceProgress {
        guard ResourceName.isValid(name) else {
            throw .invalidParameter("sendResource: the name must be 1–255 bytes of one path component (no '/', no control or invisible format characters)")
        }
        guard let link = shared.withLock({ $0.machine.primaryLink(for: peer) }) else {
            throw .notConnected("sendResource: peer \(peer) is not connected; nothing was sent")
        }
        let file: SequentialFile
        let size: UInt64
        do {
            file = try SequentialFile.openForReading(path)
            size = try file.size()
        } catch {
            throw .resource("sendResource: cannot read \(path): \(error.description)")
        }
        let key = Mutex<ResourceKey?>(nil)
        let progress = ResourceProgress(totalUnitCount: Int64(size)) { [weak self] in
            guard let self else { return }
            loop.execute { [self] in
                guard let k = key.withLock({ $0 }) else { return }
                performResources(io.value.resources.cancelOutgoing(k, error: .cancelled("the resource transfer was cancelled")))
            }
        }
        loop.execute { [self] in
            guard io.value.connections[link] != nil else {
                let error = PeerMeshError.notConnected("the connection closed before the resource was sent")
                progress.finish(error)
                completion?(error)
                return
            }
            let hasher: OpenSSL.SHA256
            do throws(OpenSSLError) {
                hasher = try OpenSSL.SHA256()
            } catch {
                file.close()
                let failure = PeerMeshError.resource("sendResource: cannot hash \(path): \(error.description)")
                progress.finish(failure)
                completion?(failure)
                return
            }
            let (k, actions) = io.value.resources.begin(on: link, size: size, name: name)
            key.withLock { $0 = k }
            io.value.outgoingResources[k] = OutgoingResource(file: file, hasher: hasher, progress: progress, completion: completion)
            performResources(actions)
        }
        return progress
    }

    // MARK: Loop

    /// Carries out the resource machine's actions, in order. Loop thread only; no lock is held.
    func performResources(_ actions: [ResourceStateMachine.Action]) {
        for action in actions {
            switch action {
            case .send(let link, let frame):
                io.value.connections[link]?.send(.resource(frame))
                noteQueue(link)
            case .pump(let link): pumpResources(on: link)
            case .sendEnd(let key): sendEnd(key)
            case .complete(let key, let error): completeOutgoing(key, error)
            case .open(let key, let peer, let name, let size): openIncoming(key, from: peer, name: name, size: size)
            case .write(let key, let bytes): writeIncoming(key, bytes)
            case .verify(let key, let hash): verifyIncoming(key, hash)
            case .deliver(let key): deliverIncoming(key)
            case .discard(let key, let error): discardIncoming(key, error)
            case .fault(let link, let fault): faulted(link, fault)
            }
        }
    }

    private func sendEnd(_ key: ResourceKey) {
        guard let out = io.value.outgoingResources[key] else { return }
        let hash: [UInt8]
        do throws(OpenSSLError) {
            hash = try out.hasher.finish()
        } catch {
            return performResources(io.value.resources.cancelOutgoing(key, error: .resource("hashing \(out.file.path): \(error.description)")))
        }
        io.value.connections[key.link]?.send(.resource(.end(id: key.id, sha256: hash)))
    }

    private func completeOutgoing(_ key: ResourceKey, _ error: PeerMeshError?) {
        guard let out = io.value.outgoingResources.removeValue(forKey: key) else { return }
        out.file.close()
        out.progress.finish(error)
        out.completion?(error)
    }

    private func writeIncoming(_ key: ResourceKey, _ bytes: [UInt8]) {
        guard let incoming = io.value.incomingResources[key] else { return }
        let failure: String? = bytes.withUnsafeBytes { raw -> String? in
            do throws(SyscallError) {
                try incoming.file.write(raw)
            } catch {
                return error.description
            }
            do throws(OpenSSLError) {
                try incoming.hasher.update(raw)
            } catch {
                return "hashing: \(error.description)"
            }
            return nil
        }
        if let failure {
            return performResources(io.value.resources.cancelIncoming(key, outcome: .storageFailed, text: failure))
        }
        incoming.progress.advance(by: bytes.count)
        // Every 4 MiB written by all transfers together, the disk is asked: under the reserve (other peers, or other
        // programs, filled it meanwhile), the transfer that wrote last fails, and so does each that writes after it
        // while there is no more room.
        io.value.resourceBytesUnchecked += bytes.count
        guard io.value.resourceBytesUnchecked >= Self.freeSpaceCheckInterval else { return }
        io.value.resourceBytesUnchecked = 0
        let reserve = configuration.resourceFreeSpaceReserve
        if let available = configuration.freeSpace(resourceDirectory), available < reserve {
            io.value.resourceBytesUnchecked = Self.freeSpaceCheckInterval  // and ask again at the next write
            let text = "the receiver's disk is full (it keeps \(reserve >> 20) MiB free)"
            performResources(io.value.resources.cancelIncoming(key, outcome: .storageFailed, text: text))
        }
    }

    /// Compares the hashes and, when they match, moves the file into place; then tells the machine.
    private func verifyIncoming(_ key: ResourceKey, _ hash: [UInt8]) {
        guard let incoming = io.value.incomingResources[key] else { return }
        let computed: [UInt8]
        do throws(OpenSSLError) {
            computed = try incoming.hasher.finish()
        } catch {
            // Not verified, so never moved into place.
            return performResources(io.value.resources.verified(key, outcome: .storageFailed, text: "hashing: \(error.description)"))
        }
        var outcome = ResourceOutcome.delivered
        var text = ""
        if computed != hash {
            outcome = .hashMismatch
        } else {
            incoming.file.close()
            do {
                try SequentialFile.rename(incoming.partialPath, to: incoming.finalPath)
            } catch {
                outcome = .storageFailed
                text = error.description
            }
        }
        performResources(io.value.resources.verified(key, outcome: outcome, text: text))
    }

    private func deliverIncoming(_ key: ResourceKey) {
        guard let incoming = io.value.incomingResources.removeValue(forKey: key) else { return }
        incoming.progress.finish(nil)
        if let s = owner.withLock({ $0.value }), let d = delegate.withLock({ $0.value }) {
            d.session(s, didFinishReceivingResourceWithName: incoming.name, fromPeer: incoming.peer,
                      at: URL(fileURLWithPath: incoming.finalPath), withError: nil)
        }
        // As in MC the file is the delegate's to move during the call; what is left is removed.
        TemporaryDirectory.remove(incoming.directory)
    }

    private func discardIncoming(_ key: ResourceKey, _ error: PeerMeshError) {
        guard let incoming = io.value.incomingResources.removeValue(forKey: key) else { return }
        incoming.file.close()
        TemporaryDirectory.remove(incoming.directory)
        incoming.progress.finish(error)
        if let s = owner.withLock({ $0.value }), let d = delegate.withLock({ $0.value }) {
            d.session(s, didFinishReceivingResourceWithName: incoming.name, fromPeer: incoming.peer, at: nil, withError: error)
        }
    }

    /// A peer starts a transfer: a directory of its own with the partial file, then the app hears of it. Refused
    /// first when the disk has no room for it, besides what the other transfers on its link still owe and the reserve.
    private func openIncoming(_ key: ResourceKey, from peer: PeerID, name: String, size: UInt64) {
        if let refusal = noRoom(for: key.link) {
            let actions = io.value.resources.cancelIncoming(key, outcome: .refused, text: refusal)
            return performResources(actions.filter { if case .discard = $0 { false } else { true } })
        }
        let incoming: IncomingResource
        do {
            let hasher = try OpenSSL.SHA256()
            let directory = try TemporaryDirectory.make(in: resourceDirectory, prefix: "peermesh-resource-")
            do {
                let file = try SequentialFile.create("\(directory)/.partial")
                let progress = ResourceProgress(totalUnitCount: Int64(size)) { [weak self] in
                    guard let self else { return }
                    loop.execute { [self] in
                        performResources(io.value.resources.cancelIncoming(key, outcome: .cancelled, text: ""))
                    }
                }
                incoming = IncomingResource(name: name, peer: peer, directory: directory, file: file, hasher: hasher,
                                            progress: progress)
            } catch {
                TemporaryDirectory.remove(directory)
                throw error
            }
        } catch {
            // No file, no delegate call: the sender hears why.
            let actions = io.value.resources.cancelIncoming(key, outcome: .storageFailed, text: String(describing: error))
            return performResources(actions.filter { if case .discard = $0 { false } else { true } })
        }
        io.value.incomingResources[key] = incoming
        if let s = owner.withLock({ $0.value }), let d = delegate.withLock({ $0.value }) {
            d.session(s, didStartReceivingResourceWithName: name, fromPeer: peer, with: incoming.progress)
        }
    }

    /// Why the transfers `link` is receiving now (the one starting among them: the machine counts it) cannot all be
    /// written while `resourceFreeSpaceReserve` stays free; nil when they can. Only that link's own transfers count:
    /// what a peer announces and never sends reserves nothing, so it cannot keep other peers' transfers out (the
    /// bytes written are checked as they come, `writeIncoming`). The text goes to the sender.
    private func noRoom(for link: LinkID) -> String? {
        let reserve = configuration.resourceFreeSpaceReserve
        guard let available = configuration.freeSpace(resourceDirectory) else { return "the receiver cannot tell its free space" }
        let (needed, overflow) = io.value.resources.owedIncomingBytes(on: link).addingReportingOverflow(reserve)
        guard overflow || needed > available else { return nil }
        return "not enough free space on the receiver (it keeps \(reserve >> 20) MiB free)"
    }

    /// Free space is read again after this many bytes of incoming resources were written.
    static let freeSpaceCheckInterval = 4 << 20

    /// Tops `link`'s queue up with chunks of its outgoing transfers, taking turns, up to the high-water mark.
    func pumpResources(on link: LinkID) {
        guard let connection = io.value.connections[link] else { return }
        var keys = io.value.resources.sending(on: link)
        var progressed = true
        while !keys.isEmpty, progressed, !connection.hasFailed, connection.queuedBytes < Self.resourceHighWater {
            progressed = false
            for key in keys {
                guard let out = io.value.outgoingResources[key], let remaining = io.value.resources.remaining(key) else { continue }
                let want = Int(min(remaining, UInt64(ResourceFrame.maximumChunk)))
                // One buffer for every chunk (taken out while it is filled, so it stays uniquely referenced and is
                // written in place): not a fresh zero-filled 64 KiB per chunk.
                var chunk: [UInt8] = []
                swap(&chunk, &io.value.resourceChunk)
                defer { swap(&chunk, &io.value.resourceChunk) }
                if chunk.count != ResourceFrame.maximumChunk { chunk = [UInt8](repeating: 0, count: ResourceFrame.maximumChunk) }
                var got = 0
                do {
                    while got < want {
                        let n = try chunk.withUnsafeMutableBytes { (raw) throws(SyscallError) in
                            try out.file.read(into: UnsafeMutableRawBufferPointer(rebasing: raw[got..<want]))
                        }
                        guard n > 0 else { break }
                        got += n
                    }
                } catch {
                    performResources(io.value.resources.cancelOutgoing(key, error: .resource("reading \(out.file.path): \(String(describing: error))")))
                    continue
                }
                guard got == want else {
                    performResources(io.value.resources.cancelOutgoing(key, error: .resource("\(out.file.path) shrank while it was being sent")))
                    continue
                }
                let hashFailure = chunk.withUnsafeBytes { raw -> OpenSSLError? in
                    do throws(OpenSSLError) {
                        try out.hasher.update(UnsafeRawBufferPointer(rebasing: raw[..<want]))
                        return nil
                    } catch {
                        return error
                    }
                }
                if let hashFailure {
                    performResources(io.value.resources.cancelOutgoing(key, error: .resource("hashing \(out.file.path): \(hashFailure.description)")))
                    continue
                }
                // The frame shares the buffer (a copy only for a short last chunk) and is encoded before this returns.
                connection.send(.resource(.chunk(id: key.id, bytes: want == chunk.count ? chunk : Array(chunk[..<want]))))
                out.progress.advance(by: want)
                performResources(io.value.resources.sent(want, of: key))
                progressed = true
            }
            keys = io.value.resources.sending(on: link)
        }
        // Written on, the connection asks for more when its queue drains; with nothing left to send it stops asking.
        // (A pass that moved nothing means the machine and the files disagree: our bug, never a peer's.)
        precondition(progressed || keys.isEmpty || connection.hasFailed || connection.queuedBytes >= Self.resourceHighWater,
                     "resource transfers on link \(link) are sending but have no file")
        connection.onSendSpace = keys.isEmpty ? nil : { [unowned self] in pumpResources(on: link) }
        noteQueue(link)
    }
}
