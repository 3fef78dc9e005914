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
        lines[key] = (now, 0)
        return held
    }

    /// `key` is gone (a player that left): forget it.
    mutating func forget(_ key: Key) { lines[key] = nil }
}
