import Synchronization

/// The listener's controls over what a playout pipeline plays: hold (the host paused this player), volume, mute
/// and a confirmation beep. Set from any thread; the render thread reads them once per pull, so one object outlives
/// the pipelines it is given to (a format change keeps the volume).
public final class OutputControls: Sendable {
    /// The volume range, dB.
    public static let volumeRange: ClosedRange<Double> = -60...12

    private let heldFlag = Atomic<Bool>(false)
    private let mutedFlag = Atomic<Bool>(false)
    private let volumeBits = Atomic<UInt64>(0.0.bitPattern)
    private let beepRequests = Atomic<UInt32>(0)

    public init() {}

    /// Whether playback is held: the pipeline plays silence and drops what arrives; when released it starts again at
    /// the live edge (the jitter buffer primes afresh), with no backlog.
    public var held: Bool {
        get { heldFlag.load(ordering: .relaxed) }
        set { heldFlag.store(newValue, ordering: .relaxed) }
    }

    /// Whether the output is muted (the stream goes on underneath; unmuting is immediate, ramped).
    public var muted: Bool {
        get { mutedFlag.load(ordering: .relaxed) }
        set { mutedFlag.store(newValue, ordering: .relaxed) }
    }

    /// The volume in dB, clamped to `volumeRange` (0 = as sent).
    public var volumeDB: Double {
        get { Double(bitPattern: volumeBits.load(ordering: .relaxed)) }
        set {
            let v = newValue.isFinite ? min(max(newValue, Self.volumeRange.lowerBound), Self.volumeRange.upperBound) : 0
            volumeBits.store(v.bitPattern, ordering: .relaxed)
        }
    }

    /// The linear gain the render thread ramps to.
    public var targetGain: Float {
        muted ? 0 : Float(Self.linear(dB: volumeDB))
    }

    /// Plays a short confirmation beep (mixed over the output, not subject to the volume; silent when muted).
    public func beep() { beepRequests.add(1, ordering: .relaxed) }

    var beepCount: UInt32 { beepRequests.load(ordering: .relaxed) }

    /// 10^(dB/20), without Foundation or libm (MeshPipeline's render path uses neither): 10^x = 2^(x · log2 10),
    /// split into a power of two and e^(fraction · ln 2) by its series (16 terms: accurate to 1e-12).
    static func linear(dB: Double) -> Double {
        let x = dB / 20 * 3.321928094887362
        let whole = x.rounded(.down)
        let frac = x - whole
        let y = frac * 0.6931471805599453
        var term = 1.0, sum = 1.0
        for n in 1...16 {
            term *= y / Double(n)
            sum += term
        }
        return sum * Double(sign: .plus, exponent: Int(whole), significand: 1)
    }
}

/// The last stage of the playout chain, on the render thread: ramps the gain to the controls' target (10 ms per
/// change, so a volume step or a mute never clicks), mixes in the confirmation beep, and keeps every sample within
/// full scale (what is not finite made silence: `AudioPacket.sanitize`, as for a peer's samples), whatever the stages
/// before made of a peer's audio: the device is never handed more than it can play. Real-time safe.
public struct OutputStage: Sendable {
    /// Frames a full gain change takes.
    public let rampFrames: Int
    private let channels: Int
    private let rate: Double
    /// The gain now (reached by the ramp).
    public private(set) var gain: Float = 1
    private var beepsSeen: UInt32 = 0
    private var beepLeft = 0
    private var beepPhase: Double = 0
    private let beepFrames: Int

    public init(sampleRate: Int, channels: Int) {
        rate = Double(sampleRate)
        self.channels = channels
        rampFrames = max(1, sampleRate / 100)
        beepFrames = sampleRate / 10
    }

    /// A stage that goes on where `controls` stand: at their gain, with the beeps asked for so far already played. A
    /// pipeline built for a format change neither replays the last beep nor ramps from full volume.
    public init(sampleRate: Int, channels: Int, continuing controls: OutputControls) {
        self.init(sampleRate: sampleRate, channels: channels)
        gain = controls.targetGain
        beepsSeen = controls.beepCount
    }

    /// Applies `target` gain (ramped) and any beep requested (`beeps` is the controls' running count) to `frames`
    /// interleaved frames at `out`.
    public mutating func process(_ out: UnsafeMutablePointer<Float>, frames: Int, target: Float, beeps: UInt32, muted: Bool) {
        let step = 1 / Float(rampFrames)
        if gain != target || gain != 1 {
            for f in 0..<frames {
                if gain < target { gain = min(target, gain + step) } else if gain > target { gain = max(target, gain - step) }
                for c in 0..<channels { out[f * channels + c] *= gain }
            }
        }
        if beeps != beepsSeen {
            beepsSeen = beeps
            beepLeft = beepFrames
            beepPhase = 0
        }
        if beepLeft > 0 {
            let n = min(frames, beepLeft)
            let fade = Double(max(1, beepFrames / 20))
            for f in 0..<n {
                let played = beepFrames - beepLeft
                let envelope = min(1, Double(played) / fade, Double(beepLeft) / fade)
                let v = muted ? 0 : Float(0.25 * envelope * Self.sine(beepPhase))
                beepPhase += 880 / rate
                if beepPhase >= 1 { beepPhase -= 1 }
                for c in 0..<channels { out[f * channels + c] += v }
                beepLeft -= 1
            }
        }
        _ = AudioPacket.sanitize(UnsafeMutableBufferPointer(start: out, count: frames * channels))
    }

    /// sin(2π·phase) for phase in [0, 1), without Foundation (a 7th-order odd polynomial on the folded quarter wave).
    static func sine(_ phase: Double) -> Double {
        var p = phase - phase.rounded(.down)  // [0, 1)
        var sign = 1.0
        if p >= 0.5 { p -= 0.5; sign = -1 }   // [0, 0.5): the positive half
        if p > 0.25 { p = 0.5 - p }           // [0, 0.25]: the rising quarter
        let x = p * 2 * Double.pi
        let x2 = x * x
        return sign * x * (1 - x2 / 6 * (1 - x2 / 20 * (1 - x2 / 42 * (1 - x2 / 72))))
    }
}
