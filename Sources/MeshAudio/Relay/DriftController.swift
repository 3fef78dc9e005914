/// Clock-drift control loop: turns the playout latency error into a resampling ratio.
///
/// Host and player clocks differ (typically within ±200 ppm), so the buffered latency creeps. The controller
/// low-pass filters the latency error (`filterSeconds`) and runs a PI controller on it (gains from a critically
/// damped loop of natural frequency `naturalFrequency` rad/s), clamped to ±`maximumCorrectionPPM`, with
/// anti-windup. Ratio = input frames consumed per output frame: above 1 drains the buffer, below 1 fills it.
///
/// Deadband with hysteresis: the controller starts disengaged with a ratio of exactly 1.0 and stays there while
/// the filtered error is within ±`deadbandSeconds`; on one shared clock the latency never moves, so the ratio
/// stays exactly 1.0 and playback stays bit-exact. Once the error leaves the deadband the loop engages and stays
/// engaged until `reset()` (a drifting clock never stops drifting).
public struct DriftController: Sendable {
    /// Tuning.
    public struct Configuration: Sendable, Equatable {
        public var maximumCorrectionPPM: Double = 1000
        public var deadbandSeconds: Double = 0.00025
        public var naturalFrequency: Double = 0.3
        public var filterSeconds: Double = 0.5
        public init() {}
    }

    /// The tuning in use.
    public let configuration: Configuration
    /// Frames per second of the controlled stream.
    public let sampleRate: Int
    /// Whether the loop has left the deadband.
    public private(set) var engaged = false
    /// Low-pass filtered latency error, seconds.
    public private(set) var filteredError: Double = 0
    private var integral: Double = 0
    private var primed = false
    /// Current correction in ppm (0 while disengaged).
    public private(set) var correctionPPM: Double = 0

    public init(sampleRate: Int, configuration: Configuration = Configuration()) {
        self.sampleRate = sampleRate
        self.configuration = configuration
    }

    /// Consumption ratio, exactly 1.0 while disengaged.
    public var ratio: Double { engaged ? 1 + correctionPPM * 1e-6 : 1 }

    /// Back to the disengaged state (new stream).
    public mutating func reset() {
        engaged = false
        filteredError = 0
        integral = 0
        primed = false
        correctionPPM = 0
    }

    /// Feeds one measurement: the latency error (measured − target) in frames, observed `elapsedFrames` frames of
    /// playout after the previous one. Returns the correction in ppm to apply until the next update.
    @discardableResult
    public mutating func update(errorFrames: Double, elapsedFrames: Int) -> Double {
        let rate = Double(sampleRate)
        let e = errorFrames / rate
        let dt = Double(max(0, elapsedFrames)) / rate
        if !primed {
            filteredError = e
            primed = true
        } else {
            filteredError += (e - filteredError) * min(1, dt / configuration.filterSeconds)
        }
        if !engaged {
            guard abs(filteredError) > configuration.deadbandSeconds else { return 0 }
            engaged = true
            integral = 0
        }
        let wn = configuration.naturalFrequency
        let kp = 2 * wn, ki = wn * wn
        let limit = configuration.maximumCorrectionPPM * 1e-6
        let p = kp * filteredError
        let candidate = integral + ki * filteredError * dt
        // Anti-windup: integrate only while the output is not pinned in the direction of the error.
        if abs(p + candidate) <= limit || (candidate * filteredError < 0) || abs(candidate) < abs(integral) {
            integral = min(limit, max(-limit, candidate))
        }
        let c = min(limit, max(-limit, p + integral))
        correctionPPM = c * 1e6
        return correctionPPM
    }
}
