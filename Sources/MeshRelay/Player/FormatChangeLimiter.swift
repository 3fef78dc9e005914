import MeshAudio

/// How often a host may make the player rebuild its playback for a new format: a token bucket (a burst of
/// `burst` changes, then one per `refill`). A hostile host that flaps formats gets a few rebuilds, then one line
/// saying the change is refused, and its packets in other formats are dropped and counted until a token is back.
/// A format the output could not play (`cannotPlay`) is not tried again: its packets are dropped and counted, and
/// no token is spent on it. Pure: time is passed in (nanoseconds).
public struct FormatChangeLimiter: Sendable, Equatable {
    /// What to do with a format change the stream asks for.
    public enum Verdict: Sendable, Equatable {
        /// Rebuild for it.
        case allow
        /// Refuse it, and say so (the first refusal of this format since the last allowed change).
        case refuseAndSay
        /// Refuse it quietly (already said).
        case refuse
    }

    /// Changes allowed at once (the bucket's size).
    public let burst: Int
    /// Nanoseconds until the next change is allowed after the burst (one token).
    public let refill: UInt64
    private var tokens: Double
    private var updated: UInt64?
    /// Formats refused (and said) since the last allowed change; a few at most.
    private var refused: [AudioFormat] = []
    /// Formats the output could not play, the latest `maximumUnplayable`.
    private var unplayable: [AudioFormat] = []
    static let maximumUnplayable = 8

    /// At most `burst` changes at once, then one per `refillNanos` (default: 3, then one per 10 s).
    public init(burst: Int = 3, refillNanos: UInt64 = 10_000_000_000) {
        precondition(burst >= 1 && refillNanos > 0, "a limiter must allow something")
        self.burst = burst
        refill = refillNanos
        tokens = Double(burst)
    }

    /// The stream asks to change to `format` at `now`.
    public mutating func request(_ format: AudioFormat, now: UInt64) -> Verdict {
        if unplayable.contains(format) { return .refuse }  // said when it failed
        if let t = updated, now > t { tokens = min(Double(burst), tokens + Double(now - t) / Double(refill)) }
        updated = now
        if tokens >= 1 {
            tokens -= 1
            refused.removeAll()
            return .allow
        }
        if refused.contains(format) { return .refuse }
        if refused.count >= 4 { return .refuse }   // a host cycling through many formats is said to a few times only
        refused.append(format)
        return .refuseAndSay
    }

    /// Playback could not be built for `format` (the output refuses it): it is not tried again.
    public mutating func cannotPlay(_ format: AudioFormat) {
        unplayable.removeAll { $0 == format }
        unplayable.append(format)
        if unplayable.count > Self.maximumUnplayable { unplayable.removeFirst() }
    }
}
