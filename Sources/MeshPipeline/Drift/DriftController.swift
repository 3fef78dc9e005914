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
/// **Timelines.** The controller keeps the two timelines it compares (`RenderTimeline`, `ArrivalTimeline`): the
/// playout chain reports each render call (`noteRenderCall`, `noteRendered`) and each packet (`notePacket`), and asks
/// for the block's `steer`ing — the jitter-free latency, the correction, and whether its floors are ready.
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
    /// The render calls' timeline (lateness).
    public private(set) var renderTimeline: RenderTimeline
    /// The packets' timeline (transit).
    public private(set) var arrivalTimeline: ArrivalTimeline

    /// A controller for a stream at `sampleRate`, with nothing observed yet.
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
        renderTimeline = RenderTimeline(sampleRate: sampleRate)
        arrivalTimeline = ArrivalTimeline(sampleRate: sampleRate)
    }

    /// Consumption ratio, exactly 1.0 while disengaged.
    public var ratio: Double { engaged ? 1 + correctionPPM * 1e-6 : 1 }

    /// Back to the initial state (new stream): disengaged, floors and estimates forgotten. The timelines stay (the
    /// render timeline belongs to the device; the arrival timeline is re-anchored by the caller's next packet).
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

    // MARK: - The playout chain's inputs

    /// A render call at `nowNanos` whose first frame plays after `deviceDelayFrames` more frames: advances the render
    /// timeline (re-anchoring it, and forgetting the lateness floor, when it jumped) and feeds its lateness to the
    /// lateness floor.
    public mutating func noteRenderCall(nowNanos: UInt64, deviceDelayFrames: Int) {
        let anchoring = renderTimeline.noteCall(nowNanos: nowNanos, deviceDelayFrames: deviceDelayFrames,
                                                latenessFloorNanos: latenessFloor(atNanos: nowNanos))
        if anchoring == .rebased { rebaseRenderTimeline() }
        noteRender(latenessNanos: renderTimeline.latenessNanos, atNanos: nowNanos)
    }

    /// The render call produced `frames` frames.
    public mutating func noteRendered(frames: Int) {
        renderTimeline.noteRendered(frames: frames)
    }

    /// A packet of `frames` frames from `firstFrame` arrived at `arrivalNanos`; `streamRestarted` when the jitter
    /// buffer restarted the stream at it (the sender may be another clock: the controller starts over, and the
    /// arrival timeline is re-anchored). Feeds its transit to the transit floor.
    public mutating func notePacket(firstFrame: UInt64, frames: Int, arrivalNanos: UInt64, streamRestarted: Bool) {
        if streamRestarted || !arrivalTimeline.isAnchored {
            if arrivalTimeline.isAnchored { reset() }
            arrivalTimeline.anchor(firstFrame: firstFrame, arrivalNanos: arrivalNanos)
        }
        noteArrival(transitNanos: arrivalTimeline.transitNanos(end: firstFrame &+ UInt64(frames), arrivalNanos: arrivalNanos),
                    atNanos: arrivalNanos)
    }

    /// One control step for a block at `nowNanos`, given the latency `measuredLatencyFrames` held on this side
    /// (jitter buffer + downstream queue, as measured) and the `stream` the jitter buffer holds (nil when idle).
    /// While the stream plays, this is `update`: the returned steering carries the correction to apply.
    public mutating func steer(measuredLatencyFrames measured: Double, stream: BufferedStream?, nowNanos: UInt64)
        -> DriftSteering
    {
        var steering = DriftSteering(measuredLatencyFrames: measured, steadyLatencyFrames: measured,
                                     correctionPPM: nil, engaged: engaged, floorsReady: floorsReady)
        guard let stream else { return steering }
        steering.steadyLatencyFrames = steadyLatency(
            rawFrames: measured, latenessNanos: renderTimeline.latenessNanos,
            newestTransitNanos: arrivalTimeline.transitNanos(end: stream.newestFrameEnd, arrivalNanos: stream.newestArrivalNanos),
            atNanos: nowNanos)
        guard stream.isPlaying else { return steering }   // the controller only regulates a running stream
        steering.correctionPPM = update(steadyLatencyFrames: steering.steadyLatencyFrames,
                                        targetFrames: stream.targetFrames, nowNanos: nowNanos)
        steering.engaged = engaged
        return steering
    }
}

/// What the drift controller needs to know each block about the stream the jitter buffer holds.
public struct BufferedStream: Sendable, Equatable {
    /// One past the newest frame received.
    public var newestFrameEnd: UInt64
    /// Arrival time of the packet holding the newest frame, nanoseconds.
    public var newestArrivalNanos: UInt64
    /// The jitter buffer's target delay, frames.
    public var targetFrames: Double
    /// Whether the stream plays (priming is over): only then does the controller regulate.
    public var isPlaying: Bool

    public init(newestFrameEnd: UInt64, newestArrivalNanos: UInt64, targetFrames: Double, isPlaying: Bool) {
        self.newestFrameEnd = newestFrameEnd
        self.newestArrivalNanos = newestArrivalNanos
        self.targetFrames = targetFrames
        self.isPlaying = isPlaying
    }
}

/// The drift controller's output for one block: its word to the resampler (correction, engagement) and to the
/// jitter buffer (the jitter-free latency, whether its floors are ready).
public struct DriftSteering: Sendable, Equatable {
    /// The latency held on this side as measured this block, frames.
    public var measuredLatencyFrames: Double
    /// The same with the jitter taken out (equal to it without a stream or floors), frames.
    public var steadyLatencyFrames: Double
    /// The correction to apply from this block on, ppm; nil while no stream plays (the ratio is left as it is).
    public var correctionPPM: Double?
    /// Whether the loop is engaged: the resampler belongs in the chain.
    public var engaged: Bool
    /// Whether the floors have seen enough to de-jitter the latency (a priming jitter buffer may start).
    public var floorsReady: Bool

    /// The jitter buffer's share: the jitter to take out of its latency, and whether to hold its start.
    public var jitterFeedback: JitterBuffer.DriftFeedback {
        JitterBuffer.DriftFeedback(steadyOffsetFrames: steadyLatencyFrames - measuredLatencyFrames, holdStart: !floorsReady)
    }
}
