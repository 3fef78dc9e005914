import MeshPOSIX
import Synchronization

// How `SessionCore` takes in a peer: the invitee adopting an accepted invitation (per-host limit, certificate
// check, then the state machine), and the initiator judging the key its handshake proved.

extension SessionCore {
    /// Takes over a connection whose invitation the app accepted into this session. An encrypted link's key goes
    /// to the delegate's certificate check first; a peer over the per-host limit is declined. `onAdmitted` runs once
    /// the caller is in (not when it is turned away after all), unless this session's admissions forgive no tries.
    /// `introduction`: the member's introduction the caller came by (an introduced link, docs/PROTOCOL.md §3.8).
    /// Loop thread only.
    func adopt(_ connection: Connection, from peer: PeerID, invite: ControlFrame.InviteBody, listenerPort: UInt16,
               introduction: MembershipStateMachine.Introduction? = nil, onAdmitted: @escaping () -> Void = {}) {
        func decline(_ reason: DeclineReason, _ text: String) {
            connection.send(.decline(reason, text))
            connection.close()
        }
        if shared.withLock({ $0.shutDown }) { return decline(.unavailable, DeclineReason.unavailable.description) }
        if preference == .required, !connection.isEncrypted {
            return decline(.declined, "this session requires encryption")
        }
        let hostKey = connection.remote?.hostBytes ?? []
        let sameHost = io.value.connections.values.filter { $0.remote?.hostBytes == hostKey }.count
            + io.value.admitting[hostKey, default: 0]
        if sameHost >= configuration.maximumPeersPerHost {
            return decline(.peerLimit, "too many peers from \(connection.remote?.host ?? "one address") (at most \(configuration.maximumPeersPerHost))")
        }
        connection.setMaximumFrameLength(max(configuration.maximumMessageSize + 1, ResourceFrame.maximumFrameLength))
        connection.maximumQueued = 2 * configuration.maximumQueuedBytes
        guard connection.isEncrypted, let key = peer.publicKey else {
            return admit(connection, from: peer, invite: invite, listenerPort: listenerPort, introduction: introduction,
                         onAdmitted: onAdmitted)
        }
        // The app judges the proven key; the connection waits (its own frames are not read meanwhile), and holds
        // its place against the per-host limit. It is ours now: a hang-up meanwhile must not reach the advertiser.
        connection.hold()
        io.value.judged[ObjectIdentifier(connection)] = connection
        io.value.admitting[hostKey, default: 0] += 1
        let certificate = PeerCertificate(publicKey: key, shortAuthenticationString: connection.shortAuthenticationString ?? "",
                                          address: connection.remote?.host, weInvited: false)
        // An app that never answers must not hold the guest's place for ever: past the invitation's own timeout
        // (as the advertiser reckons it) the guest has given up, and the answer is no.
        let wait = invite.timeoutMillis == 0 ? Self.defaultInvitationWait
            : min(UInt64(invite.timeoutMillis) * 1_000_000, Self.maximumCertificateWait)
        askCertificate(certificate, from: peer, timeout: wait) { [self] ok in
            let c = connection
            io.value.judged[ObjectIdentifier(c)] = nil
            io.value.admitting[hostKey, default: 1] -= 1
            if io.value.admitting[hostKey] == 0 { io.value.admitting[hostKey] = nil }
            // The guest left while the app judged its key: nothing to admit or to decline.
            if c.hasEnded { return }
            switch ok {
            case true?:
                admit(c, from: peer, invite: invite, listenerPort: listenerPort, introduction: introduction, onAdmitted: onAdmitted)
            case false?: decline(.declined, "certificate rejected: \(peer.displayName)'s key \(key.shortFingerprint) is not trusted")
            case nil: decline(.timedOut, "the host's app did not answer the certificate check in time")
            }
        }
    }

    func admit(_ connection: Connection, from peer: PeerID, invite: ControlFrame.InviteBody, listenerPort: UInt16,
               introduction: MembershipStateMachine.Introduction? = nil, onAdmitted: () -> Void = {}) {
        let token = Sodium.randomUInt64() | 1
        let acceptPort: UInt16 = udpPort == listenerPort ? 0 : udpPort
        let adopted = shared.withLock { s -> (LinkID, [SessionStateMachine.Action])? in
            guard !s.shutDown else { return nil }
            let id = s.nextLink
            s.nextLink += 1
            return (id, s.machine.invitationAccepted(link: id, from: peer, remoteUDPPort: invite.udpPort,
                                                     remoteToken: invite.token, acceptUDPPort: acceptPort,
                                                     localToken: token, now: MonotonicClock.nowNanos()))
        }
        guard let (link, actions) = adopted else {
            connection.send(.decline(.unavailable, DeclineReason.unavailable.description))
            connection.close()
            return
        }
        io.value.connections[link] = connection
        io.value.localTokens[link] = token
        // Before `actions` report the peer connected (the membership reads it then); gone when the link ends.
        if let introduction { io.value.introducedLinks[link] = introduction }
        // The machine may still turn the caller away (peer limit, already connected, a simultaneous invitation): then
        // its try stays charged and it learns no digits.
        let letIn = actions.contains { if case .linkUp(link, _, _, _) = $0 { true } else { false } }
        if letIn, configuration.admissionForgivesTry { onAdmitted() }
        // Let in: the inviter gets the digits now if no one was shown them at the invitation — after the limits and
        // the certificate check, so a caller turned away never learns them; before ACCEPT, which `actions` sends, and
        // in the same write. The acceptance first (ACCEPT sent, the app told of `connecting` then `connected`), and
        // only then the frames the guest sent behind its INVITE, which `rehome` delivers at once: a GOODBYE among them
        // must end a peer the app already knows as connected, not one it will be told about afterwards and then keep
        // forever.
        connection.corked {
            if letIn { connection.revealNonce() }
            perform(actions)
        }
        connection.rehome(onFrame: { [unowned self] f in received(f, on: link) },
                          onEnd: { [unowned self] why in ended(link, why) })
    }

    /// How long an invitee's certificate check may wait for the app when the invitation names no timeout (as the
    /// advertiser waits for its answer), and at the most.
    static let defaultInvitationWait: Nanos = 30_000_000_000
    static let maximumCertificateWait: Nanos = 60_000_000_000

    /// Asks the delegate about a proven key; `decide` runs on the loop, once, with the answer: nil when `timeout`
    /// passed first (a session without a delegate accepts, as MC does). Loop thread only.
    func askCertificate(_ certificate: PeerCertificate, from peer: PeerID, timeout: Nanos? = nil,
                                decide: @escaping (Bool?) -> Void) {
        let answered = Atomic<Bool>(false)
        let box = LoopBound<((Bool?) -> Void)?>(decide, loop: loop)
        let expiry = LoopBound<EventLoop.Timer?>(nil, loop: loop)
        let resolve: @Sendable (Bool?) -> Void = { [weak self] ok in
            guard answered.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged,
                  let self else { return }
            self.loop.execute { [loop = self.loop] in
                if let t = expiry.value { loop.cancel(t) }
                expiry.value = nil
                let d = box.value
                box.value = nil
                d?(ok)
            }
        }
        guard let s = owner.withLock({ $0.value }), let d = delegate.withLock({ $0.value }) else { return resolve(true) }
        if let timeout { expiry.value = loop.schedule(at: MonotonicClock.deadline(after: timeout)) { resolve(nil) } }
        d.session(s, didReceiveCertificate: certificate, fromPeer: peer, certificateHandler: { ok in resolve(ok) })
    }

    /// Initiator: the handshake proved who answered. Check the key against the advertised one, then ask the
    /// delegate; on yes the handshake finishes and the invitation goes out.
    func identified(_ peer: PeerID, on link: LinkID) {
        guard let c = io.value.connections[link], let key = peer.publicKey else { return }
        if let pinned = io.value.expectedKeys[link]?.key, pinned != key {
            return faulted(link, .wrongPeer)
        }
        reachedAttempt(on: link)
        // No digits yet: the advertiser opens its share only once its app shows them or lets us in (`tell`).
        let certificate = PeerCertificate(publicKey: key, shortAuthenticationString: "", address: c.remote?.host,
                                          weInvited: true)
        c.onShortAuthenticationString = { [unowned self] digits in tell(digits, from: peer) }
        askCertificate(certificate, from: peer) { [self] ok in
            guard io.value.connections[link] != nil else { return }
            if ok == true {
                finishHandshake(link, with: peer, rationed: io.value.expectedKeys[link]?.fromConnectionData != true)
            } else {
                io.value.failureDetail[link] = "certificate rejected: \(peer.displayName)'s key \(key.shortFingerprint) is not trusted"
                io.value.failureReason[link] = .notTrusted
                let actions = shared.withLock { $0.machine.linkClosed(link) }
                perform(actions)
            }
        }
    }

    /// Initiator: the app approved the peer on `link`; send message 3, which opens our share of the digits, now or
    /// (`rationed`) when the ration of such shares given away unanswered allows (`InviterShareRation`).
    private func finishHandshake(_ link: LinkID, with peer: PeerID, rationed: Bool) {
        guard rationed else { return finishHandshakes([link]) }
        // The peer connected through another link while the app was asked: it could only decline this one.
        if shared.withLock({ $0.machine.state(of: peer) }) == .connected { return endSuperseded([link], by: peer) }
        let destination = io.value.connections[link]?.remote?.hostBytes ?? []
        switch io.value.shares.approved(link, peer: peer, destination: destination, now: MonotonicClock.nowNanos()) {
        case .open:
            finishHandshakes([link])
        case .wait:
            counters.add { $0.pacedInvitations += 1 }
            armTimer()
        }
    }

    /// Initiator: sends message 3 on each of `links`, whose turn in the ration of our shares has come.
    func finishHandshakes(_ links: [LinkID]) {
        for l in links { io.value.connections[l]?.approve() }
    }

    /// Initiator: `peer` connected through another link while the handshakes on `links` waited for the app's
    /// approval or for their turn; they end unfinished, as already connected (the peer could only decline them, and
    /// message 3 would give a share of our digits away for nothing).
    func endSuperseded(_ links: [LinkID], by peer: PeerID) {
        for l in links {
            let actions = shared.withLock { $0.machine.linkClosed(l) }
            guard !actions.isEmpty else { continue }
            io.value.failureReason[l] = .alreadyConnected
            io.value.failureDetail[l] = "already connected to \(peer.displayName) through another link (this invitation's handshake was not finished)"
            perform(actions)
        }
    }

    /// Initiator: the advertiser opened its share of the digits (its app showed them, or its session let us in);
    /// tell the delegate what its screen shows.
    private func tell(_ digits: String, from peer: PeerID) {
        guard let s = owner.withLock({ $0.value }), let d = delegate.withLock({ $0.value }) else { return }
        d.session(s, didReceiveShortAuthenticationString: digits, fromPeer: peer)
    }
}
