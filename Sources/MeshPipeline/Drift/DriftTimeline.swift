/// The render calls' timeline, for the drift estimate: each call's lateness — the time its first frame will play
/// (call time + the device's queue) minus the nominal time of the frames rendered since the anchor. Anchored at the
/// first call; re-anchored at a call whose lateness is more than `rebaseNanos` (20 ms) from the lateness floor (a
/// device restart, a long stall, a pre-fill). Pure.
public struct RenderTimeline: Sendable {
    /// How far the lateness may move from the floor before the timeline is re-anchored.
    public static let rebaseNanos = 20e6

    /// What a render call did to the anchor.
    public enum Anchoring: Sendable, Equatable {
        /// The timeline goes on (or was anchored for the first time).
        case kept
        /// The timeline jumped: re-anchored at this call (its lateness is 0); the lateness floor no longer applies.
        case rebased
    }

    private enum State {
        case unanchored
        /// Anchored where frame 0 of the count played (`playNanos`), with `renderedFrames` rendered since.
        case anchored(playNanos: UInt64, renderedFrames: UInt64)
    }

    private let rate: Double
    private var state = State.unanchored
    /// The latest call's lateness, nanoseconds (0 before any call and right after a re-anchoring).
    public private(set) var latenessNanos: Double = 0

    /// An unanchored timeline at `sampleRate` frames per second.
    public init(sampleRate: Int) { rate = Double(sampleRate) }

    /// A render call at `nowNanos` whose first frame plays after `deviceDelayFrames` more frames, judged against the
    /// lateness floor (`nil` when there is none).
    public mutating func noteCall(nowNanos: UInt64, deviceDelayFrames: Int, latenessFloorNanos: Double?) -> Anchoring {
        let play = nowNanos &+ UInt64(Double(max(0, deviceDelayFrames)) * 1e9 / rate)
        var origin = play, rendered: UInt64 = 0
        if case .anchored(let anchor, let count) = state {
            origin = anchor
            rendered = count
        } else {
            state = .anchored(playNanos: play, renderedFrames: 0)
        }
        latenessNanos = Double(Int64(bitPattern: play &- origin)) - Double(rendered) * 1e9 / rate
        if let floor = latenessFloorNanos, abs(latenessNanos - floor) > Self.rebaseNanos {
            state = .anchored(playNanos: play, renderedFrames: 0)
            latenessNanos = 0
            return .rebased
        }
        return .kept
    }

    /// The latest call rendered `frames` frames.
    public mutating func noteRendered(frames: Int) {
        guard case .anchored(let anchor, let count) = state else { return }
        state = .anchored(playNanos: anchor, renderedFrames: count &+ UInt64(frames))
    }
}

/// The packets' timeline, for the drift estimate: each packet's transit — arrival time minus the nominal time of its
/// last frame, counted from the stream's anchor packet (its first frame arrived at the anchor's arrival). Anchored by
/// the caller at the stream's first packet and again when the stream restarts. Pure.
public struct ArrivalTimeline: Sendable {
    private enum State {
        case unanchored
        /// Frame `frame` counts as having arrived at `arrivalNanos`.
        case anchored(frame: UInt64, arrivalNanos: UInt64)
    }

    private let rate: Double
    private var state = State.unanchored

    /// An unanchored timeline at `sampleRate` frames per second.
    public init(sampleRate: Int) { rate = Double(sampleRate) }

    /// Whether a packet anchored the timeline.
    public var isAnchored: Bool { if case .anchored = state { true } else { false } }

    /// Anchors the timeline at a packet whose first frame is `firstFrame`, arrived at `arrivalNanos`.
    public mutating func anchor(firstFrame: UInt64, arrivalNanos: UInt64) {
        state = .anchored(frame: firstFrame, arrivalNanos: arrivalNanos)
    }

    /// The transit of a packet ending at frame `end` (exclusive) that arrived at `arrivalNanos`, nanoseconds (from
    /// origin 0 while unanchored).
    public func transitNanos(end: UInt64, arrivalNanos: UInt64) -> Double {
        var anchorFrame: UInt64 = 0, anchorNanos: UInt64 = 0
        if case .anchored(let frame, let nanos) = state {
            anchorFrame = frame
            anchorNanos = nanos
        }
        return Double(Int64(bitPattern: arrivalNanos &- anchorNanos)) - Double(Int64(bitPattern: end &- anchorFrame)) * 1e9 / rate
    }
}
