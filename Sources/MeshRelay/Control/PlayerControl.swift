/// The player's side of the control protocol, as a pure state machine: it numbers commands, offers only what the
/// host supports (its TXT record, then its state sync), pairs each reply with its command, and follows the host's
/// state. The driver (`RelayPlayer`) sends what it is told and reports what each action means to the user.
public struct PlayerControl: Sendable {
    /// What the driver does.
    public enum Action: Sendable, Equatable {
        /// Send these bytes to the host on the reliable channel. `id` is the command's: a send that fails is told
        /// back with it (`notSent`).
        case send([UInt8], id: UInt32)
        /// The command was not sent, for this reason (the host does not offer it, or too many wait for answers).
        case refused(PlayerCommand, String)
        /// The host answered a command; or, `.failed("not sent: …")`, the command could not be sent (`notSent`).
        case answered(PlayerCommand, HostReply)
        /// The host answered a talk command that a later one (sent since) supersedes: that one's answer decides.
        case superseded(PlayerCommand, HostReply)
        /// The host's state changed (`previous` is nil for its first state after joining).
        case stateChanged(HostControlState, previous: HostControlState?)
        /// The host sent something that is not a valid answer (counted, ignored).
        case malformed(String)
    }

    /// Commands that may wait for answers at once; more are refused (a stuck host cannot grow the table).
    public static let maximumPending = 16
    /// How fast this player sends commands: 40 a second, 80 at once — below the host's budget (`CommandBudget`: 50 a
    /// second, 100 at once, beyond which it drops commands unanswered), with room for the network to bunch them (up to
    /// half a second). So the host never drops an honest player's command, and no answer it waits for is lost.
    public static let commandsPerSecond: UInt64 = 40, burst: UInt64 = 80
    private var budget = CommandBudget<Int>(commandsPerSecond: commandsPerSecond, burst: burst)

    private var nextID: UInt32 = 1
    private var pending: [UInt32: PlayerCommand] = [:]
    /// The id of the latest talk command sent: only its answer decides whether this player talks.
    private var latestTalk: UInt32?
    /// The latest talk command could not be sent (`notSent`): push-to-talk is off, and the host, if it took an earlier
    /// talk on, still holds the floor for this player.
    private var latestTalkUnsent = false
    /// The features the host's TXT record advertised, when it was found by DNS-SD.
    private var advertised: ControlFeatures?
    /// The host's latest state (nil until it sends one after joining).
    public private(set) var host: HostControlState?
    /// Messages from the host that were not valid answers.
    public private(set) var malformed: UInt64 = 0

    public init() {}

    /// What the host offers, as far as the player knows: its state's word, else its TXT record's, else nothing.
    public var features: ControlFeatures { host?.features ?? advertised ?? [] }

    /// The host's TXT record (from the browser), or nil for a host joined by address.
    public mutating func discovered(_ info: [String: String]?) {
        advertised = info.map(ControlFeatures.init(discoveryInfo:))
    }

    /// A new session with a host: nothing is known of its state yet, and nothing is pending.
    public mutating func joined() {
        host = nil
        pending = [:]
        latestTalk = nil
        latestTalkUnsent = false
    }

    /// The host left: commands waiting for an answer get none, and are answered here as failed.
    public mutating func left() -> [Action] {
        let waiting = pending.sorted { $0.key < $1.key }.map { Action.answered($0.value, .failed("the host left")) }
        pending = [:]
        host = nil
        latestTalk = nil
        latestTalkUnsent = false
        return waiting
    }

    /// The user asks for `command` at `now` (monotonic nanoseconds).
    public mutating func request(_ command: PlayerCommand, now: UInt64) -> Action { ask(command, budgetAt: now) }

    /// `talk off` without the listener asking (the talk input ended, or the talk commands after a talk on the host took
    /// could not be sent), outside the command budget: the host frees the floor even right after a burst of commands.
    /// It comes at most once per `talk on` answered ok, which the budget counts.
    public mutating func releaseTalk() -> Action { ask(.talk(false), budgetAt: nil) }

    private mutating func ask(_ command: PlayerCommand, budgetAt now: UInt64?) -> Action {
        let needed: ControlFeatures
        switch command {
        case .pause, .resume: needed = .control
        case .capture: needed = .clips
        case .talk: needed = .talk
        }
        guard features.contains(needed) else {
            // Joined by address, the host says what it offers in its first state, a moment after the join.
            guard host != nil || advertised != nil else {
                return .refused(command, "the host has not said yet what it offers; try again in a moment")
            }
            let why: String
            switch needed {
            case .clips: why = "the host keeps no clips (mesh-record --clips DIR)"
            case .talk: why = "the host takes no talkback"
            default: why = "the host has no remote control"
            }
            return .refused(command, why)
        }
        guard pending.count < Self.maximumPending else { return .refused(command, "\(Self.maximumPending) commands wait for answers") }
        if let now, budget.spend(0, now: now) != .take {
            return .refused(command, "too many commands: at most \(Self.commandsPerSecond) a second, \(Self.burst) at once")
        }
        let id = nextID
        nextID = nextID == UInt32.max ? 1 : nextID + 1
        pending[id] = command
        if case .talk = command {
            latestTalk = id
            latestTalkUnsent = false
        }
        return .send(ControlMessage.command(id: id, command).encoded, id: id)
    }

    /// The command `id` (from `.send`) could not be sent (the host left meanwhile, or does not read): no answer will
    /// come, so it is answered here as failed, as an answer from the host would be (a talk command's decides, if
    /// it is the latest). Nothing for a command already settled.
    public mutating func notSent(id: UInt32, because why: String) -> [Action] {
        if id == latestTalk { latestTalkUnsent = true }
        return settle(id, .failed("not sent: \(why)")).map { [$0] } ?? []
    }

    private mutating func settle(_ id: UInt32, _ reply: HostReply) -> Action? {
        guard let command = pending.removeValue(forKey: id) else { return nil }
        if case .talk = command, id != latestTalk { return .superseded(command, reply) }
        return .answered(command, reply)
    }

    /// A reliable message from the host.
    public mutating func received(_ bytes: [UInt8]) -> [Action] {
        let message: ControlMessage
        do {
            message = try ControlMessage.decode(bytes)
        } catch {
            malformed &+= 1
            return [.malformed(error.reason)]
        }
        switch message {
        case .command:
            malformed &+= 1
            return [.malformed("the host sent a command")]
        case .reply(let id, let reply):
            guard let settled = settle(id, reply) else {
                malformed &+= 1
                return [.malformed("a reply to no command (id \(id))")]
            }
            // The host took a talk on, and the talk commands after it never reached it: it holds the floor for this
            // player until told.
            if case .superseded(.talk(true), .ok) = settled, latestTalkUnsent {
                return [settled, releaseTalk()]
            }
            return [settled]
        case .state(let s):
            let previous = host
            host = s
            return previous == s ? [] : [.stateChanged(s, previous: previous)]
        }
    }

    /// Commands waiting for answers.
    public var pendingCount: Int { pending.count }

}
