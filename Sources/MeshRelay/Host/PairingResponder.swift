import Dispatch
import FoundationEssentials
import MeshPOSIX
import PeerMesh
import Synchronization

/// The side of pairing that shows the code: a window that, while open, lets a peer that knows the code prove it
/// (CPace over the encrypted link, `Pairing.Responder`) and be added to the trust store. Used by `mesh-record --pair`
/// (through `RelayHost`) and `mesh-chat --pair`; the other side is `PairingClient`.
///
/// Peers that pair join a session of their own (`session`), never the app's: an advertiser hands it the
/// invitations whose context is `PairingResponder.context` (`take(_:)`).
public final class PairingResponder: SessionDelegate, Sendable {
    /// The invitation context of a peer that comes to pair.
    public static let context = Data("PMPAIR1".utf8)

    private struct Window {
        let code: String
        let deadline: Nanos
        var failures = 0
        let maximumFailures: Int
    }

    private struct State {
        var window: Window?
        var responders: [PeerID: Pairing.Responder] = [:]
    }

    /// The pairing session: peers that pair join it, exchange the PAKE, and leave.
    public let session: Session
    private let trust: TrustStore
    private let notices: @Sendable (String) -> Void
    private let windowChanged: @Sendable (Bool) -> Void
    private let state = Mutex(State())
    private let timers = DispatchQueue(label: "peermesh.pairing-responder.timers")

    /// - Parameters:
    ///   - notices: lines for the person who opened the window (paired, a wrong code, the window closing);
    ///   - windowChanged: the window opened (true) or closed (false): advertise `pair=1` meanwhile.
    public init(identity: PeerIdentity, trust: TrustStore, peerTimeout: Duration = .seconds(2), bindHost: String = "",
                notices: @escaping @Sendable (String) -> Void, windowChanged: @escaping @Sendable (Bool) -> Void) throws {
        var configuration = Session.Configuration(maximumPeers: 4, peerTimeout: peerTimeout, bindHost: bindHost,
                                                  maximumMessageSize: 4096, maximumPeersPerHost: 2, maximumResourceSize: 0,
                                                  topology: .star)
        configuration.admissionForgivesTry = false
        session = try Session(securityIdentity: identity, configuration: configuration)
        self.trust = trust
        self.notices = notices
        self.windowChanged = windowChanged
        session.delegate = self
    }

    /// Opens the window: peers that know `code` (a fresh 8-digit one by default) may pair until `timeout` passes or
    /// `maximumFailures` wrong codes have been tried. Returns the code.
    @discardableResult
    public func open(code: String = Pairing.newCode(), timeout: Duration = .seconds(30), maximumFailures: Int = 3) -> String {
        state.withLock {
            $0.window = Window(code: code, deadline: MonotonicClock.deadline(after: timeout.nanoseconds), maximumFailures: maximumFailures)
        }
        windowChanged(true)
        timers.asyncAfter(deadline: .now() + .nanoseconds(Int(clamping: timeout.nanoseconds))) { [weak self] in
            guard let self else { return }
            let expired = self.state.withLock { s -> Bool in
                guard let w = s.window, w.code == code, MonotonicClock.nowNanos() >= w.deadline else { return false }
                s.window = nil
                return true
            }
            if expired { self.close(why: "timed out") }
        }
        return code
    }

    /// Whether the window is open.
    public var isOpen: Bool { state.withLock { $0.window != nil } }

    /// Answers `invitation` if it comes to pair: into the pairing session while the window is open, declined with
    /// `closedMessage` otherwise. Returns false for any other invitation (the caller answers it).
    public func take(_ invitation: Invitation, closedMessage: String) -> Bool {
        guard invitation.context == Self.context else { return false }
        if isOpen { invitation.accept(into: session) } else { invitation.decline(.declined, message: closedMessage) }
        return true
    }

    /// Closes the window and says goodbye to every pairing peer.
    public func stop() { session.disconnect() }

    private func close(why: String) {
        notices("pairing window closed (\(why))")
        windowChanged(false)
        session.disconnect()
    }

    // MARK: The exchange

    /// A pairing message from `peer`.
    ///
    /// Every answer to a first message (message 2) lets its peer check one guess of the code offline, whether or not
    /// it ever sends message 3. So answers in flight count against the wrong codes the window has left: with one
    /// wrong code left, one exchange at a time; an exchange that ends without proof (message 3 wrong, or the peer
    /// gone) is a wrong code.
    private func message(_ m: [UInt8], from peer: PeerID) {
        enum Next { case reply([UInt8]), paired, failed(closedAfter: Int?), closed, busy, ignore }
        let binding = session.channelBinding(for: peer)
        let next = state.withLock { s -> Next in
            guard let window = s.window else { return .closed }
            guard let responder = s.responders.removeValue(forKey: peer) else {
                guard let binding else { return .ignore }
                guard window.failures + s.responders.count < window.maximumFailures else { return .busy }
                var responder = Pairing.Responder(code: window.code, binding: binding)
                guard let m2 = try? responder.answer(m) else { return .ignore }
                s.responders[peer] = responder
                return .reply(m2)
            }
            do {
                try responder.verify(m)
                return .paired
            } catch {
                return .failed(closedAfter: Self.countFailure(&s))
            }
        }
        func answer(_ r: Pairing.Result) { try? session.send(Data(Pairing.resultMessage(r)), toPeers: [peer], with: .reliable) }
        switch next {
        case .ignore:
            session.disconnect(peer)
        case .reply(let m2):
            try? session.send(Data(m2), toPeers: [peer], with: .reliable)
        case .paired:
            // Paired only once its key is stored: a player told "paired" by a host that forgot it would be refused
            // at its next join, with nothing to say why.
            let entry: TrustedPeer
            do {
                guard let key = peer.publicKey else { throw PeerMeshError.trust("its link proved no key") }
                entry = try trust.add(key, name: peer.displayName)
            } catch {
                answer(.notStored)
                return notices("pairing with \(peer.displayName) failed: its key could not be stored: \(error)")
            }
            answer(.paired)
            notices("paired \(peer.displayName) (\(peer.publicKey?.shortFingerprint ?? "?"))\(entry.storedNameNote(given: peer.displayName))")
        case .failed(let closedAfter):
            answer(.wrongCode)
            notices("pairing attempt by \(peer.displayName) failed: wrong code")
            if let n = closedAfter { close(why: "\(n) wrong codes") }
        case .closed:
            answer(.windowClosed)
            notices("pairing attempt by \(peer.displayName) came after the window closed")
        case .busy:
            answer(.busy)
            notices("pairing attempt by \(peer.displayName) turned away: other attempts hold the wrong codes left")
        }
    }

    /// One more wrong code: the window closes after its limit. Returns the limit when it did.
    private static func countFailure(_ s: inout State) -> Int? {
        guard let window = s.window else { return nil }
        s.window!.failures += 1
        guard s.window!.failures >= window.maximumFailures else { return nil }
        s.window = nil
        return window.maximumFailures
    }

    /// A pairing peer left: if it saw our answer but never proved the code, that was a failed guess.
    private func peerLeft(_ peer: PeerID) {
        let outcome = state.withLock { s -> Int?? in
            guard s.responders.removeValue(forKey: peer) != nil, s.window != nil else { return nil }
            return .some(Self.countFailure(&s))
        }
        guard let closedAfter = outcome else { return }
        notices("pairing attempt by \(peer.displayName) failed: wrong code")
        if let n = closedAfter { close(why: "\(n) wrong codes") }
    }

    public func session(_ session: Session, peer: PeerID, didChange state: SessionState) {
        if state == .notConnected { peerLeft(peer) }
    }

    public func session(_ session: Session, didReceive data: Data, fromPeer peer: PeerID) {
        message(Array(data), from: peer)
    }
}
