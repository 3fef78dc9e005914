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
///   clock drifting) is left to the drift controller.
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

    /// What to do with the block about to be played.
    enum Correction: Equatable {
        /// Play it.
        case none
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
        /// Over the small-excess threshold since `since` (≥ 1), by at least `leastExcess` frames meanwhile.
        case over(since: UInt64, leastExcess: Double)
    }

    /// Frames per second.
    let rate: Double
    private var state = State.onTarget
    /// Frames stretched (held or synthesized) plus the target's falls, not yet given back by a skip: latency the
    /// buffer holds for a target that no longer asks for it.
    private var returnableFrames: Double = 0

    init(rate: Double) { self.rate = rate }

    /// A new stream: the evidence gathered so far no longer applies.
    mutating func restart() {
        state = .onTarget
        returnableFrames = 0
    }

    /// The target moved from `old` to `new` frames: a fall is latency the buffer may give back, a rise takes that
    /// back (the stretch that follows it adds it again), so a target that wobbles accrues nothing.
    mutating func noteTarget(from old: Double, to new: Double) {
        if old > 0 { returnableFrames = max(0, returnableFrames + old - new) }
    }

    /// The block of `frames` frames about to be played at `nowNanos`, with the latency `errorFrames` off the target
    /// (negative: short), where a render block is `blockFrames` and a packet `packetFrames`.
    mutating func decide(errorFrames error: Double, frames: Int, blockFrames: Int, packetFrames: Int,
                         nowNanos: UInt64) -> Correction {
        let correction = judge(errorFrames: error, frames: frames, blockFrames: blockFrames, packetFrames: packetFrames,
                               nowNanos: nowNanos)
        switch correction {
        case .none: break
        case .stretchBlock: returnableFrames += Double(frames)
        case .hold(let n): returnableFrames += Double(n)
        case .skip(let n): returnableFrames = max(0, returnableFrames - Double(n))
        }
        return correction
    }

    private mutating func judge(errorFrames error: Double, frames: Int, blockFrames: Int, packetFrames: Int,
                                nowNanos: UInt64) -> Correction {
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
        } else if case .over(let since, let least) = state {
            state = .over(since: since, leastExcess: min(least, error))
        } else {
            state = .over(since: max(1, nowNanos), leastExcess: error)
        }
        if case .over(let since, let least) = state, nowNanos > since {
            let lasted = Double(nowNanos - since) / 1e9
            if least > large && lasted >= Self.skipConfirmSeconds {
                state = .onTarget
                return .skip(frames: Int(least))
            }
            if lasted >= Self.smallExcessConfirmSeconds {
                state = .onTarget
                let giveBack = Int(min(least, returnableFrames))
                if giveBack > 0 { return .skip(frames: giveBack) }
            }
        }
        return .none
    }
}
