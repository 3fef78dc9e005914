/// How much the packets' network delay varies, measured on their transits (arrival time minus nominal capture time,
/// on the stream's own timeline):
///
/// - the RFC 3550 interarrival jitter (a running mean of transit differences, gain 1/16), reported;
/// - the transit deviation over the last `windowSeconds`: a high quantile of the window's transits — all but the top
///   `outlierFraction`, so a rare outlier does not set everyone's latency — minus their least. This is what the
///   latency target covers. It is recomputed at most every 20 ms, and at once when a transit goes beyond what it
///   covers; a run of late packets (the delay stepped up) can ask for the whole window, outliers included.
///
/// The packets of a burst seconds after the last one (`StallFilter`) are kept at the level already covered, so neither
/// the quantile nor a late run's whole-window cover grows the target for a rare stall; when the burst turns out to
/// be a step of the host's timeline, the window is rebased on the packets after it. The RFC 3550 figure sees every
/// packet as it came.
///
/// Pure; preallocated (the window holds at most `transitCapacity` packets; the quantile keeps the few largest in one
/// pass, `LargestValues`: its cost does not depend on the transits' order, which the sender and the network choose).
struct JitterEstimator {
    /// Most transits kept for the deviation quantile (the window is shortened beyond that many packets).
    static let transitCapacity = 4096
    /// Fraction of the window's packets whose excess transit the deviation does not cover.
    static let outlierFraction = 0.003
    /// The most outliers a full window drops (12).
    static let mostOutliersDropped = Int(Double(transitCapacity) * outlierFraction)
    /// Least interval between two recomputations of the deviation.
    static let deviationIntervalNanos: UInt64 = 20_000_000

    /// Span of the deviation window, seconds (at least 0.05).
    let windowSeconds: Double
    /// RFC 3550 interarrival jitter, nanoseconds.
    private(set) var interarrivalJitterNanos: Double = 0
    /// Transit deviation over the window (high quantile minus least, the trend taken out), nanoseconds.
    private(set) var deviationNanos: Double = 0
    /// How much slower the playout device's clock runs than this machine's monotonic clock, ppm (negative:
    /// faster); set by the jitter buffer from its render calls.
    var deviceClockPPM: Double = 0
    /// Reads bursts beyond the covered deviation as rare stalls or as jitter.
    private var stallFilter: StallFilter
    /// Bursts read as rare stalls (held at the covered level) since `init`.
    var rareStalls: UInt64 { stallFilter.stalls }
    /// Steps of the transit (the window rebased after them) since `init`.
    var timelineSteps: UInt64 { stallFilter.steps }

    /// The previous packet's transit, for the RFC 3550 estimate (nil at a stream's start).
    private var previousTransit: Double?
    /// The least transit of the window at the latest recomputation.
    private var leastTransit: Double = 0
    // Transits of the window's packets (a ring in arrival order) with their arrival times.
    private var transits: [Double]
    private var arrivals: [UInt64]
    /// The largest residuals of a recomputation's pass, for the quantile.
    private var largest = LargestValues(capacity: JitterEstimator.mostOutliersDropped + 1)
    private var next = 0
    /// Where the latest off packet (beyond the covered deviation or below the least transit) was recorded.
    private var loneIndex = 0
    private var count = 0
    /// When the deviation was last recomputed (0: not since the stream started).
    private var lastRecomputeNanos: UInt64 = 0

    /// An estimator over a window of `windowSeconds` that holds bursts at least `stallSpacingSeconds` apart at the
    /// covered deviation (0: every transit counts in full).
    init(windowSeconds: Double, stallSpacingSeconds: Double = 0) {
        self.windowSeconds = windowSeconds
        stallFilter = StallFilter(spacingSeconds: stallSpacingSeconds)
        transits = [Double](repeating: 0, count: Self.transitCapacity)
        arrivals = [UInt64](repeating: 0, count: Self.transitCapacity)
    }

    /// A new stream: forgets the window (the reported figures stand until new packets move them).
    mutating func restart() {
        previousTransit = nil
        next = 0
        count = 0
        lastRecomputeNanos = 0
        stallFilter.restart()
    }

    /// A packet with transit `transitNanos` (any fixed origin, the stream's own) arrived at `arrivalNanos`.
    mutating func note(transitNanos transit: Double, arrivalNanos: UInt64) {
        if let previous = previousTransit {
            interarrivalJitterNanos += (abs(transit - previous) - interarrivalJitterNanos) / 16
        }
        previousTransit = transit
        let covered = leastTransit + deviationNanos
        let offset = count == 0 ? 0 : transit > covered ? transit - covered : min(0, transit - leastTransit)
        var transit = transit
        switch stallFilter.classify(offsetNanos: offset, arrivalNanos: arrivalNanos) {
        case .ordinary:
            break
        case .hold:
            transit = offset > 0 ? covered : leastTransit
        case .holdWithLone:
            transit = offset > 0 ? covered : leastTransit
            if count > 0 { transits[loneIndex] = transit }
        case .rebase:
            next = 0
            count = 0
            lastRecomputeNanos = 0
        }
        if abs(offset) > stallFilter.marginNanos { loneIndex = next }
        transits[next] = transit
        arrivals[next] = arrivalNanos
        next = (next + 1) % Self.transitCapacity
        count = min(count + 1, Self.transitCapacity)
        if lastRecomputeNanos == 0 || arrivalNanos < lastRecomputeNanos
            || arrivalNanos - lastRecomputeNanos >= Self.deviationIntervalNanos
            || transit - leastTransit > deviationNanos   // beyond what the deviation covers: at once
        {
            lastRecomputeNanos = max(1, arrivalNanos)
            recompute(nowNanos: arrivalNanos, droppingOutliers: true)
        }
    }

    /// The delay stepped up (a run of late packets): let the deviation cover the whole window, outliers included.
    mutating func coverWholeWindow(nowNanos: UInt64) {
        recompute(nowNanos: nowNanos, droppingOutliers: false)
    }

    /// The transit deviation of the window ending at `nowNanos`: a high quantile of the transits (all but the top
    /// `outlierFraction` when `droppingOutliers`) minus their least, measured on the playout device's clock when that
    /// makes it smaller (the monotonic clock's otherwise).
    ///
    /// Arrivals are stamped with this machine's monotonic clock. When the playout device runs slow or fast against
    /// it (`deviceClockPPM`; a JACK dummy graph by up to 0.5 %), and the sender's capture runs on the same clock (one
    /// JACK graph), every transit creeps at that rate although the playout follows the sender exactly: that creep
    /// is taken out. What a sender's own clock does against the device stays in (the drift controller's job).
    private mutating func recompute(nowNanos: UInt64, droppingOutliers: Bool) {
        let window = UInt64(max(0.05, windowSeconds) * 1e9)
        var n = 0
        var i = next
        for _ in 0..<count {
            i = i == 0 ? Self.transitCapacity - 1 : i - 1
            let t = arrivals[i]
            if t <= nowNanos && nowNanos - t > window { break }
            n += 1
        }
        guard n > 0 else { deviationNanos = 0; return }
        // Drop the k largest.
        let k = droppingOutliers ? min(n - 1, Int(Double(n) * Self.outlierFraction), Self.mostOutliersDropped) : 0
        let slope = deviceClockPPM * 1e-6
        var (least, deviation) = spread(count: n, slope: slope, nowNanos: nowNanos, rank: k)
        if slope != 0 {
            // The device clock's figure is only worth taking out when it explains a creep: one read off a start
            // whose device stalled (a figure off by 1,000 ppm, fading over a minute) would otherwise add its
            // slope × the window's age — 2 ms of jitter that no packet has.
            let plain = spread(count: n, slope: 0, nowNanos: nowNanos, rank: k)
            if plain.deviation < deviation { (least, deviation) = plain }
        }
        leastTransit = least
        deviationNanos = deviation
    }

    /// The least of the window's newest `count` transits, with `slope` × their age added, and the value of rank
    /// `rank` (0 = largest) above it.
    private mutating func spread(count n: Int, slope: Double, nowNanos: UInt64, rank k: Int)
        -> (least: Double, deviation: Double)
    {
        var least = Double.infinity
        var i = next
        largest.start(keeping: k + 1)
        for _ in 0..<n {
            i = i == 0 ? Self.transitCapacity - 1 : i - 1
            let residual = transits[i] + slope * Double(Int64(bitPattern: nowNanos &- arrivals[i]))
            largest.offer(residual)
            least = min(least, residual)
        }
        return (least, largest.smallest - least)
    }
}

/// The `count` largest of the values offered since `start`, kept in descending order in preallocated storage: the
/// value of rank `count − 1` (0 = largest) of a pass, found in one pass.
///
/// Each value costs one comparison against the smallest kept, and, when it is among the largest so far, at most
/// `count` moves: at most n·`count` steps for n values in any order. (A quickselect is O(n) on average but O(n²) on
/// an order made to defeat its pivot choice: 8.4 M comparisons instead of about 6 000 for 4 096 transits, 2.2 ms a
/// recomputation on the playback thread in a release build, against 20 µs.)
struct LargestValues {
    /// Kept values, largest first: `kept[0..<filled]`.
    private var kept: [Double]
    private var filled = 0
    private var count = 1

    /// Room for `capacity` values (the most any pass keeps).
    init(capacity: Int) {
        precondition(capacity >= 1)
        kept = [Double](repeating: 0, count: capacity)
    }

    /// Starts a pass that keeps the `count` largest (1 ≤ `count` ≤ the capacity).
    mutating func start(keeping count: Int) {
        precondition(count >= 1 && count <= kept.count, "LargestValues keeps 1 to \(kept.count) values, not \(count)")
        self.count = count
        filled = 0
    }

    /// Offers `value` to the pass.
    mutating func offer(_ value: Double) {
        var p: Int
        if filled < count {
            p = filled
            filled += 1
        } else if value > kept[count - 1] {
            p = count - 1   // the smallest kept drops out
        } else {
            return
        }
        while p > 0 && kept[p - 1] < value {
            kept[p] = kept[p - 1]
            p -= 1
        }
        kept[p] = value
    }

    /// The smallest of those kept: the value of rank `count − 1` among the values offered (0 = largest), or of the
    /// smallest rank there is when fewer were offered; −∞ when none was.
    var smallest: Double { filled == 0 ? -.infinity : kept[filled - 1] }
}
