/// The host's side of the control protocol, as a pure state machine: which players are paused, whether the
/// microphone is muted, who talks back (one talker at a time), and the clip (who owns it, whether it is being
/// recorded, how the last one ended).
///
/// Each event is one `mutating` method that returns the actions for its driver (`RelayHost`) to perform: messages to
/// send, a player's audio to hold or release, a clip to open, finish or discard. Every command gets exactly one
/// reply; a malformed one is answered with an error and counted, and the session goes on. `Peer` is the driver's
/// name for a player (`PeerID`; tests use integers).
public struct HostControl<Peer: Hashable & Sendable>: Sendable {
    /// What the driver does.
    public enum Action: Sendable, Equatable {
        /// Send `message` to `peer` on the reliable channel.
        case send(Peer, ControlMessage)
        /// Stop (true) or resume (false) sending audio to `peer`.
        case setPaused(Peer, Bool)
        /// Open a clip: the pre-roll, then the live capture (or, with `prerollOnly`, the pre-roll alone, saved at
        /// once). Report the outcome with `clipOpened()` or `clipOpenFailed(_:)`.
        case openClip(prerollOnly: Bool)
        /// Finish the clip being recorded and save it (`clipSaved` or `clipFailed` follows).
        case finishClip
        /// Throw the clip being recorded away.
        case discardClip
        /// Play this player's talkback datagrams (nil: nobody's).
        case setTalker(Peer?)
        /// Half duplex: hold (true) or release the host's microphone to `peer` while it talks.
        case holdForTalk(Peer, Bool)
    }

    /// Exact counts.
    public struct Counters: Sendable, Equatable {
        /// Commands received (well-formed or not).
        public var commands: UInt64 = 0
        /// Replies sent (one per command).
        public var replies: UInt64 = 0
        /// Messages that did not decode, or were not commands.
        public var malformed: UInt64 = 0
        public init() {}
    }

    /// Where the clip stands.
    private enum Clip: Sendable, Equatable {
        /// The host keeps no clips.
        case disabled
        /// No clip is open; `last` is how the previous one ended (nil: none yet, or it was discarded).
        case idle(last: CaptureState?)
        /// `openClip` was asked for `owner`'s command `id`; the driver reports back.
        case opening(owner: Peer, id: UInt32)
        /// Recording for `owner`.
        case recording(owner: Peer)
        /// `finishClip` was asked; the driver reports the outcome.
        case saving
    }

    private let features: ControlFeatures
    private let fullDuplex: Bool
    private var talker: Peer?
    private var members: Set<Peer> = []
    private var paused: Set<Peer> = []
    private var muted = false
    private var clip: Clip
    /// The counters.
    public private(set) var counters = Counters()

    /// - Parameters:
    ///   - clips: whether the host keeps clips (`--clips DIR`).
    ///   - talk: whether it takes talkback (`--talk-output` or `--talk-device`).
    ///   - fullDuplex: whether a talker keeps hearing the host (`--talk-duplex full`); by default it does not, which
    ///     avoids echo without echo cancellation.
    public init(clips: Bool, talk: Bool = false, fullDuplex: Bool = false) {
        var f: ControlFeatures = .control
        if clips { f.insert(.clips) }
        if talk { f.insert(.talk) }
        features = f
        self.fullDuplex = fullDuplex
        clip = clips ? .idle(last: nil) : .disabled
    }

    /// What the host offers (for its TXT record).
    public var offered: ControlFeatures { features }

    /// Whether `peer` is paused.
    public func isPaused(_ peer: Peer) -> Bool { paused.contains(peer) }

    /// The clip state players see.
    public var captureState: CaptureState {
        switch clip {
        case .disabled: .off
        case .idle(let last): last ?? .armed
        case .opening, .saving: .recording
        case .recording: .recording
        }
    }

    /// Who talks back now.
    public var currentTalker: Peer? { talker }

    /// The state `peer` is told: held (`paused`) while it asked for a pause, or while it talks in half duplex; talkback
    /// accepted from it when the host takes talkback and nobody else talks.
    public func state(for peer: Peer) -> HostControlState {
        HostControlState(paused: paused.contains(peer) || (!fullDuplex && talker == peer), muted: muted,
                         talkAccepted: features.contains(.talk) && (talker == nil || talker == peer),
                         features: features, capture: captureState)
    }

    // MARK: Events

    /// `peer` joined: it is told the state.
    public mutating func joined(_ peer: Peer) -> [Action] {
        members.insert(peer)
        return [.send(peer, .state(state(for: peer)))]
    }

    /// `peer` left: it is forgotten (a clip it started goes on to its length, or until the host stops).
    public mutating func left(_ peer: Peer) -> [Action] {
        members.remove(peer)
        var actions: [Action] = []
        if paused.remove(peer) != nil { actions.append(.setPaused(peer, false)) }
        if talker == peer {
            talker = nil
            actions.append(.setTalker(nil))
            if !fullDuplex { actions.append(.holdForTalk(peer, false)) }
            actions += broadcast()
        }
        return actions
    }

    /// The operator muted or unmuted the microphone: every player is told.
    public mutating func setMuted(_ value: Bool) -> [Action] {
        guard muted != value else { return [] }
        muted = value
        return broadcast()
    }

    /// A reliable message from `peer`.
    public mutating func received(_ bytes: [UInt8], from peer: Peer) -> [Action] {
        counters.commands &+= 1
        let message: ControlMessage
        do {
            message = try ControlMessage.decode(bytes)
        } catch {
            counters.malformed &+= 1
            return [reply(peer, error.id ?? 0, .error(error.reason))]
        }
        guard case .command(let id, let command) = message else {
            counters.malformed &+= 1
            return [reply(peer, 0, .error("a player sends commands, not replies or state"))]
        }
        switch command {
        case .pause, .resume:
            let pause = command == .pause
            // Idempotent: pausing a paused player (or resuming a playing one) is answered ok and changes nothing.
            guard paused.contains(peer) != pause else { return [reply(peer, id, .ok)] }
            if pause { paused.insert(peer) } else { paused.remove(peer) }
            return [.setPaused(peer, pause), reply(peer, id, .ok), .send(peer, .state(state(for: peer)))]
        case .talk(let on):
            guard features.contains(.talk) else { return [reply(peer, id, .unsupported("this host takes no talkback"))] }
            if on {
                if talker == peer { return [reply(peer, id, .ok)] }
                guard talker == nil else { return [reply(peer, id, .busy)] }
                talker = peer
                return [.setTalker(peer)] + (fullDuplex ? [] : [.holdForTalk(peer, true)]) + [reply(peer, id, .ok)] + broadcast()
            }
            // Off: idempotent for a player that is not talking.
            guard talker == peer else { return [reply(peer, id, .ok)] }
            talker = nil
            return [.setTalker(nil)] + (fullDuplex ? [] : [.holdForTalk(peer, false)]) + [reply(peer, id, .ok)] + broadcast()
        case .capture(let phase, let action):
            return capture(phase, action, id: id, from: peer)
        }
    }

    private mutating func capture(_ phase: CapturePhase, _ action: CaptureAction, id: UInt32, from peer: Peer) -> [Action] {
        switch (phase, clip) {
        case (_, .disabled):
            return [reply(peer, id, .unsupported("this host keeps no clips (mesh-record --clips DIR)"))]
        case (.single, .idle), (.begin, .idle):
            clip = .opening(owner: peer, id: id)
            return [.openClip(prerollOnly: action == .secondary)]
        case (.single, _), (.begin, _):
            return [reply(peer, id, .busy)]
        case (.end, .recording(let owner)) where owner == peer:
            clip = .saving
            return [.finishClip, reply(peer, id, .ok)]
        case (.cancel, .recording(let owner)) where owner == peer:
            clip = .idle(last: nil)
            return [.discardClip, reply(peer, id, .ok)] + broadcast()
        case (.end, .recording), (.cancel, .recording):
            return [reply(peer, id, .error("the clip being recorded is another player's"))]
        case (.end, _), (.cancel, _):
            return [reply(peer, id, .error("no clip is being recorded"))]
        }
    }

    /// The driver opened the clip asked for: its owner is answered `recording`.
    public mutating func clipOpened() -> [Action] {
        guard case .opening(let owner, let id) = clip else { preconditionFailure("clipOpened() with no clip being opened") }
        clip = .recording(owner: owner)
        return [reply(owner, id, .recording)] + broadcast()
    }

    /// The clip asked for could not be opened.
    public mutating func clipOpenFailed(_ reason: String) -> [Action] {
        guard case .opening(let owner, let id) = clip else { preconditionFailure("clipOpenFailed() with no clip being opened") }
        clip = .idle(last: .failed(reason))
        return [reply(owner, id, .failed(reason))] + broadcast()
    }

    /// The clip was saved as `name` (after `finishClip`, or by itself: the clip length was reached, or it was the
    /// pre-roll alone).
    public mutating func clipSaved(_ name: String) -> [Action] {
        clipEnded(.saved(name))
    }

    /// Writing the clip failed (disk full, say).
    public mutating func clipFailed(_ reason: String) -> [Action] {
        clipEnded(.failed(reason))
    }

    private mutating func clipEnded(_ outcome: CaptureState) -> [Action] {
        switch clip {
        case .recording, .saving:
            clip = .idle(last: outcome)
            return broadcast()
        case .disabled, .idle, .opening:
            // A discarded clip's writer may still report: the discard already decided.
            return []
        }
    }

    // MARK: Helpers

    private mutating func reply(_ peer: Peer, _ id: UInt32, _ r: HostReply) -> Action {
        counters.replies &+= 1
        return .send(peer, .reply(id: id, r))
    }

    private func broadcast() -> [Action] {
        members.map { .send($0, .state(state(for: $0))) }
    }
}
