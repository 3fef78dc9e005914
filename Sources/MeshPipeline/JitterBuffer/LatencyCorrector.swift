/// Decides when a playing jitter buffer corrects its latency itself, by stretching (holding the playout point:
/// frames are synthesized) or skipping (jumping the playout point ahead). Smaller errors are the drift controller's
/// job.
///
/// Errors are judged on the caller's jitter-free latency, with hysteresis, so that normal jitter never triggers a
/// correction:
/// - more than `max(block, 2 ms)` short: stretch the whole block at once;
/// - more than 0.5 ms short for `stretchConfirmSeconds`: hold for just the missing frames, once;
/// - more than `max(block + packet, 4 ms)` over for `skipConfirmSeconds`: skip the least excess seen meanwhile;
/// - more than `smallExcessSeconds` over for `smallExcessConfirmSeconds`: give back what the buffer holds beyond a
///   target that fell, or that earlier stretches added (the least excess seen meanwhile, at most the frames
///   stretched and the target's falls not yet given back). Without it an excess
///   below the large threshold (up to 5.8 ms at 128-frame blocks and packets) would stay for good whenever the
///   drift loop is not engaged — a stretch fills the buffer up to a raised target, the target decays again — and
///   the latency would ratchet up stall by stall on a clean link. An excess the buffer did not add itself (a
///   clock drifting) is left to the drift controller — except, when the target is pinned (`.low`, `.fixed`;
///   `givesBackStartSteps`), a step in a stream's first
///   `LatencyTarget.startupSeconds`, which is given back whole: then the latency measure is still settling (its
///   least-lateness floor fills over its first window, and one early arrival at the start makes the buffer start
///   a packet too full). A step is an excess that appears at once at `stepSeconds` or more; a drifting clock
///   builds its excess up smoothly (1000 ppm is 3 µs a block) and so crosses the small threshold just over it.
///   Without it a start one packet too full stayed so for the whole stream (seen with `--latency low`: 673
///   frames mouth-to-ear instead of 545).
///
/// A give-back can be wrong: the latency the buffer measures is jitter-free, but the device may pull blocks on a
/// phase the measure does not see, so that the stream runs dry at the target. Then the buffer resumes late (a
/// stretch), holds that stretch over the target, gives it back two seconds later and runs dry again — an underrun
/// every few seconds (seen at period 64 on the JACK rig: a late resume of 44 frames, then a give-back of 44 frames,
/// over and over, for the whole stream). So a late resume within `regretSeconds` of a skip shows what the stream
/// needs (`neededFrames`): what the buffer held after the skip plus how late it resumed (at most what the skip
/// took). From then on, in this stream, nothing is skipped below it, whatever the target says (the target may keep
/// falling toward a structural minimum the stream cannot run at).
///
/// Pure: one mutating method per block, returning what to do.
struct LatencyCorrector {
    /// How long the latency must stay over the skip threshold before frames are skipped.
    static let skipConfirmSeconds = 0.5
    /// A latency deficit beyond this, lasting `stretchConfirmSeconds`, is stretched away.
    static let smallDeficitSeconds = 0.0005
    /// How long a small latency deficit must last before the playout point holds.
    static let stretchConfirmSeconds = 0.25
    /// A latency excess beyond this, lasting `smallExcessConfirmSeconds`, is skipped away.
    static let smallExcessSeconds = 0.0005
    /// How long a small latency excess must last before frames are skipped.
    static let smallExcessConfirmSeconds = 2.0
    /// An excess that appears at once at least this large is a step (the start's), not a clock's ramp.
    static let stepSeconds = 0.001
    /// A late resume this soon after a skip says the skip took latency the stream needs.
    static let regretSeconds = 5.0

    /// What to do with the block about to be played.
    enum Correction: Equatable {
        /// Play it as it is.
        case play
        /// Far too little latency: hold the playout point for the whole block.
        case stretchBlock
        /// A lasting small deficit: hold the playout point for the block's first `frames` frames.
        case hold(frames: Int)
        /// A lasting excess: jump the playout point `frames` ahead, then play.
        case skip(frames: Int)
    }

    private enum State {
        /// Within bounds: no evidence gathered.
        case onTarget
        /// Short of the target by more than `smallDeficitSeconds` since `since` (≥ 1).
        case short(since: UInt64)
        /// Over the small-excess threshold since `since` (≥ 1), by at least `leastExcess` frames meanwhile; `step`
        /// when it started in a stream's start-up with a step (see the type's comment).
        case over(since: UInt64, leastExcess: Double, step: Bool)
    }

    /// Frames per second.
    let rate: Double
    /// Whether a step in a stream's start-up is given back whole. Only for a pinned target: under `.auto` the
    /// start's excess is not measured apart from the target's own start-up decay yet (issue 15).
    let givesBackStartSteps: Bool
    private var state = State.onTarget
    /// Frames stretched (held or synthesized) plus the target's falls, not yet given back by a skip: latency the
    /// buffer holds for a target that no longer asks for it.
    private var returnableFrames: Double = 0
    /// Until when an excess that appears is the start's (0: no stream started yet).
    private var startupUntilNanos: UInt64 = 0
    /// The latest skip: when (0: none in this stream), the latency the buffer held after it and the frames it
    /// skipped.
    private var lastSkip: (nanos: UInt64, latencyAfter: Double, skipped: Double) = (0, 0, 0)
    /// Latency this stream showed it needs (it ran dry soon after a skip below it), frames; 0: none shown.
    /// Nothing is skipped below it, whatever the target says.
    private(set) var neededFrames: Double = 0

    init(rate: Double, givesBackStartSteps: Bool = false) {
        self.rate = rate
        self.givesBackStartSteps = givesBackStartSteps
    }

    /// A new stream, started at `nanos`: the evidence gathered so far no longer applies.
    mutating func restart(atNanos nanos: UInt64) {
        state = .onTarget
        returnableFrames = 0
        startupUntilNanos = nanos &+ UInt64(LatencyTarget.startupSeconds * 1e9)
        lastSkip = (0, 0, 0)
        neededFrames = 0
    }

    /// The stream ran dry and resumed `frames` frames late at `nowNanos` (a stretch): latency the buffer may give
    /// back — unless it came soon after a skip, which then took latency the stream needs (kept from now on).
    mutating func noteLateResume(frames: Double, atNanos now: UInt64) {
        returnableFrames += frames
        // Signed: the packet that resumes was stamped when it arrived, which can be a little before the read that
        // gave back (seen: 2 ms), though it reaches the buffer after it.
        if lastSkip.nanos != 0,
           Double(Int64(bitPattern: now &- lastSkip.nanos)) < Self.regretSeconds * 1e9 {
            // It ran dry `frames` short of what it had after the skip: it needs that much more, at most what the
            // skip took.
            neededFrames = max(neededFrames, lastSkip.latencyAfter + min(frames, lastSkip.skipped))
            lastSkip = (0, 0, 0)
        }
    }

    /// The target moved from `old` to `new` frames: a fall is latency the buffer may give back, a rise takes that
    /// back (the stretch that follows it adds it again), so a target that wobbles accrues nothing.
    mutating func noteTarget(from old: Double, to new: Double) {
        if old > 0 { returnableFrames = max(0, returnableFrames + old - new) }
    }

    /// The block of `frames` frames about to be played at `nowNanos`, with the latency `errorFrames` off the target
    /// of `targetFrames` (negative: short), where a render block is `blockFrames` and a packet `packetFrames`.
    mutating func decide(errorFrames error: Double, targetFrames target: Double, frames: Int, blockFrames: Int,
                         packetFrames: Int, nowNanos: UInt64) -> Correction {
        // What of the excess the stream showed it needs.
        let kept = max(0, neededFrames - target)
        let correction = judge(errorFrames: error, keptFrames: kept, frames: frames, blockFrames: blockFrames,
                               packetFrames: packetFrames, nowNanos: nowNanos)
        switch correction {
        case .play: break
        case .stretchBlock: returnableFrames += Double(frames)
        case .hold(let n): returnableFrames += Double(n)
        case .skip(let n):
            returnableFrames = max(0, returnableFrames - Double(n))
            lastSkip = (max(1, nowNanos), target + error - Double(n), Double(n))
        }
        return correction
    }

    private mutating func judge(errorFrames error: Double, keptFrames kept: Double, frames: Int, blockFrames: Int,
                                packetFrames: Int, nowNanos: UInt64) -> Correction {
        if error < -max(Double(blockFrames), rate * 0.002) { return .stretchBlock }
        // A small deficit that lasts (the target rose a little, the start fell short): hold for just the missing
        // frames, once. Jitter never triggers it: the latency measure is jitter-free, and the deficit must persist.
        if error >= -rate * Self.smallDeficitSeconds {
            if case .short = state { state = .onTarget }
        } else if case .short(let since) = state {
            if nowNanos > since, Double(nowNanos - since) >= Self.stretchConfirmSeconds * 1e9 {
                state = .onTarget
                return .hold(frames: min(frames, Int((-error).rounded(.up))))
            }
        } else {
            state = .short(since: max(1, nowNanos))
        }
        // Too much latency: skip only when the excess has lasted (jitter in the measure or a short-lived target
        // bump never triggers it), and only by the least excess seen meanwhile — soon for a large excess, after
        // longer for a small one.
        let large = max(Double(blockFrames + packetFrames), rate * 0.004)
        let small = rate * Self.smallExcessSeconds
        if error <= small {
            if case .over = state { state = .onTarget }
        } else if case .over(let since, let least, let step) = state {
            state = .over(since: since, leastExcess: min(least, error), step: step)
        } else {
            let step = givesBackStartSteps && nowNanos < startupUntilNanos && error >= rate * Self.stepSeconds
            state = .over(since: max(1, nowNanos), leastExcess: error, step: step)
        }
        if case .over(let since, let least, let step) = state, nowNanos > since {
            let lasted = Double(nowNanos - since) / 1e9
            if least > large && lasted >= Self.skipConfirmSeconds {
                state = .onTarget
                let skip = Int(least - kept)
                if skip > 0 { return .skip(frames: skip) }
            }
            if lasted >= Self.smallExcessConfirmSeconds {
                state = .onTarget
                let ours = step ? least : returnableFrames
                let giveBack = Int(min(least - kept, ours))
                if giveBack > 0 { return .skip(frames: giveBack) }
            }
        }
        return .play
    }
}
