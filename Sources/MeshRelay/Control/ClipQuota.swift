/// How many clips each player may start on the host: a token bucket per player (`HostControl` keeps them), `burst`
/// clips at once and one more every `refill` after that. A clip start over the quota opens nothing: it is answered
/// `failed` ("too many clips: try again in 7 s"), and counted (`refusedClips` in the host's status). A clip that
/// could not be opened costs nothing; one that was cancelled costs its clip (its pre-roll was written).
///
/// The quota is kept by the player's key: it holds back a paired player's program. A host that admits anyone
/// (`--accept all`) lets a program come back with fresh keys and fresh quotas; there only the 256 MiB the host keeps
/// free protects the disk.
///
/// The default — 4 at once, then one every 10 s — is one no person reaches and no program can fill a disk with
/// (`following(clipSeconds:)` fits it to another `--clip-length`).
/// The host records one clip at a time, and a clip of the default length (`--clip-length 10`) holds it for 10 s: a
/// person who records clip after clip, each to its length, gets a clip back for every one used, and a few quick
/// presses (`capture secondary` twice, a begin, a cancel and a begin again) fit in the 4. Without the quota, a program
/// within the command budget (50 a second) could start pre-roll-only clips as fast as the host writes them, ~1.7 MB
/// each (10 s of Float32 at 44.1 kHz), and bring the clips' filesystem down to its 256 MiB reserve in seconds; with it,
/// a player writes one clip every 10 s at most — as much as one recording clip after clip honestly, ~20 MB a
/// minute of full clips — and the operator sees the refusals long before the reserve is reached.
public struct ClipQuota: Sendable, Equatable {
    /// Clips a player may start at once, after a quiet while.
    public let burst: UInt64
    /// How long one clip takes to come back.
    public let refill: Duration

    /// `burst` clips at once, then one every `refill`.
    public init(burst: UInt64, refill: Duration) {
        precondition(burst >= 1 && refill >= .nanoseconds(1) && refill <= .seconds(86_400), "a clip quota of no clips")
        self.burst = burst
        self.refill = refill
    }

    /// 4 at once, then one every 10 s: `following(clipSeconds: 10)`, for the default `--clip-length`.
    public static let `default` = ClipQuota(burst: 4, refill: .seconds(10))

    /// The quota for clips of at most `clipSeconds` after the press (`--clip-length`): 4 at once, then one every
    /// `clipSeconds`, kept within 5…10 s. From 5 s up, a person recording clip after clip, each to its length, never
    /// meets it. Below 5 s, someone recording clip after clip is refused once the burst of 4 is spent, so that a
    /// program's pre-roll-only clips (each the whole pre-roll) stay at one per 5 s. Above 10 s a clip ended early
    /// (`capture end`) is not held back longer than a default one.
    public static func following(clipSeconds: Double) -> ClipQuota {
        let seconds = min(10, max(5, clipSeconds.isFinite ? clipSeconds : 10))
        return ClipQuota(burst: 4, refill: .milliseconds(Int64((seconds * 1_000).rounded())))
    }

    /// A full bucket of this quota at `now` (monotonic nanoseconds).
    func bucket(now: UInt64) -> TokenBucket {
        let (seconds, attoseconds) = refill.components
        return TokenBucket(cost: UInt64(seconds) * 1_000_000_000 + UInt64(attoseconds / 1_000_000_000), burst: burst, now: now)
    }
}
