// mesh-chat: the MultipeerConnectivity demo, on PeerMesh. Every process advertises and browses one service; each
// pair of members found connects directly (the lower identity invites), so the room is a full mesh and a line goes
// straight to every member. Chat lines and member events go to stdout, diagnostics to stderr.
import Dispatch
import FoundationEssentials
import Glibc
import MeshCLI
import MeshPOSIX
import MeshRelay
import PeerMesh
import Synchronization

let options = ChatOptions.configurationFromCommandLine()
let terminal = Terminal(program: ChatOptions.program, quiet: false)
let device = DeviceState.open(options.state, name: options.name, terminal: terminal)

// `--pair CODE`: pair with the member showing the code (each side trusts the other from then on), then exit.
if case .code(let code) = options.pair {
    var config = PairingClient.Configuration(identity: device.identity, trust: device.trust, code: code, target: .discover(hostName: nil))
    config.serviceType = options.service
    config.bindHost = options.bind
    do {
        config.discovery = try AvahiDiscovery(log: { terminal.log(TerminalText.escape($0)) })
        switch try PairingClient(configuration: config, log: { terminal.log(TerminalText.escape($0)) }).run() {
        case .paired(let member, let name):
            let note = TerminalText.escape(storedNameNote(storedAs: name, given: member.displayName))
            terminal.error("paired with \(TerminalText.escape(member.displayName)) (\(member.publicKey?.shortFingerprint ?? "?"))\(note)")
            exit(0)
        case .failed(let why):
            terminal.fail("pairing failed: \(TerminalText.escape(why))")
        }
    } catch {
        terminal.fail("\(error)")
    }
}

/// What the room calls a member: the name it was paired under, so that a paired member cannot pass for another by
/// giving its name; or, for a member that is not paired (an open room), the name it gives, marked so.
struct Member: Sendable {
    let name: String
    let paired: Bool
    /// As printed (raw: escape it for a terminal).
    var label: String { paired ? name : "\(name) (not paired)" }
}

/// The room: the session, advertiser and browser delegate. Decides under its lock, acts after it.
final class Room: SessionDelegate, NearbyServiceAdvertiserDelegate, NearbyServiceBrowserDelegate, Sendable {
    private struct State {
        /// Members the browser sees now.
        var found: Set<PeerID> = []
        /// Members connected now, with what the room calls each (each joined and left line is printed once).
        var connected: [PeerID: Member] = [:]
        /// Files being sent, and how far each is.
        var sending: [ResourceProgress] = []
    }

    let me: PeerID
    let session: Session
    /// The pairing window (`--pair`).
    let pairing: PairingResponder
    private let state = Mutex(State())

    init(me: PeerID, session: Session, pairing: PairingResponder) {
        self.me = me
        self.session = session
        self.pairing = pairing
    }

    /// What the room calls `peer` (`Member`): noted when it joins, from the trust store.
    func member(_ peer: PeerID) -> Member {
        if let m = state.withLock({ $0.connected[peer] }) { return m }
        if let key = peer.publicKey, let entry = (try? device.trust.entry(for: key)) ?? nil { return Member(name: entry.name, paired: true) }
        return Member(name: peer.displayName, paired: false)
    }

    /// `member(peer).label`, escaped for the terminal.
    func label(_ peer: PeerID) -> String { TerminalText.escape(member(peer).label) }

    /// Whether `peer`'s key may be in the room.
    func admits(_ key: PublicKey?) -> Bool {
        if options.accept == .all { return true }
        guard let key else { return false }
        return (try? device.trust.contains(key)) ?? false
    }

    /// The lower identity of a pair invites, so two members never invite each other at once.
    private func invite(_ peer: PeerID, browser: NearbyServiceBrowser) {
        guard me.identity < peer.identity, state.withLock({ $0.found.contains(peer) }),
              session.state(of: peer) == .notConnected else { return }
        do { try browser.invitePeer(peer, to: session, withContext: nil, timeout: .seconds(10)) } catch {
            terminal.error("cannot invite \(TerminalText.escape(peer.displayName)): \(error)")
        }
    }

    // MARK: Browser

    let browser = Mutex<NearbyServiceBrowser?>(nil)

    func browser(_ browser: NearbyServiceBrowser, foundPeer peer: PeerID, withDiscoveryInfo info: [String: String]?) {
        guard peer != me, admits(peer.publicKey) else { return }
        state.withLock { _ = $0.found.insert(peer) }
        invite(peer, browser: browser)
    }

    func browser(_ browser: NearbyServiceBrowser, lostPeer peer: PeerID) {
        state.withLock { _ = $0.found.remove(peer) }
    }

    // MARK: Advertiser

    func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceiveInvitationFromPeer peer: PeerID, withContext context: Data?,
                    invitationHandler: @escaping @Sendable (Bool, Session?) -> Void) {
        invitationHandler(false, nil)  // not used: `didReceive invitation` below answers every invitation
    }

    func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceive invitation: Invitation) {
        if pairing.take(invitation, closedMessage: "no pairing window is open; open one with mesh-chat --pair") { return }
        let peer = invitation.peer
        guard admits(invitation.certificate?.publicKey) else {
            terminal.log("\(TerminalText.escape(peer.displayName)) is not paired with this device; not letting it in (mesh-chat --pair pairs; --accept all opens the room)")
            return invitation.decline(.notTrusted, message: "not paired with \(me.displayName): pair with mesh-chat --pair CODE")
        }
        invitation.accept(into: session)
    }

    // MARK: Session

    func session(_ session: Session, didReceiveCertificate certificate: PeerCertificate, fromPeer peer: PeerID,
                 certificateHandler: @escaping @Sendable (Bool) -> Void) {
        certificateHandler(admits(certificate.publicKey))
    }

    func session(_ session: Session, peer: PeerID, didChange state: SessionState) {
        switch state {
        case .connected:
            let m = member(peer)
            if self.state.withLock({ $0.connected.updateValue(m, forKey: peer) == nil }) {
                let alias = m.paired && m.name != peer.displayName ? " (calls itself \"\(TerminalText.escape(peer.displayName))\")" : ""
                terminal.stdout("* \(TerminalText.escape(m.label)) joined\(alias)")
            }
        case .notConnected:
            if let m = self.state.withLock({ $0.connected.removeValue(forKey: peer) }) { terminal.stdout("* \(TerminalText.escape(m.label)) left") }
            // Still advertised: try again shortly (it may have restarted).
            DispatchQueue.global().asyncAfter(deadline: .now() + 1) { [self] in
                if let b = browser.withLock({ $0 }) { invite(peer, browser: b) }
            }
        case .connecting: break
        }
    }

    func session(_ session: Session, didReceive data: Data, fromPeer peer: PeerID) {
        switch ChatMessage.decode(data) {
        case .room(let text): terminal.stdout("<\(label(peer))> \(text)")
        case .direct(let text): terminal.stdout("<\(label(peer)) to you> \(text)")
        case nil: terminal.error("dropped a message from \(label(peer)) that is not chat text")
        }
    }

    func session(_ session: Session, invitationTo peer: PeerID?, failedWith reason: DeclineReason, detail: String) {
        if reason != .simultaneousInvite, reason != .alreadyConnected {
            terminal.log("could not join \(TerminalText.escape(peer?.displayName ?? "a member")): \(detail)")
        }
    }

    func session(_ session: Session, didStartReceivingResourceWithName name: String, fromPeer peer: PeerID,
                 with progress: ResourceProgress) {
        terminal.log("receiving \(TerminalText.escape(name)) (\(progress.totalUnitCount) bytes) from \(label(peer))")
    }

    func session(_ session: Session, didFinishReceivingResourceWithName name: String, fromPeer peer: PeerID,
                 at localURL: URL?, withError error: PeerMeshError?) {
        // The name is the member's: shown escaped, like every other text from the network. The path it is kept at is
        // printed as it is, to be used: PeerMesh took the name only if it holds no control or invisible character.
        let shown = TerminalText.escape(name)
        guard let localURL else {
            return terminal.error("\(shown) from \(label(peer)) did not arrive: \(error.map(String.init(describing:)) ?? "?")")
        }
        do {
            let target = try ReceivedFile.keep(localURL.path, in: options.receiveDirectory, for: name)
            terminal.stdout("* received \(shown) from \(label(peer)): \(target)")
        } catch {
            terminal.error("cannot keep \(shown) from \(label(peer)) in \(options.receiveDirectory): \(error)")
        }
    }

    // MARK: Input

    /// Members now, by name.
    var members: [PeerID] {
        session.connectedPeers.map { ($0, member($0).label) }.sorted { ($0.1, $0.0.identity) < ($1.1, $1.0.identity) }.map(\.0)
    }

    func handle(_ input: ChatInput) {
        switch input {
        case .nothing: break
        case .invalid(let text): terminal.error(text)
        case .who:
            // A member reached only through another is marked: its link is relayed (still encrypted end to end).
            let names = members.map { label($0) + (session.isRelayed($0) ? " (relayed)" : "") }
            terminal.stdout("* members: \(names.joined(separator: ", "))")
        case .say(let text): send(.room(text), to: members)
        case .tell(let name, let text):
            // The member paired under that name, if one is: not another that gives the name.
            let named = members.map { ($0, member($0)) }.filter { $0.1.name.lowercased() == name.lowercased() }
            let to = (named.contains { $0.1.paired } ? named.filter { $0.1.paired } : named).map(\.0)
            if to.isEmpty { terminal.error("no member named \(name) (/who lists them)") } else { send(.direct(text), to: to) }
        case .send(let path): sendFile(path)
        case .quit: break
        }
    }

    private func send(_ message: ChatMessage, to peers: [PeerID]) {
        guard !peers.isEmpty else { return terminal.error("nobody is here yet: the line was not sent") }
        do { try session.send(message.encoded(), toPeers: peers, with: .reliable) } catch {
            terminal.error("not sent: \(error)")
        }
    }

    private func sendFile(_ path: String) {
        let peers = members
        guard !peers.isEmpty else { return terminal.error("nobody is here yet: \(path) was not sent") }
        let name = String(path.split(separator: "/").last ?? Substring(path))
        for peer in peers {
            do {
                let to = label(peer)
                let progress = try session.sendResource(at: URL(fileURLWithPath: path), withName: name, toPeer: peer) { error in
                    if let error { terminal.error("\(name) to \(to) failed: \(error)") } else {
                        terminal.log("sent \(name) to \(to)")
                    }
                }
                progress.setUpdateHandler { [self] _ in drawProgress() }
                state.withLock { $0.sending.append(progress) }
            } catch {
                return terminal.error("cannot send \(path): \(error)")
            }
        }
    }

    /// The progress bar of every file being sent (terminals only).
    private func drawProgress() {
        guard terminal.isTTY else { return }
        let (done, total) = state.withLock { s -> (Int64, Int64) in
            s.sending.removeAll { $0.isFinished }
            return (s.sending.reduce(0) { $0 + $1.completedUnitCount }, s.sending.reduce(0) { $0 + $1.totalUnitCount })
        }
        guard total > 0 else { return terminal.status("") }
        let width = 30, filled = Int(Double(width) * Double(done) / Double(total))
        terminal.status("sending [\(String(repeating: "#", count: filled))\(String(repeating: ".", count: width - filled))] \(done * 100 / total)%")
    }

    /// Files whose sending has not finished.
    var unfinishedSends: Int { state.withLock { s in s.sending.filter { !$0.isFinished }.count } }

    /// Waits (up to `seconds`) for the files being sent to finish.
    func waitForSends(seconds: Double) {
        let deadline = MonotonicClock.nowNanos() + UInt64(seconds * 1e9)
        while MonotonicClock.nowNanos() < deadline, unfinishedSends > 0 {
            usleep(20_000)
        }
    }
}

let me = device.identity.peerID
let session: Session
let advertiser: NearbyServiceAdvertiser
let browser: NearbyServiceBrowser
do {
    session = try Session(securityIdentity: device.identity,
                          configuration: .init(peerTimeout: .milliseconds(Int64(options.peerTimeout * 1000)), bindHost: options.bind))
    advertiser = try NearbyServiceAdvertiser(peer: me, discoveryInfo: nil, serviceType: options.service, bindHost: options.bind)
    browser = try NearbyServiceBrowser(peer: me, serviceType: options.service)
} catch {
    terminal.fail("\(error)")
}
let pairing: PairingResponder
do {
    pairing = try PairingResponder(identity: device.identity, trust: device.trust, bindHost: options.bind,
                                   notices: { terminal.error(TerminalText.escape($0)) }) { open in
        try? advertiser.updateDiscoveryInfo(open ? ["pair": "1"] : nil)
    }
} catch {
    terminal.fail("\(error)")
}
let room = Room(me: me, session: session, pairing: pairing)
session.delegate = room
advertiser.delegate = room
browser.delegate = room
room.browser.withLock { $0 = browser }
do {
    try advertiser.startAdvertisingPeer()
    try browser.startBrowsingForPeers()
} catch {
    terminal.fail("\(error)")
}
terminal.log("in the room \(options.service) as \(me.displayName) (key \(device.identity.publicKey.shortFingerprint))"
             + (options.accept == .all ? ", open to anyone" : ", paired members only (--accept all opens the room)"))
if options.pair == .window {
    let code = pairing.open(timeout: .milliseconds(Int64(options.pairTimeout * 1000)))
    terminal.error("pairing code: \(code) (type it on the other member: mesh-chat --name NAME --pair \(code))")
}

/// Set once the program is on its way out: a signal then leaves at once.
let leaving = Atomic<Bool>(false)
/// Held by whichever thread ends the program (the input's at its end, a signal's): one exit, never two at once.
let ending = Mutex(())

/// Leaves the room (GOODBYE to every member) and exits, once the files being sent have gone (10 minutes at the most)
/// or, when `waitingForSends` is false, at once: 0, or 1 if a file was not sent whole.
func leave(waitingForSends: Bool = true) -> Never {
    if waitingForSends {
        leaving.store(true, ordering: .relaxed)
        room.waitForSends(seconds: 600)
    }
    let unfinished = room.unfinishedSends
    ending.withLock { _ -> Never in
        advertiser.stopAdvertisingPeer()
        browser.stopBrowsingForPeers()
        pairing.stop()
        session.disconnect()
        usleep(200_000)  // let the GOODBYEs go out
        terminal.finish()
        if unfinished > 0 { terminal.error("left with \(unfinished) file(s) not sent whole") }
        exit(unfinished > 0 ? 1 : 0)
    }
}

// Ctrl-C leaves once the files being sent have gone, off the main queue so that it stays free: a second one (or one
// while the input's end waits for them) leaves at once.
let signals = SignalTrap { _ in
    if leaving.exchange(true, ordering: .relaxed) { leave(waitingForSends: false) }
    let unfinished = room.unfinishedSends
    if unfinished > 0 { terminal.error("leaving once \(unfinished) file(s) are sent (Ctrl-C again to leave now)") }
    DispatchQueue.global().async { leave() }
}
// stdin on its own thread: the main queue stays free for signals.
OSThread.detach(name: "pm-stdin") {
    while let line = readLine(strippingNewline: true) {
        let input = ChatInput(line: line)
        if input == .quit { break }
        room.handle(input)
    }
    leave()
}
withExtendedLifetime(signals) { dispatchMain() }
