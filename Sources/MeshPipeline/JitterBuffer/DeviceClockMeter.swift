/// How fast the playout device's clock runs against this machine's monotonic clock, from the render calls alone:
/// frames pulled over monotonic time since an anchor taken `settleSeconds` into the stream (start-up pulls are
/// irregular). Render-call jitter of ±1 ms costs 1 ms over the whole span, under 20 ppm after a minute. Pure.
struct DeviceClockMeter {
    /// Time from the first pull to the anchor, seconds.
    let settleSeconds: Double
    /// Span over which the first figure is given, seconds.
    let minimumSpanSeconds: Double
    /// Frames per second the device is meant to run at.
    let rate: Double

    private enum State {
        /// No pull yet.
        case idle
        /// Pulls since `first`, not yet anchored.
        case settling(first: UInt64)
        /// Anchored at `anchor`, with `frames` pulled since.
        case measuring(anchor: UInt64, frames: UInt64)
    }

    private var state = State.idle
    /// The device's clock against the monotonic clock, ppm: positive when it runs slow (0 until measured).
    private(set) var ppm: Double = 0

    init(rate: Double, settleSeconds: Double = 1, minimumSpanSeconds: Double = 3) {
        self.rate = rate
        self.settleSeconds = settleSeconds
        self.minimumSpanSeconds = minimumSpanSeconds
    }

    /// A pull of `frames` frames at `nowNanos`.
    mutating func notePull(frames: Int, nowNanos now: UInt64) {
        switch state {
        case .idle:
            state = .settling(first: now)
        case .settling(let first):
            if now >= first, Double(now - first) >= settleSeconds * 1e9 {
                state = .measuring(anchor: now, frames: UInt64(frames))
            }
        case .measuring(let anchor, let pulled):
            // `pulled` frames (since the anchor pull, included) have played by this pull.
            state = .measuring(anchor: anchor, frames: pulled &+ UInt64(frames))
            guard now > anchor else { return }
            let elapsed = Double(now - anchor)
            if elapsed >= minimumSpanSeconds * 1e9 {
                let played = Double(pulled) * 1e9 / rate
                ppm = min(10_000, max(-10_000, (elapsed - played) / elapsed * 1e6))
            }
        }
    }
}
