/// Lets one log line per key through each `interval` and counts the ones it holds back, to be said with the next
/// line that gets through: a peer that sends refused command after refused command cannot flood the log (or the
/// journal, whose rate limit would then drop the lines that matter). Pure: time is passed in.
struct LogThrottle<Key: Hashable & Sendable>: Sendable {
    /// Nanoseconds between two lines of one key.
    let interval: UInt64
    private var lines: [Key: (at: UInt64, held: Int)] = [:]

    init(interval: UInt64) { self.interval = interval }

    /// A line for `key` at `now`: nil to hold it back, else how many were held back since the last one let through.
    mutating func admit(_ key: Key, now: UInt64) -> Int? {
        if let l = lines[key], now &- l.at < interval {
            lines[key] = (l.at, l.held + 1)
            return nil
        }
        let held = lines[key]?.held ?? 0
        // Keys are kept across a player's visits (one that reconnects gets no fresh line), and forgotten once they
        // hold nothing back and their interval is over: the next line of such a key comes at once either way, so
        // keys that come and go (players under keys of their own making) do not pile up. One that held lines back
        // keeps its count for its next line, for `forgottenAfter` intervals.
        lines = lines.filter { k, l in
            let age = now &- l.at
            return k != key && (l.held == 0 ? age < interval : age / Self.forgottenAfter < interval)
        }
        lines[key] = (now, 0)
        return held
    }

    /// Intervals after which a count of lines held back is forgotten if no line of its key came to say it.
    static var forgottenAfter: UInt64 { 60 }

    /// Keys remembered now (tests).
    var count: Int { lines.count }
}

/// Coalesces the lines that say a player's state changed (paused, resumed, talks, stopped talking): the first change
/// after a quiet `interval` is logged at once; the changes after it within the interval are held back, and when the
/// interval is over one line says the player's state then and how many changes it sums up (that line opens the next
/// interval). A player that toggles as fast as it can costs the log about one line an interval, and the last line
/// still tells its true state. Pure: time is passed in.
struct ChangeLineCoalescer<Key: Hashable & Sendable>: Sendable {
    /// What to do with one change's line.
    enum Verdict: Sendable, Equatable {
        /// Log it now. `held` changes were held back before it and not summed up yet (0, unless a summary came late).
        case log(held: Int)
        /// Hold it back. For the first line held in an interval, `summarizeIn` says in how many nanoseconds the
        /// interval ends: call `summarize` then. Nil for the lines after it.
        case hold(summarizeIn: UInt64?)
    }

    /// Nanoseconds between two lines of one key.
    let interval: UInt64
    private var intervals: [Key: (since: UInt64, held: Int)] = [:]

    init(interval: UInt64) { self.interval = interval }

    /// `key` changed at `now`.
    mutating func change(_ key: Key, now: UInt64) -> Verdict {
        if let i = intervals[key], now &- i.since < interval {
            intervals[key] = (i.since, i.held + 1)
            return .hold(summarizeIn: i.held == 0 ? i.since &+ interval &- now : nil)
        }
        let held = intervals[key]?.held ?? 0
        // Kept across a player's visits (one that reconnects gets no fresh line); forgotten once nothing is held and
        // the interval is over (then its next change is logged at once either way), so that keys do not pile up.
        // One with changes held has its summary due within the interval, which leaves nothing held.
        intervals = intervals.filter { k, i in k != key && (i.held > 0 || now &- i.since < interval) }
        intervals[key] = (now, 0)
        return .log(held: held)
    }

    /// `key`'s interval is over: how many changes were held back in it, for one summary line; nil when none were (or
    /// a line logged since said them).
    mutating func summarize(_ key: Key, now: UInt64) -> Int? {
        guard let i = intervals[key], i.held > 0 else { return nil }
        intervals[key] = (now, 0)
        return i.held
    }

    /// Keys remembered now (tests).
    var count: Int { intervals.count }
}
