/// The host's side of the control protocol, as a pure state machine: which players are paused, whether the
/// microphone is muted, who talks back (one talker at a time), and the clip (who owns it, whether it is being
/// recorded, how the last one ended).
///
/// Each event is one `mutating` method that returns the actions for its driver (`RelayHost`) to perform: messages to
/// send, a player's audio to hold or release, a clip to open, finish or discard. Every command gets exactly one
/// reply; a malformed one is answered with an error and counted, and the session goes on. `Peer` is the driver's
/// name for a player (`PeerID`; tests use integers).
///
/// Clips are numbered: every clip action carries the number of the clip it is for, and the driver reports each
/// clip's end with that number. The clip recorder reports on its own thread, so a report can arrive after a later
/// command changed the clip (a clip that reached its length while its owner cancelled it); a report is applied only
/// to the clip it names, and a cancel is answered only once the recorder says whether it discarded the clip or had
/// saved it already.
///
/// Each player may start clips within a quota (`ClipQuota`: 4 at once, then one every 10 s, by default); a start over
/// it is answered `failed` with when to try again, and counted. The quota is kept by `Peer` and outlives a player's
/// leaving: one that leaves and joins again finds it as it left it. For `RelayHost` a `Peer` is a `PeerID`, equal to
/// another exactly when their keys are, so this holds for a paired player (whose key the handshake proves); a player
/// of an unencrypted session names its own identity, and could come back as another. A player's quota is forgotten
/// once it has left and its quota has refilled, when a new one would be the same.
public struct HostControl<Peer: Hashable & Sendable>: Sendable {
    /// What the driver does.
    public enum Action: Sendable, Equatable {
        /// Send `message` to `peer` on the reliable channel.
        case send(Peer, ControlMessage)
        /// Stop (true) or resume (false) sending audio to `peer`.
        case setPaused(Peer, Bool)
        /// Open clip number `clip`: the pre-roll, then the live capture (or, with `prerollOnly`, the pre-roll alone,
        /// saved at once). Report the outcome with `clipOpened(_:)` or `clipOpenFailed(_:reason:)`, and later how it
        /// ended with `clipSaved`, `clipFailed` or `clipDiscarded`.
        case openClip(clip: UInt64, prerollOnly: Bool)
        /// Finish clip `clip`, if it is still being recorded, and save it (`clipSaved` or `clipFailed` follows).
        case finishClip(clip: UInt64)
        /// Throw clip `clip` away, if it is still being recorded (`clipDiscarded` follows), or else report how it
        /// ended already.
        case discardClip(clip: UInt64)
        /// Play this player's talkback datagrams (nil: nobody's).
        case setTalker(Peer?)
        /// Half duplex: hold (true) or release the host's microphone to `peer` while it talks.
        case holdForTalk(Peer, Bool)
        /// `peer`'s clip quota refused a clip it asked for (the reply tells it, with when to try again): log it. The
        /// driver keeps such lines to a few a second, since a player can ask as fast as its command budget allows.
        case clipRefused(Peer, retryInSeconds: UInt64)
    }

    /// Exact counts.
    public struct Counters: Sendable, Equatable {
        /// Commands received (well-formed or not).
        public var commands: UInt64 = 0
        /// Replies sent (one per command).
        public var replies: UInt64 = 0
        /// Messages that did not decode, or were not commands.
        public var malformed: UInt64 = 0
        /// Clip starts refused because their player was over its clip quota, every player together (players that
        /// left included).
        public var refusedClips: UInt64 = 0
        public init() {}
    }

    /// Where the clip stands; `clip` is the number of the clip in hand.
    private enum Clip: Sendable, Equatable {
        /// The host keeps no clips.
        case disabled
        /// No clip is open; `last` is how the previous one ended (nil: none yet, or it was discarded).
        case idle(last: CaptureState?)
        /// `openClip` was asked for `owner`'s command `id`; the driver reports back.
        case opening(clip: UInt64, owner: Peer, id: UInt32)
        /// Recording for `owner`.
        case recording(clip: UInt64, owner: Peer)
        /// `finishClip` was asked; the driver reports the outcome.
        case saving(clip: UInt64)
        /// `owner` cancelled with command `id` and `discardClip` was asked: the answer waits for the recorder's word
        /// (discarded, or saved already because the clip reached its length first).
        case discarding(clip: UInt64, owner: Peer, id: UInt32)
    }

    /// How a clip ended, as the driver reports it.
    private enum ClipEnding {
        case saved(String)
        case failed(String)
        case discarded
    }

    /// What the host offers now (talkback is withdrawn when its output ends).
    private var features: ControlFeatures
    /// Why talkback ended, once its output failed: it is no longer offered, and asked for anyway it is refused so.
    private var talkbackLost: String?
    private let fullDuplex: Bool
    private var talker: Peer?
    private var members: Set<Peer> = []
    private var paused: Set<Peer> = []
    private var muted = false
    private var clip: Clip
    /// The number of the latest clip opened (the first is 1).
    private var lastClipNumber: UInt64 = 0
    /// How many clips each player may start.
    private let clipQuota: ClipQuota
    /// Each player's clip quota, by `Peer`: kept when it leaves, until it has refilled (a missing one is full).
    private var clipCredit: [Peer: TokenBucket] = [:]
    /// Clip starts refused to each connected player since it joined.
    private var refusedClipsByPlayer: [Peer: UInt64] = [:]
    /// The counters.
    public private(set) var counters = Counters()

    /// - Parameters:
    ///   - clips: whether the host keeps clips (`--clips DIR`).
    ///   - talk: whether it takes talkback (`--talk-output` or `--talk-device`).
    ///   - fullDuplex: whether a talker keeps hearing the host (`--talk-duplex full`); by default it does not, which
    ///     avoids echo without echo cancellation.
    ///   - clipQuota: how many clips each player may start.
    public init(clips: Bool, talk: Bool = false, fullDuplex: Bool = false, clipQuota: ClipQuota = .default) {
        var f: ControlFeatures = .control
        if clips { f.insert(.clips) }
        if talk { f.insert(.talk) }
        features = f
        self.fullDuplex = fullDuplex
        self.clipQuota = clipQuota
        clip = clips ? .idle(last: nil) : .disabled
    }

    /// What the host offers now (for its TXT record): talkback no longer once its output ended.
    public var offered: ControlFeatures { features }

    /// Whether `peer` is paused.
    public func isPaused(_ peer: Peer) -> Bool { paused.contains(peer) }

    /// The clip state players see.
    public var captureState: CaptureState {
        switch clip {
        case .disabled: .off
        case .idle(let last): last ?? .armed
        case .opening, .recording, .saving, .discarding: .recording
        }
    }

    /// Who talks back now.
    public var currentTalker: Peer? { talker }

    /// `peer`'s clip starts refused since it joined, because it was over its clip quota.
    public func refusedClips(by peer: Peer) -> UInt64 { refusedClipsByPlayer[peer] ?? 0 }

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

    /// `peer` left: it is forgotten (a clip it started goes on to its length, or until the host stops), but for its
    /// clip quota, which it finds as it left it if it comes back.
    public mutating func left(_ peer: Peer) -> [Action] {
        members.remove(peer)
        refusedClipsByPlayer[peer] = nil
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

    /// The talkback output ended (its device failed, its file could not be written): the talker, if any, is
    /// released (and no longer held, in half duplex), talkback is no longer offered, and every player is told.
    public mutating func talkbackEnded(_ reason: String) -> [Action] {
        guard features.contains(.talk) else { return [] }
        features.remove(.talk)
        talkbackLost = reason
        var actions: [Action] = []
        if let released = talker {
            talker = nil
            actions.append(.setTalker(nil))
            if !fullDuplex { actions.append(.holdForTalk(released, false)) }
        }
        return actions + broadcast()
    }

    /// A reliable message from `peer`, at `now` (monotonic nanoseconds: the time its clip quota is reckoned at).
    public mutating func received(_ bytes: [UInt8], from peer: Peer, now: UInt64) -> [Action] {
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
            if on, let why = talkbackLost { return [reply(peer, id, .error("talkback is unavailable: \(why)"))] }
            guard features.contains(.talk) || talkbackLost != nil else { return [reply(peer, id, .unsupported("this host takes no talkback"))] }
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
            return capture(phase, action, id: id, from: peer, now: now)
        }
    }

    private mutating func capture(_ phase: CapturePhase, _ action: CaptureAction, id: UInt32, from peer: Peer,
                                  now: UInt64) -> [Action] {
        switch (phase, clip) {
        case (_, .disabled):
            return [reply(peer, id, .unsupported("this host keeps no clips (mesh-record --clips DIR)"))]
        case (.single, .idle), (.begin, .idle):
            if let wait = takeClip(peer, now: now) {
                counters.refusedClips &+= 1
                refusedClipsByPlayer[peer, default: 0] &+= 1
                let seconds = wait / 1_000_000_000 + (wait % 1_000_000_000 == 0 ? 0 : 1)
                return [.clipRefused(peer, retryInSeconds: seconds), reply(peer, id, .failed("too many clips: try again in \(seconds) s"))]
            }
            lastClipNumber &+= 1
            clip = .opening(clip: lastClipNumber, owner: peer, id: id)
            return [.openClip(clip: lastClipNumber, prerollOnly: action == .secondary)]
        case (.single, _), (.begin, _):
            return [reply(peer, id, .busy)]
        case (.end, .recording(let number, let owner)) where owner == peer:
            clip = .saving(clip: number)
            return [.finishClip(clip: number), reply(peer, id, .ok)]
        case (.cancel, .recording(let number, let owner)) where owner == peer:
            // Answered when the recorder says what became of the clip: it may have reached its length already.
            clip = .discarding(clip: number, owner: peer, id: id)
            return [.discardClip(clip: number)]
        case (.end, .recording), (.cancel, .recording):
            return [reply(peer, id, .error("the clip being recorded is another player's"))]
        case (.end, _), (.cancel, _):
            return [reply(peer, id, .error("no clip is being recorded"))]
        }
    }

    /// The driver opened clip `number` (the one `openClip` asked for, at once): its owner is answered `recording`.
    public mutating func clipOpened(_ number: UInt64) -> [Action] {
        guard case .opening(number, let owner, let id) = clip else { preconditionFailure("clipOpened(\(number)) with no such clip being opened") }
        clip = .recording(clip: number, owner: owner)
        return [reply(owner, id, .recording)] + broadcast()
    }

    /// Clip `number` could not be opened: it cost its owner nothing of its clip quota.
    public mutating func clipOpenFailed(_ number: UInt64, reason: String) -> [Action] {
        guard case .opening(number, let owner, let id) = clip else { preconditionFailure("clipOpenFailed(\(number)) with no such clip being opened") }
        clipCredit[owner]?.giveBack()
        clip = .idle(last: .failed(reason))
        return [reply(owner, id, .failed(reason))] + broadcast()
    }

    /// Clip `number` was saved as `name` (after `finishClip`, or by itself: the clip length was reached, or it was
    /// the pre-roll alone).
    public mutating func clipSaved(_ number: UInt64, name: String) -> [Action] {
        clipEnded(number, .saved(name))
    }

    /// Writing clip `number` failed (disk full, say); its file is gone.
    public mutating func clipFailed(_ number: UInt64, reason: String) -> [Action] {
        clipEnded(number, .failed(reason))
    }

    /// Clip `number` was thrown away, as `discardClip` asked, before it ended by itself.
    public mutating func clipDiscarded(_ number: UInt64) -> [Action] {
        clipEnded(number, .discarded)
    }

    private mutating func clipEnded(_ number: UInt64, _ ending: ClipEnding) -> [Action] {
        switch (clip, ending) {
        case (.recording(number, _), .saved(let name)), (.saving(number), .saved(let name)):
            clip = .idle(last: .saved(name))
            return broadcast()
        case (.recording(number, _), .failed(let reason)), (.saving(number), .failed(let reason)):
            clip = .idle(last: .failed(reason))
            return broadcast()
        case (.recording(number, _), .discarded), (.saving(number), .discarded):
            clip = .idle(last: nil)
            return broadcast()
        case (.discarding(number, let owner, let id), .discarded), (.discarding(number, let owner, let id), .failed):
            // Gone, as the owner asked (a clip that failed to write is removed too).
            clip = .idle(last: nil)
            return [reply(owner, id, .ok)] + broadcast()
        case (.discarding(number, let owner, let id), .saved(let name)):
            // The clip reached its length and was saved before the cancel reached the recorder: it is kept, and the
            // owner is told so rather than that it was cancelled.
            clip = .idle(last: .saved(name))
            return [reply(owner, id, .failed("too late to cancel: the clip was saved as \(name)"))] + broadcast()
        default:
            // A report about another clip than the one in hand (none is expected: every clip is reported once, and
            // the next opens only after it): ignored.
            return []
        }
    }

    // MARK: Helpers

    /// Takes a clip of `peer`'s quota at `now`: nil when it had one, else the nanoseconds until it has.
    private mutating func takeClip(_ peer: Peer, now: UInt64) -> UInt64? {
        // The quotas of players that left are kept until they refill: a new one would be the same.
        clipCredit = clipCredit.filter { members.contains($0.key) || !$0.value.isFull(now: now) }
        var bucket = clipCredit[peer] ?? clipQuota.bucket(now: now)
        defer { clipCredit[peer] = bucket }
        return bucket.take(now: now) ? nil : bucket.wait(now: now)
    }

    private mutating func reply(_ peer: Peer, _ id: UInt32, _ r: HostReply) -> Action {
        counters.replies &+= 1
        return .send(peer, .reply(id: id, r))
    }

    private func broadcast() -> [Action] {
        members.map { .send($0, .state(state(for: $0))) }
    }
}
