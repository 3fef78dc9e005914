/// A token bucket's arithmetic, exact: credit, in nanoseconds, grows one for one with time up to `capacity`, and a
/// token costs `cost` of it. So the bucket refills one token every `cost` nanoseconds and holds `capacity / cost`
/// tokens at most. `CommandBudget` (commands) and `HostControl`'s clip quota (clips) keep one per player.
///
/// Pure: time (monotonic nanoseconds) is passed in; a time earlier than the latest one seen refills nothing.
struct TokenBucket: Sendable, Equatable {
    /// Nanoseconds of credit one token costs: how long one token takes to come back.
    let cost: UInt64
    /// The most credit the bucket holds: `burst` tokens (less for a burst too large to count in nanoseconds).
    let capacity: UInt64
    /// Nanoseconds of credit, as of `at`.
    private var credit: UInt64
    /// When `credit` was brought up to date.
    private var at: UInt64

    /// A full bucket at `now`: `burst` tokens, one more every `cost` nanoseconds after one is taken.
    init(cost: UInt64, burst: UInt64, now: UInt64) {
        precondition(cost >= 1 && cost <= UInt64.max / 2 && burst >= 1, "a bucket of no tokens")
        self.cost = cost
        let full = cost.multipliedReportingOverflow(by: burst)
        capacity = full.overflow ? UInt64.max / 2 : min(full.partialValue, UInt64.max / 2)
        credit = capacity
        at = now
    }

    /// The bucket brought up to `now`.
    private func refilled(_ now: UInt64) -> TokenBucket {
        guard now > at else { return self }
        var b = self
        b.credit = min(capacity, credit + min(now - at, capacity))
        b.at = now
        return b
    }

    /// Takes a token at `now`: false, and nothing changes but the time, when there is none.
    mutating func take(now: UInt64) -> Bool {
        self = refilled(now)
        guard credit >= cost else { return false }
        credit -= cost
        return true
    }

    /// Nanoseconds from `now` until a token is there (0: one is).
    func wait(now: UInt64) -> UInt64 {
        let b = refilled(now)
        return b.credit >= cost ? 0 : cost - b.credit
    }

    /// Gives back a token taken for something that did not happen after all (up to `capacity`).
    mutating func giveBack() { credit = min(capacity, credit + cost) }

    /// Whether the bucket is full at `now`: then it is as good as a new one, and may be forgotten.
    func isFull(now: UInt64) -> Bool { refilled(now).credit == capacity }
}
