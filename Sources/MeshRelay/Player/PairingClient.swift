import Dispatch
import FoundationEssentials
import MeshPOSIX
import PeerMesh
import Synchronization

/// The player's side of pairing: finds the host whose pairing window is open (TXT `pair=1`, or a direct address),
/// joins its pairing session, proves the code with the PAKE (`Pairing`), and on success trusts the host's key — the
/// host trusts the player's at the same moment. Then it leaves.
///
/// Found by discovery, hosts with an open window are tried one after another, in the order found, until one proves
/// the code: anyone on the LAN can advertise an open window (under the real host's name, even), and such a decoy,
/// found first, must not keep the player from the host that shows the code. A decoy learns nothing but that one
/// guess of the code was wrong (the PAKE); each host that failed is named in the outcome.
public final class PairingClient: SessionDelegate, NearbyServiceBrowserDelegate, Sendable {
    /// How pairing ended.
    public enum Outcome: Sendable, Equatable {
        /// Both sides now trust each other. `storedAs` is the name the trust store keeps it under: its display name,
        /// or that name with a suffix when another paired device has that name already (`TrustStore.add`).
        case paired(PeerID, storedAs: String)
        /// It did not work; the text says why (wrong code, window closed, no host, timed out…).
        case failed(String)
    }

    /// What pairing needs.
    public struct Configuration: Sendable {
        /// Who this player is: the key pair the host will remember, and the name it shows.
        public var identity: PeerIdentity
        /// Where the host's key is written once pairing succeeds.
        public var trust: TrustStore
        /// The code shown by the host (`1234-5678`; spaces and dashes do not matter).
        public var code: String
        /// Which host: by discovery (optionally by name or fingerprint), or at an address.
        public var target: JoinTarget
        /// When the code came from the host's QR code: the host's fingerprint (prefix), which the handshake must prove.
        public var expectedFingerprint: String?
        /// The service type hosts advertise.
        public var serviceType: String = "mesh-audio"
        /// Discovery backend; `nil` means Avahi.
        public var discovery: (any DiscoveryBackend)?
        /// Local address to use ("" = any).
        public var bindHost: String = ""
        /// How long it may take in all.
        public var timeout: Duration = .seconds(15)

        /// Pairing with the host `target` names, with the code it shows; every other setting keeps its default.
        public init(identity: PeerIdentity, trust: TrustStore, code: String, target: JoinTarget) {
            self.identity = identity
            self.trust = trust
            self.code = code
            self.target = target
        }
    }

    private struct State {
        /// Hosts found with an open window and not tried yet, in the order found.
        var candidates: [PeerID] = []
        /// The host being tried now (by discovery; a direct target has none).
        var current: PeerID?
        /// Counts the hosts made `current`, so that a timer set for one try does not act on a later one.
        var round = 0
        /// Hosts tried, and why each failed, in order.
        var failures: [(host: PeerID, why: String)] = []
        var initiator: Pairing.Initiator?
        /// The host whose proof (message 2's tag) checked out: only its "paired" is believed.
        var provenHost: PeerID?
        var outcome: Outcome?
        var seen: [PeerID: Bool] = [:]

        /// Whether `peer` has been tried or waits its turn.
        func knows(_ peer: PeerID) -> Bool {
            current == peer || candidates.contains(peer) || failures.contains { $0.host == peer }
        }
    }

    /// The configuration the client was made with.
    public let configuration: Configuration
    private let session: Session
    private let browser: NearbyServiceBrowser?
    private let state = Mutex(State())
    private let finished = WakeSignal()
    /// Per-host deadlines and the grace after the last failure.
    private let timers = DispatchQueue(label: "peermesh.pairing.timers")
    private let log: @Sendable (String) -> Void

    /// A client ready to pair (`run` does it); `log` gets one line per step.
    ///
    /// - Throws: what the session throws when it cannot be made (no socket, a bad identity).
    public init(configuration: Configuration, log: @escaping @Sendable (String) -> Void = { _ in }) throws {
        self.configuration = configuration
        self.log = log
        session = try Session(securityIdentity: configuration.identity,
                              configuration: .init(bindHost: configuration.bindHost, maximumMessageSize: 4096,
                                                   maximumResourceSize: 0, topology: .star))
        if case .discover = configuration.target {
            browser = try NearbyServiceBrowser(peer: configuration.identity.peerID, serviceType: configuration.serviceType,
                                               discovery: configuration.discovery)
        } else {
            browser = nil
        }
        session.delegate = self
        browser?.delegate = self
    }

    /// Pairs, waiting until it is done or `configuration.timeout` passes. Not on a session's I/O thread (from a
    /// delegate call, say): the answer arrives on that thread, so the wait would hold every session up until the
    /// timeout and then fail; that call fails at once instead.
    public func run() -> Outcome {
        if (try? EventLoop.shared())?.inLoop == true {
            return .failed("PairingClient.run() was called on the session I/O thread, which it waits on: call it from another thread")
        }
        do {
            try browser?.startBrowsingForPeers()
            if case .direct(let endpoint) = configuration.target {
                try session.connect(to: endpoint, context: RelayHost.pairingContext, timeout: configuration.timeout)
            }
        } catch {
            return .failed("\(error)")
        }
        _ = finished.wait(untilNanos: MonotonicClock.deadline(after: configuration.timeout.nanoseconds))
        browser?.stopBrowsingForPeers()
        session.disconnect()
        return state.withLock { s in
            if let o = s.outcome { return o }
            if case .discover(let name) = configuration.target, s.current == nil, s.failures.isEmpty {
                let others = s.seen.keys.map(\.displayName).sorted()
                let what = name.map { "host \"\($0)\" with an open pairing window" } ?? "host with an open pairing window"
                return .failed("no \(what) found" + (others.isEmpty ? "" : " (saw without one: \(others.joined(separator: ", ")))"))
            }
            return .failed("pairing timed out" + (s.failures.isEmpty ? "" : "; " + Self.summary(of: s.failures)))
        }
    }

    /// How long one host found by discovery may take, from the invitation to the end of the exchange, before the
    /// next is tried: a host that shows the code answers within a second; one that takes the invitation and then
    /// says nothing must not hold the player until the whole pairing times out.
    var perHostTimeout: Duration { min(configuration.timeout, .seconds(5)) }

    /// How long, after the last host found has failed, another may still be found before pairing gives up: the
    /// real host's record may resolve a moment after a decoy's (a flood of records delays it more).
    static let graceAfterLastFailure: Duration = .milliseconds(1_500)

    /// Why each host tried failed, in a line.
    private static func summary(of failures: [(host: PeerID, why: String)]) -> String {
        guard failures.count > 1 else { return failures.first?.why ?? "no host proved the code" }
        return "no host proved the code: " + failures.map { "\(label($0.host)): \($0.why)" }.joined(separator: "; ")
    }

    /// The host being tried failed for `why` (for a direct target, `peer` is whoever answered there): the next one
    /// found is tried; when none is left, pairing fails, naming each host tried — for a direct target at once, by
    /// discovery once `graceAfterLastFailure` has passed with no other host found.
    private func failed(_ peer: PeerID?, _ why: String) {
        guard case .discover = configuration.target else { return finish(.failed(why)) }
        let next = state.withLock { s -> (host: PeerID?, round: Int)? in
            guard s.outcome == nil, let peer, s.current == peer else { return nil }  // over, or an earlier host's late news
            s.failures.append((peer, why))
            s.initiator = nil
            s.provenHost = nil
            s.current = s.candidates.isEmpty ? nil : s.candidates.removeFirst()
            s.round += 1
            return (s.current, s.round)
        }
        guard let next, let peer else { return }
        session.disconnect(peer)
        if let host = next.host {
            log("\(Self.label(peer)) did not pair (\(why)); trying \(Self.label(host))…")
            invite(host, round: next.round)
            return
        }
        log("\(Self.label(peer)) did not pair (\(why))")
        timers.asyncAfter(deadline: .now() + .nanoseconds(Int(Self.graceAfterLastFailure.nanoseconds))) { [weak self] in
            guard let self else { return }
            // Decided under the lock that `foundPeer` takes: a host found meanwhile is being tried, and pairing goes on.
            let over = self.state.withLock { s -> Bool in
                guard s.outcome == nil, s.current == nil, s.round == next.round else { return false }
                s.outcome = .failed(Self.summary(of: s.failures))
                return true
            }
            if over { self.finished.signal() }
        }
    }

    /// A host as pairing lines name it: its name and key's fingerprint (a decoy can take the name, not the key).
    private static func label(_ peer: PeerID) -> String {
        peer.publicKey.map { "\(peer.displayName) (\($0.shortFingerprint))" } ?? peer.displayName
    }

    /// Invites `host` (now `current`, in `round`) into the pairing session, and gives it `perHostTimeout` to pair.
    private func invite(_ host: PeerID, round: Int) {
        guard let browser else { return }
        let limit = perHostTimeout
        timers.asyncAfter(deadline: .now() + .nanoseconds(Int(limit.nanoseconds))) { [weak self] in
            // A host that has proved the code is only storing the pairing: its answer is waited for (the whole
            // pairing's timeout still holds), so that it is not left trusting a player that gave up on it.
            guard let self, self.state.withLock({ $0.current == host && $0.round == round && $0.outcome == nil && $0.provenHost != host })
            else { return }
            self.failed(host, "no answer within \(limit)")
        }
        do { try browser.invitePeer(host, to: session, withContext: RelayHost.pairingContext, timeout: limit) } catch {
            failed(host, "\(error)")
        }
    }

    private func finish(_ outcome: Outcome) {
        let first = state.withLock { s -> Bool in
            guard s.outcome == nil else { return false }
            s.outcome = outcome
            return true
        }
        if first { finished.signal() }
    }

    // MARK: Delegates

    public func browser(_ browser: NearbyServiceBrowser, foundPeer peer: PeerID, withDiscoveryInfo info: [String: String]?) {
        let open = info?["pair"] == "1"
        if case .discover(let name?) = configuration.target, !JoinStateMachine.matches(peer, pairedName: nil, name: name) { return }
        if let fp = configuration.expectedFingerprint, !(peer.publicKey?.matches(fingerprintPrefix: fp) ?? false) { return }
        let go = state.withLock { s -> Int? in
            s.seen[peer] = open
            guard open, s.outcome == nil, !s.knows(peer) else { return nil }
            guard s.current == nil else {
                s.candidates.append(peer)  // its turn comes if the host being tried fails
                return nil
            }
            s.current = peer
            s.round += 1
            return s.round
        }
        guard let round = go else { return }
        log("pairing with \(Self.label(peer))…")
        invite(peer, round: round)
    }

    public func browser(_ browser: NearbyServiceBrowser, lostPeer peer: PeerID) {}

    public func session(_ session: Session, didReceiveCertificate certificate: PeerCertificate, fromPeer peer: PeerID,
                        certificateHandler: @escaping @Sendable (Bool) -> Void) {
        // The code proves the host; a fingerprint from its QR code must match as well.
        if let fp = configuration.expectedFingerprint { certificateHandler(certificate.publicKey.matches(fingerprintPrefix: fp)) }
        else { certificateHandler(true) }
    }

    /// Whether `peer` is the host being tried (for a direct target, whoever answered at its address).
    private func isCurrent(_ peer: PeerID) -> Bool {
        guard case .discover = configuration.target else { return true }
        return state.withLock { $0.current == peer }
    }

    public func session(_ session: Session, peer: PeerID, didChange state: SessionState) {
        guard isCurrent(peer) else { return }
        switch state {
        case .connected:
            guard let binding = session.channelBinding(for: peer) else { return failed(peer, "the link to \(peer.displayName) is not encrypted") }
            let initiator = Pairing.Initiator(code: configuration.code, binding: binding)
            self.state.withLock { $0.initiator = initiator }
            try? session.send(Data(initiator.firstMessage), toPeers: [peer], with: .reliable)
        case .notConnected:
            failed(peer, "\(peer.displayName) closed the pairing session")
        case .connecting:
            break
        }
    }

    public func session(_ session: Session, didReceive data: Data, fromPeer peer: PeerID) {
        guard isCurrent(peer) else { return }
        let m = Array(data)
        if let result = Pairing.result(m) {
            switch result {
            case .paired:
                // Anyone can say "paired": only a host that proved it knows the code (message 2) is trusted.
                guard state.withLock({ $0.provenHost == peer }) else {
                    return failed(peer, "\(peer.displayName) said the pairing succeeded without proving it knows the code: not trusted")
                }
                guard let key = peer.publicKey else { return failed(peer, "the host has no key") }
                let entry: TrustedPeer
                do { entry = try configuration.trust.add(key, name: peer.displayName) } catch { return finish(.failed("\(error)")) }
                finish(.paired(peer, storedAs: entry.name))
            case .wrongCode, .windowClosed, .notStored, .busy:
                failed(peer, result.description)
            }
            return
        }
        let answer = state.withLock { s -> Result<[UInt8], Pairing.Failure> in
            guard var i = s.initiator else { return .failure(.malformed) }
            defer { s.initiator = i }
            do throws(Pairing.Failure) {
                let m3 = try i.answer(m)
                s.provenHost = peer
                return .success(m3)
            } catch { return .failure(error) }
        }
        switch answer {
        case .success(let m3): try? session.send(Data(m3), toPeers: [peer], with: .reliable)
        case .failure(let e): failed(peer, e.description)
        }
    }

    public func session(_ session: Session, invitationTo peer: PeerID?, failedWith reason: DeclineReason, detail: String) {
        if let peer, !isCurrent(peer) { return }
        failed(peer ?? state.withLock { $0.current }, "\(peer?.displayName ?? "the host"): \(detail)")
    }
}

/// For a pairing line: `, as NAME (another paired device is called GIVEN)` when the trust store keeps a peer under
/// another name (`storedAs`) than the one it gave (that was taken), else nothing. Raw text: escape it for a terminal.
package func storedNameNote(storedAs name: String, given: String) -> String {
    name == given ? "" : ", as \(name) (another paired device is called \(given))"
}

extension TrustedPeer {
    /// `storedNameNote` for this entry, paired under the `given` name.
    package func storedNameNote(given: String) -> String { MeshRelay.storedNameNote(storedAs: name, given: given) }
}
