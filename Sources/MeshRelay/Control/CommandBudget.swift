/// How fast each player may send control commands: a token bucket per player. A player may send `burst` commands at
/// once and `commandsPerSecond` a second after that; commands over the budget are dropped before any work is queued
/// for them, and counted. The player is told at most once per `tellInterval` (the first drop after a quiet interval
/// says so), so that a flood does not turn into a flood of answers; the drops that follow in silence are said by
/// `takeUntold`, an interval later.
///
/// The defaults — 50 commands a second, 100 at once — are beyond any person: a held key repeats at most about 40
/// times a second, and a headset button far less. Only a program can exceed them, and one that does cannot grow the
/// host's control queue, nor fill its log (journald would then drop the host's important lines).
///
/// Pure: time (monotonic nanoseconds) is passed in. Credit is kept in nanoseconds (`TokenBucket`), so the arithmetic is
/// exact.
struct CommandBudget<Player: Hashable & Sendable>: Sendable {
    /// What to do with one command.
    enum Verdict: Sendable, Equatable {
        /// Within the budget: handle it.
        case take
        /// Over the budget: drop it, silently (the player was told less than `tellInterval` ago).
        case drop
        /// Over the budget: drop it, and tell the player that `dropped` commands were dropped since it was last
        /// told (this one included).
        case dropAndTell(dropped: UInt64)
    }

    /// The default sustained rate.
    static var defaultCommandsPerSecond: UInt64 { 50 }
    /// The default burst.
    static var defaultBurst: UInt64 { 100 }

    /// Commands a second, sustained.
    let commandsPerSecond: UInt64
    /// Commands at once, after a quiet while (`burst / commandsPerSecond` seconds refill it).
    let burst: UInt64
    /// Nanoseconds between two tellings of one player.
    let tellInterval: UInt64

    private struct Account {
        /// Each command takes a token: `burst` at once, one more every `1 / commandsPerSecond` s.
        var bucket: TokenBucket
        var dropped: UInt64 = 0
        var droppedSinceTold: UInt64 = 0
        var toldAt: UInt64?
    }

    private var accounts: [Player: Account] = [:]
    /// Players that left while their bucket was not full: their accounts stay until it is, so that leaving and
    /// coming back (a reconnect costs a paired player nothing else) never buys a fresh burst.
    private var gone: Set<Player> = []
    /// Commands dropped, every player together (players that left included).
    private(set) var totalDropped: UInt64 = 0

    init(commandsPerSecond: UInt64 = Self.defaultCommandsPerSecond, burst: UInt64 = Self.defaultBurst,
         tellInterval: UInt64 = 1_000_000_000) {
        precondition(commandsPerSecond >= 1 && commandsPerSecond <= 1_000_000_000 && burst >= 1, "a budget of no commands")
        self.commandsPerSecond = commandsPerSecond
        self.burst = burst
        self.tellInterval = tellInterval
    }

    /// One command from `player` at `now`.
    mutating func spend(_ player: Player, now: UInt64) -> Verdict {
        gone.remove(player)
        var a = accounts[player] ?? Account(bucket: TokenBucket(cost: 1_000_000_000 / commandsPerSecond, burst: burst, now: now))
        if a.bucket.take(now: now) {
            accounts[player] = a
            return .take
        }
        a.dropped += 1
        a.droppedSinceTold += 1
        totalDropped += 1
        let verdict: Verdict
        if let told = a.toldAt, now &- told < tellInterval {
            verdict = .drop
        } else {
            verdict = .dropAndTell(dropped: a.droppedSinceTold)
            a.droppedSinceTold = 0
            a.toldAt = now
        }
        accounts[player] = a
        return verdict
    }

    /// An interval after `player` was told (by a drop, or by this): how many of its commands were dropped since,
    /// silently, to be said now — which counts as telling it. Nil when none were.
    mutating func takeUntold(_ player: Player, now: UInt64) -> UInt64? {
        guard var a = accounts[player], a.droppedSinceTold > 0 else { return nil }
        defer {
            a.droppedSinceTold = 0
            a.toldAt = now
            accounts[player] = a
        }
        return a.droppedSinceTold
    }

    /// Commands of `player`'s dropped so far.
    func dropped(by player: Player) -> UInt64 { accounts[player]?.dropped ?? 0 }

    /// `player` left at `now`. Its account is forgotten once its bucket is full again (as good as a new one), with
    /// those of the others that left before and are full by now; its drops stay in `totalDropped`. Only players that
    /// left within the last `burst / commandsPerSecond` seconds (2 s by default) are remembered.
    mutating func forget(_ player: Player, now: UInt64) {
        if accounts[player] != nil { gone.insert(player) }
        for p in gone where accounts[p].map({ $0.bucket.isFull(now: now) }) ?? true {
            accounts[p] = nil
            gone.remove(p)
        }
    }
}
