/// The minimum of a value over a sliding time window, kept in fixed time buckets (preallocated: `add` and
/// `minimum` never allocate).
///
/// The window covers the current bucket and the `buckets − 1` before it, so it spans between
/// `(buckets − 1)·bucketNanos` and `buckets·bucketNanos`.
public struct SlidingMinimum: Sendable {
    /// Bucket length, nanoseconds.
    public let bucketNanos: UInt64
    private var ids: [Int64]
    private var mins: [Double]

    /// A window of `buckets` buckets of `bucketNanos` each.
    public init(bucketNanos: UInt64, buckets: Int) {
        precondition(bucketNanos > 0 && buckets > 0, "SlidingMinimum needs a positive bucket length and count")
        self.bucketNanos = bucketNanos
        ids = [Int64](repeating: Int64.min, count: buckets)
        mins = [Double](repeating: 0, count: buckets)
    }

    /// Forgets every sample.
    public mutating func reset() {
        for i in ids.indices { ids[i] = Int64.min }
    }

    /// Records `value` observed at `nanos`.
    public mutating func add(_ value: Double, atNanos nanos: UInt64) {
        let id = Int64(nanos / bucketNanos)
        let b = Int(id % Int64(ids.count))
        if ids[b] != id {
            ids[b] = id
            mins[b] = value
        } else if value < mins[b] {
            mins[b] = value
        }
    }

    /// The minimum over the window ending at `nanos`, or nil when the window holds no sample.
    public func minimum(atNanos nanos: UInt64) -> Double? {
        let id = Int64(nanos / bucketNanos)
        let oldest = id - Int64(ids.count) + 1
        var m = Double.infinity
        for i in ids.indices where ids[i] >= oldest && ids[i] <= id { m = min(m, mins[i]) }
        return m.isFinite ? m : nil
    }
}

/// Clock-drift control loop: estimates the long-term rate difference between the sender's clock and the playout
/// device's clock, robustly to jitter, and turns it into a resampling correction.
///
/// **Jitter-free latency.** Network and scheduling jitter only ever *add* delay: a packet never arrives before
/// its least-delayed siblings, a render call never runs before the device's schedule. So the controller tracks
/// two floors over a `floorWindowSeconds` window — the least packet transit (`noteArrival`: arrival time minus the
/// packet's nominal capture time, receiver clock) and the least render lateness (`noteRender`: render time minus
/// the nominal time of the frames rendered so far) — and measures
///
/// - the **clock excursion** X = rate·(render floor − transit floor): constant when both ends share one clock,
///   a ramp of slope (sender rate − device rate) otherwise; it does not see jitter, stretches, skips or target
///   changes at all;
/// - the **steady latency** (`steadyLatency`): the renderer's raw latency with the jitter of the newest packet's
///   arrival and of the current render call taken out (what the latency would be with least-delayed arrivals).
///
/// **Engagement (deadband with hysteresis).** Nothing happens during the first `settleSeconds` of a stream
/// (start-up, the adaptive target settling — large errors there are the jitter buffer's stretch/skip job). Then
/// the excursion is referenced to zero and low-pass filtered; the loop engages only after the filtered excursion
/// has stayed beyond ±`deadbandSeconds` for `confirmSeconds` (the evidence is cleared when it falls back within
/// ±`releaseSeconds`). A change of the excursion faster than any clock can drift (`stepSeconds` within half a
/// second: a network path or device timeline change) is a step, not drift, and is subtracted out. On one shared
/// clock the excursion stays at zero, so the ratio stays exactly 1.0 and
/// playback stays bit-exact. Once engaged the loop stays engaged until `reset()` (a drifting clock never stops
/// drifting, and the resampler cannot leave the chain seamlessly).
///
/// **Control when engaged.** correction = estimated drift + trim, where the drift is the least-squares slope of
/// the excursion (1 s bucket means over the last `slopeWindowSeconds`), and the trim pulls the steady latency
/// to the target with time constant `trimSeconds`, its error clamped to ±`trimLimitSeconds` (so target changes
/// move the ratio by at most a few hundred ppm). Clamped to ±`maximumCorrectionPPM`.
/// Ratio = input frames consumed per output frame: above 1 drains the buffer, below 1 fills it.
///
/// Pure and allocation-free after `init` (fixed-size arrays, mutated in place).
public struct DriftController: Sendable {
    /// Tuning.
    public struct Configuration: Sendable, Equatable {
        /// Largest correction, ppm.
        public var maximumCorrectionPPM: Double = 1000
        /// Window of the least-transit and least-lateness floors.
        public var floorWindowSeconds: Double = 1
        /// Playing time before the excursion is referenced (start-up settling stays out of the loop).
        public var settleSeconds: Double = 2
        /// Filtered excursion that counts as drift.
        public var deadbandSeconds: Double = 0.00075
        /// Filtered excursion below which the engagement evidence is cleared (hysteresis).
        public var releaseSeconds: Double = 0.0004
        /// How long the excursion must stay beyond the deadband before the loop engages.
        public var confirmSeconds: Double = 2
        /// Low-pass time constant of the excursion.
        public var excursionFilterSeconds: Double = 1
        /// Span of the drift-slope regression (1 s buckets).
        public var slopeWindowSeconds: Double = 32
        /// Time constant of the trim that pulls the steady latency to the target.
        public var trimSeconds: Double = 10
        /// Largest latency error the trim acts on.
        public var trimLimitSeconds: Double = 0.002
        /// An excursion change larger than this within 0.25–0.5 s (beyond the estimated drift) is a step — a
        /// network path or device timeline change, not clock drift (0.5 ms per 0.5 s is 1000 ppm, the largest
        /// correction) — and is taken out of the excursion.
        public var stepSeconds: Double = 0.0005
        /// Render calls seen on the current render timeline before the floors are trusted (`floorsReady`).
        public var minimumRenderSamples: Int = 32
        public init() {}
    }

    /// The tuning in use.
    public let configuration: Configuration
    /// Frames per second of the controlled stream.
    public let sampleRate: Int
    /// Whether the loop is engaged (the resampler should be in the chain).
    public private(set) var engaged = false
    /// Current correction in ppm (0 while disengaged).
    public private(set) var correctionPPM: Double = 0
    /// Latest drift estimate (slope of the excursion), ppm; 0 until there are enough data.
    public private(set) var estimatedDriftPPM: Double = 0
    /// Low-pass filtered clock excursion since the reference, seconds (0 before the reference).
    public private(set) var filteredExcursion: Double = 0
    /// Seconds the filtered excursion has been beyond the deadband.
    public private(set) var evidenceSeconds: Double = 0

    private let rate: Double
    private var transitFloor: SlidingMinimum
    private var latenessFloor: SlidingMinimum
    private var settleStart: UInt64 = 0
    private var settling = true
    private var lastUpdate: UInt64 = 0
    private var reference: Double = 0
    private var referenced = false
    private var haveSlope = false
    // Slope regression: completed 1 s buckets (time since reference in s, mean excursion in frames).
    private let slopeBuckets: Int
    private var bucketT: [Double]
    private var bucketX: [Double]
    private var bucketCount = 0
    private var bucketNext = 0
    private var currentID: Int64 = -1
    private var currentSum: Double = 0
    private var currentN = 0
    // Step rejection: an excursion sample 0.25–0.5 s old, the current one, and the total of the steps removed.
    private var stepOffset: Double = 0
    private var previousX: Double = 0, previousAt: UInt64 = 0
    private var latestX: Double = 0, latestAt: UInt64 = 0
    private var renderSamples = 0
    private var arrivalSamples = 0
    /// Steps taken out of the excursion since the last reference.
    public private(set) var steps = 0

    public init(sampleRate: Int, configuration: Configuration = Configuration()) {
        self.sampleRate = sampleRate
        self.configuration = configuration
        rate = Double(sampleRate)
        let bucket = UInt64(max(0.01, configuration.floorWindowSeconds / 4) * 1e9)
        transitFloor = SlidingMinimum(bucketNanos: bucket, buckets: 5)
        latenessFloor = SlidingMinimum(bucketNanos: bucket, buckets: 5)
        slopeBuckets = max(4, Int(configuration.slopeWindowSeconds.rounded()))
        bucketT = [Double](repeating: 0, count: slopeBuckets)
        bucketX = [Double](repeating: 0, count: slopeBuckets)
    }

    /// Consumption ratio, exactly 1.0 while disengaged.
    public var ratio: Double { engaged ? 1 + correctionPPM * 1e-6 : 1 }

    /// Back to the initial state (new stream): disengaged, floors and estimates forgotten.
    public mutating func reset() {
        engaged = false
        correctionPPM = 0
        estimatedDriftPPM = 0
        haveSlope = false
        transitFloor.reset()
        latenessFloor.reset()
        renderSamples = 0
        arrivalSamples = 0
        restartReference()
    }

    /// The render timeline jumped (device restart, long stall): forget the lateness floor and the excursion
    /// reference (they no longer line up), keep the engagement and the drift estimate.
    public mutating func rebaseRenderTimeline() {
        latenessFloor.reset()
        renderSamples = 0
        restartReference()
    }

    /// The transit timeline jumped (stream restarted at another frame origin): forget the transit floor and the
    /// excursion reference, keep the engagement and the drift estimate.
    public mutating func rebaseArrivalTimeline() {
        transitFloor.reset()
        arrivalSamples = 0
        restartReference()
    }

    private mutating func restartReference() {
        settling = true
        settleStart = 0
        lastUpdate = 0
        referenced = false
        filteredExcursion = 0
        evidenceSeconds = 0
        bucketCount = 0
        bucketNext = 0
        currentID = -1
        currentSum = 0
        currentN = 0
        stepOffset = 0
        previousAt = 0
        latestAt = 0
        steps = 0
    }

    /// Whether the floors have seen enough to de-jitter the latency (the jitter buffer should not start playing
    /// on a latency measured at one possibly-late render call).
    public var floorsReady: Bool { renderSamples >= configuration.minimumRenderSamples && arrivalSamples > 0 }

    /// A packet arrived: its transit (arrival − nominal capture time of its last frame, any fixed origin),
    /// nanoseconds, observed at `atNanos`.
    public mutating func noteArrival(transitNanos: Double, atNanos: UInt64) {
        transitFloor.add(transitNanos, atNanos: atNanos)
        arrivalSamples &+= 1
    }

    /// A render call: its lateness (call time − nominal time of the frames rendered before it, any fixed
    /// origin), nanoseconds, at `atNanos`.
    public mutating func noteRender(latenessNanos: Double, atNanos: UInt64) {
        latenessFloor.add(latenessNanos, atNanos: atNanos)
        renderSamples &+= 1
    }

    /// The render lateness floor at `nanos` (nil before any render in the window).
    public func latenessFloor(atNanos nanos: UInt64) -> Double? { latenessFloor.minimum(atNanos: nanos) }

    /// The transit floor at `nanos` (nil before any arrival in the window).
    public func transitFloor(atNanos nanos: UInt64) -> Double? { transitFloor.minimum(atNanos: nanos) }

    /// The clock excursion X = rate·(lateness floor − transit floor), frames (nil without both floors).
    public func excursionFrames(atNanos nanos: UInt64) -> Double? {
        guard let r = latenessFloor.minimum(atNanos: nanos), let t = transitFloor.minimum(atNanos: nanos) else { return nil }
        return (r - t) * rate / 1e9
    }

    /// The jitter-free latency: `rawFrames` (measured with the newest packet's real arrival at a render call of
    /// lateness `latenessNanos`) with the excess arrival delay of that packet (`newestTransitNanos` above the
    /// transit floor) added back and the excess render lateness taken out. `rawFrames` when a floor is missing.
    public func steadyLatency(rawFrames: Double, latenessNanos: Double, newestTransitNanos: Double, atNanos: UInt64)
        -> Double
    {
        guard let r = latenessFloor.minimum(atNanos: atNanos), let t = transitFloor.minimum(atNanos: atNanos) else {
            return rawFrames
        }
        return rawFrames + (max(0, newestTransitNanos - t) - max(0, latenessNanos - r)) * rate / 1e9
    }

    /// One control step at `nowNanos` while a stream is playing: updates the excursion, the drift estimate and
    /// the engagement, and returns the correction in ppm to apply until the next step (0 while disengaged).
    /// `steadyLatencyFrames` and `targetFrames` drive the trim once engaged.
    @discardableResult
    public mutating func update(steadyLatencyFrames: Double, targetFrames: Double, nowNanos: UInt64) -> Double {
        let c = configuration
        // Render times may step back a little (jittered calls): every interval is signed and clamped at 0.
        let dt = lastUpdate == 0 ? 0 : seconds(nowNanos, since: lastUpdate)
        if nowNanos > lastUpdate { lastUpdate = nowNanos }
        if settleStart == 0 { settleStart = max(1, nowNanos) }
        if settling {
            if seconds(nowNanos, since: settleStart) >= c.settleSeconds { settling = false }
        }
        if !settling, let raw = excursionFrames(atNanos: nowNanos) {
            var x = raw - stepOffset
            if !referenced {
                reference = x
                referenced = true
                settleStart = nowNanos
                previousX = x; previousAt = nowNanos
                latestX = x; latestAt = nowNanos
            }
            // Step rejection: compare with a sample 0.25–0.5 s old.
            let age = seconds(nowNanos, since: previousAt)
            let expected = estimatedDriftPPM * 1e-6 * rate * age
            let change = x - previousX - expected
            if abs(change) > c.stepSeconds * rate {
                stepOffset += change
                x -= change
                steps += 1
                previousX = x; previousAt = nowNanos
                latestX = x; latestAt = nowNanos
            } else if seconds(nowNanos, since: latestAt) >= 0.25 {
                previousX = latestX; previousAt = latestAt
                latestX = x; latestAt = nowNanos
            }
            let e = (x - reference) / rate
            filteredExcursion += (e - filteredExcursion) * min(1, dt / c.excursionFilterSeconds)
            noteSlopeSample(x, nowNanos: nowNanos)
            if !engaged {
                if abs(filteredExcursion) > c.deadbandSeconds {
                    evidenceSeconds += dt
                } else if abs(filteredExcursion) < c.releaseSeconds {
                    evidenceSeconds = 0
                }
                if evidenceSeconds >= c.confirmSeconds && haveSlope { engaged = true }
            }
        }
        guard engaged else {
            correctionPPM = 0
            return 0
        }
        let error = (steadyLatencyFrames - targetFrames) / rate
        let trim = min(c.trimLimitSeconds, max(-c.trimLimitSeconds, error)) / c.trimSeconds
        let limit = c.maximumCorrectionPPM
        correctionPPM = min(limit, max(-limit, estimatedDriftPPM + trim * 1e6))
        return correctionPPM
    }

    /// `now − then` in seconds, 0 when `now` is earlier.
    @inline(__always)
    private func seconds(_ now: UInt64, since then: UInt64) -> Double {
        max(0, Double(Int64(bitPattern: now &- then))) / 1e9
    }

    /// Accumulates the excursion into 1 s buckets and refits the slope when a bucket completes.
    private mutating func noteSlopeSample(_ x: Double, nowNanos: UInt64) {
        let id = Int64(seconds(nowNanos, since: settleStart))
        if id != currentID {
            if currentN > 0 {
                bucketT[bucketNext] = Double(currentID) + 0.5
                bucketX[bucketNext] = currentSum / Double(currentN)
                bucketNext = (bucketNext + 1) % slopeBuckets
                bucketCount = min(slopeBuckets, bucketCount + 1)
                fitSlope()
            }
            currentID = id
            currentSum = 0
            currentN = 0
        }
        currentSum += x - reference
        currentN += 1
    }

    private mutating func fitSlope() {
        guard bucketCount >= 3 else { return }
        var st = 0.0, sx = 0.0
        for i in 0..<bucketCount { st += bucketT[i]; sx += bucketX[i] }
        let n = Double(bucketCount)
        let mt = st / n, mx = sx / n
        var stt = 0.0, stx = 0.0
        for i in 0..<bucketCount {
            let dt = bucketT[i] - mt
            stt += dt * dt
            stx += dt * (bucketX[i] - mx)
        }
        guard stt > 0 else { return }
        estimatedDriftPPM = stx / stt / rate * 1e6   // frames per second → ppm of the rate
        haveSlope = true
    }
}
