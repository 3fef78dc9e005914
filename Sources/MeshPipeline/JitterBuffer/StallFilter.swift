/// Tells a host's hiccups from network jitter, packet by packet, for the jitter estimate.
///
/// A packet is *off* when its transit is more than `marginNanos` beyond what the latency target covers (up) or below
/// the window's least transit (down). Two or more off packets on one side, less than `gapNanos` apart, form a burst;
/// a lone one is an outlier, which the deviation's quantile leaves out anyway. A burst that starts at least
/// `spacingNanos` after the previous one ended (or after the stream started) is **held**: its
/// packets count as `.hold`, and the estimate keeps them at the level it already covers. What it turns out to be:
///
/// - a **rare stall** (a capture or scheduling hiccup: packets held back arrive together, and the ones after are on
///   time again): the concealer covered it once, and the target never grew for it;
/// - a **timeline step** (every packet for `longestNanos` is off the same way: the host's capture clock or the path
///   jumped and stays there): `.rebase`, the estimate forgets the transits from before the step, which no longer
///   tell anything about the jitter to come.
///
/// Everything else is `.ordinary` and counts in full: bursts closer together than `spacingNanos` (real jitter), a
/// held burst whose packets go up and down for longer than `longestNanos`, and any off packet in the stream's first
/// `spacingNanos` (nothing is known yet).
///
/// Pure, no allocation.
struct StallFilter {
    /// What one packet is, for the jitter estimate.
    enum Verdict: Equatable {
        /// Counts in full.
        case ordinary
        /// Part of a held burst: the estimate keeps it at the deviation it covers (up) or at the least transit
        /// (down).
        case hold
        /// The second packet of a held burst: hold it, and the lone off packet that began the burst.
        case holdWithLone
        /// The timeline stepped: forget the transits before this packet.
        case rebase
    }

    /// Which way a packet's transit is off.
    enum Side: Equatable {
        case up, down
    }

    /// Least calm time before a burst, nanoseconds, for the burst to be held (0: never).
    let spacingNanos: UInt64
    /// Longest a burst is held, nanoseconds; off all that time the same way, it is a step.
    let longestNanos: UInt64
    /// Longest time between two off packets of one burst, nanoseconds.
    let gapNanos: UInt64
    /// How far beyond the covered deviation (or below the least transit) a transit must be to be off, nanoseconds.
    let marginNanos: Double

    private enum State {
        /// No stream yet.
        case idle
        /// No held burst under way; the last burst (or the stream's start) was at `since`. `lone` is an off packet
        /// that may start a burst (nil: none lately).
        case calm(since: UInt64, lone: (side: Side, at: UInt64)?)
        /// A held burst under way on `side`: its first off packet came at `start`, its latest at `last`; `steady`
        /// while every packet since `start` was off that way.
        case held(side: Side, start: UInt64, last: UInt64, steady: Bool)
    }

    private var state = State.idle
    /// Held bursts that were rare stalls, since `init`.
    private(set) var stalls: UInt64 = 0
    /// Held bursts that were timeline steps (the window was rebased), since `init`.
    private(set) var steps: UInt64 = 0

    /// A filter that holds bursts at least `spacingSeconds` apart for at most `longestSeconds`.
    init(spacingSeconds: Double, longestSeconds: Double = 0.05, gapSeconds: Double = 0.025,
         marginSeconds: Double = 0.001) {
        spacingNanos = UInt64(max(0, spacingSeconds) * 1e9)
        longestNanos = UInt64(max(0, longestSeconds) * 1e9)
        gapNanos = UInt64(max(0, gapSeconds) * 1e9)
        marginNanos = max(0, marginSeconds) * 1e9
    }

    /// A new stream: the first `spacingNanos` of it count in full again.
    mutating func restart() { state = .idle }

    /// A packet arrived at `arrivalNanos` whose transit is `offsetNanos` off what the estimate covers: above the
    /// covered deviation (positive), below the least transit (negative), or within (0). Returns how to count it.
    mutating func classify(offsetNanos: Double, arrivalNanos now: UInt64) -> Verdict {
        let side: Side? = offsetNanos > marginNanos ? .up : offsetNanos < -marginNanos ? .down : nil
        switch state {
        case .idle:
            state = .calm(since: now, lone: nil)
            return .ordinary
        case .calm(let since, let lone):
            guard let side else {
                if let lone, now - min(now, lone.at) > gapNanos { state = .calm(since: since, lone: nil) }
                return .ordinary
            }
            guard let lone, lone.side == side, now - min(now, lone.at) <= gapNanos else {
                state = .calm(since: since, lone: (side, now))   // alone so far: an outlier, unless another follows
                return .ordinary
            }
            return startBurst(side, start: lone.at, now: now, calmSince: since)
        case .held(let heldSide, let start, let last, let steady):
            let gap = now >= last ? now - last : 0
            guard side == heldSide else {
                // Back within (or off the other way): a stall's held-back packets are in, or this is jitter.
                if gap > gapNanos {
                    state = .calm(since: last, lone: side.map { ($0, now) })
                } else {
                    state = .held(side: heldSide, start: start, last: last, steady: false)
                }
                return .ordinary
            }
            if gap > gapNanos {
                state = .calm(since: last, lone: (heldSide, now))
                return .ordinary
            }
            if now - min(now, start) > longestNanos {
                state = .calm(since: now, lone: nil)
                guard steady else { return .ordinary }   // up and down for too long: jitter, counted from here
                stalls &-= 1
                steps &+= 1
                return .rebase
            }
            state = .held(side: heldSide, start: start, last: now, steady: steady)
            return .hold
        }
    }

    /// The second off packet (at `now`) of a burst that began at `start`, `calmSince` after the previous burst (or
    /// the stream's start).
    private mutating func startBurst(_ side: Side, start: UInt64, now: UInt64, calmSince since: UInt64) -> Verdict {
        if spacingNanos > 0, start >= since, start - since >= spacingNanos {
            stalls &+= 1
            state = .held(side: side, start: start, last: now, steady: true)
            return .holdWithLone
        }
        state = .calm(since: now, lone: nil)
        return .ordinary
    }
}
