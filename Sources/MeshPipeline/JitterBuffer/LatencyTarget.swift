/// The delay the jitter buffer aims for, in frames, updated once per read.
///
/// The structural minimum is one render block + one packet (`structuralFrames`). `.low` pins the target to that plus
/// the safety margin; `.fixed(ms)` to the given delay (never below the structure); `.auto` covers the measured
/// transit deviation on top of `.low`: it rises at once when the deviation grows and decays back exponentially, with
/// time constant `shrinkSeconds`, when it falls — in a stream's first `startupSeconds` with `startupShrinkSeconds`
/// instead: what start-up costs (processes launching, devices opening, a JACK graph taking new clients) says little
/// about the link, and a target raised by it would otherwise take tens of seconds to come back. A rise from those
/// first seconds keeps the fast decay until it is gone (the jitter window holds a start-up stall for seconds, so the
/// decay often begins only after them); a rise later on decays at the configured pace. Never above `maximumFrames`
/// (what the buffer can hold). Pure.
struct LatencyTarget {
    /// How long after a stream starts the target decays with `startupShrinkSeconds`.
    static let startupSeconds = 5.0
    /// Time constant of the decay in a stream's first `startupSeconds` (`.auto`), seconds.
    static let startupShrinkSeconds = 1.0

    /// How the target is chosen.
    let mode: JitterBuffer.Mode
    /// Margin added to the structural minimum, milliseconds.
    let safetyMilliseconds: Double
    /// Time constant of the decay (`.auto`), seconds.
    let shrinkSeconds: Double
    /// Frames per second.
    let rate: Double
    /// The current target, frames (0 before the first update).
    private(set) var frames: Double = 0
    /// When the target was last updated (0: never).
    private var lastUpdateNanos: UInt64 = 0
    /// When the current stream started (0: no stream yet).
    private var streamStartNanos: UInt64 = 0
    /// Whether what the target holds above the desired level came from a rise in the stream's start-up.
    private var startupRise = false

    /// A target chosen as `configuration` says, at `rate` frames per second.
    init(configuration: JitterBuffer.Configuration, rate: Double) {
        mode = configuration.mode
        safetyMilliseconds = configuration.safetyMilliseconds
        shrinkSeconds = configuration.shrinkSeconds
        self.rate = rate
    }

    /// A stream started at `nanos` (its first packet's arrival).
    mutating func streamStarted(atNanos nanos: UInt64) {
        streamStartNanos = max(1, nanos)
        startupRise = false
    }

    /// Updates the target at `nowNanos` for a buffer whose render block plus packet is `structuralFrames`, over
    /// packets whose transit deviation is `deviationNanos`, holding at most `maximumFrames`.
    mutating func update(nowNanos: UInt64, structuralFrames structural: Double, deviationNanos: Double,
                         maximumFrames: Double) {
        let safety = safetyMilliseconds * rate / 1000
        let dt = lastUpdateNanos == 0 || nowNanos < lastUpdateNanos ? 0 : Double(nowNanos - lastUpdateNanos) / 1e9
        lastUpdateNanos = nowNanos
        switch mode {
        case .low:
            frames = structural + safety
        case .fixed(let ms):
            frames = max(ms * rate / 1000, structural)
        case .auto:
            let desired = structural + safety + deviationNanos * rate / 1e9
            let starting = streamStartNanos != 0 && nowNanos >= streamStartNanos
                && Double(nowNanos - streamStartNanos) < Self.startupSeconds * 1e9
            if desired >= frames {
                if desired > frames { startupRise = starting }
                frames = desired
            } else {
                if frames - desired < safety { startupRise = false }
                let fast = starting || startupRise
                frames += (desired - frames) * min(1, dt / (fast ? Self.startupShrinkSeconds : shrinkSeconds))
            }
        }
        frames = min(frames, maximumFrames)
    }
}
