import MeshAudio

/// The last stage of the playout chain: it pulls concealed stream-rate frames from upstream into a staging FIFO and
/// plays them out either bit-exact (bypass: the ratio is exactly 1) or through a drift-corrected `SpeexResampler`.
///
/// The resampler joins the chain when the drift controller engages (`DriftSteering.engaged`) and stays in from then
/// on; the switch is seamless, because the resampler is primed with the frames just played in bypass. Each block
/// the controller's correction sets its ratio. Render thread only; everything is allocated in `init`, so `render`
/// never allocates (nor locks, logs or touches Foundation).
public final class DriftResampler {
    /// The stream's format (in and out).
    public let format: AudioFormat
    /// Most frames one `render` call produces.
    public let maximumPeriodFrames: Int
    /// Whether the resampler is in the chain (it stays in once engaged).
    public private(set) var isResampling = false
    /// libspeexdsp errors so far (the affected block was filled with the last value).
    public private(set) var errors: UInt64 = 0

    private let resampler: SpeexResampler
    private let channels: Int
    // Staging FIFO of concealed, stream-rate frames waiting for the resampler.
    private let fifo: UnsafeMutablePointer<Float>
    private let fifoCapacity: Int
    private var fifoFrames = 0
    // The upstream block and its marks.
    private let block: UnsafeMutablePointer<Float>
    private let marks: UnsafeMutablePointer<UInt8>
    // The last frames played in bypass (to prime the resampler), and scratch for priming.
    private let historyFrames: Int
    private let history: UnsafeMutablePointer<Float>
    private let primeScratch: UnsafeMutablePointer<Float>
    /// The last frame handed to the sink, held if the resampler ever falls short.
    private let lastOutput: UnsafeMutablePointer<Float>

    /// A stage for `format` that renders up to `maximumPeriodFrames` frames per call, with speex `quality` (0...10),
    /// ready for corrections up to ±`maximumCorrectionPPM`. Throws when libspeexdsp refuses.
    public init(format: AudioFormat, maximumPeriodFrames: Int, quality: Int, maximumCorrectionPPM: Double) throws {
        self.format = format
        self.maximumPeriodFrames = maximumPeriodFrames
        channels = format.channels
        resampler = try SpeexResampler(channels: format.channels, inputRate: format.sampleRate,
                                       outputRate: format.sampleRate, quality: quality,
                                       maximumCorrectionPPM: maximumCorrectionPPM)
        let blockFrames = maximumPeriodFrames + maximumPeriodFrames / 8 + 16
        fifoCapacity = 2 * blockFrames
        fifo = Self.zeroed(fifoCapacity * channels)
        block = Self.zeroed(blockFrames * channels)
        marks = Self.zeroed(blockFrames)
        historyFrames = 2 * resampler.inputLatency
        history = Self.zeroed(historyFrames * channels)
        primeScratch = Self.zeroed(historyFrames * channels)
        lastOutput = Self.zeroed(channels)
    }

    /// `count` zeros, allocated for the life of the stage (freed in `deinit`).
    private static func zeroed<Element: Numeric>(_ count: Int) -> UnsafeMutablePointer<Element> {
        let memory = UnsafeMutablePointer<Element>.allocate(capacity: count)
        memory.initialize(repeating: 0, count: count)
        return memory
    }

    deinit {
        fifo.deallocate()
        block.deallocate()
        marks.deallocate()
        history.deallocate()
        primeScratch.deallocate()
        lastOutput.deallocate()
    }

    /// Frames waiting in the staging FIFO.
    public var stagedFrames: Int { fifoFrames }
    /// Input frames the resampler holds back (its look-ahead; 0 in bypass).
    public var lookAheadFrames: Double { isResampling ? Double(resampler.inputLatency) : 0 }
    /// The resampler's current consumption ratio (input frames per output frame).
    public var ratio: Double { resampler.ratio }

    /// Stream-rate frames the next `render` of `frames` frames will pull from upstream (beyond the FIFO).
    public func upstreamFramesNeeded(forOutput frames: Int) -> Int {
        let want = isResampling ? Int((Double(frames) * resampler.ratio).rounded(.up)) + 2 : frames
        return max(0, want - fifoFrames)
    }

    /// Renders `frames` frames at `nowNanos` into `output` (interleaved): first applies the drift controller's
    /// `steering` (the resampler joins the chain when it engages; the correction sets the ratio), then plays the
    /// FIFO out, topping it up from the `upstream` stage — with blocks whose `downstreamFrames` is what is queued
    /// here, and the upstream's own `feedback`.
    public func render<Upstream: FrameStage>(into output: UnsafeMutablePointer<Float>, frames: Int, nowNanos: UInt64,
                                             steering: DriftSteering, from upstream: inout Upstream,
                                             feedback: Upstream.Feedback) {
        steer(steering)
        if isResampling {
            renderResampled(output, frames: frames, nowNanos: nowNanos, from: &upstream, feedback: feedback)
        } else {
            renderBypass(output, frames: frames, nowNanos: nowNanos, from: &upstream, feedback: feedback)
        }
    }

    /// Remembers the last frame the sink got (`frame` holds one frame), the value held if the resampler ever falls
    /// short.
    public func noteLastOutput(_ frame: UnsafePointer<Float>) {
        lastOutput.update(from: frame, count: channels)
    }

    // MARK: - Internals

    private func steer(_ steering: DriftSteering) {
        guard let ppm = steering.correctionPPM, steering.engaged || isResampling else { return }
        if !isResampling {
            do {
                try resampler.prime(
                    history: UnsafeBufferPointer(start: history, count: historyFrames * channels),
                    scratch: UnsafeMutableBufferPointer(start: primeScratch, count: historyFrames * channels))
                isResampling = true
            } catch { errors &+= 1; return }
        }
        do { try resampler.setCorrection(ppm: ppm) } catch { errors &+= 1 }
    }

    /// Tops the FIFO up by `frames` more frames from upstream (as many as fit).
    private func pull<Upstream: FrameStage>(frames: Int, nowNanos: UInt64, from upstream: inout Upstream,
                                            feedback: Upstream.Feedback) {
        let n = min(frames, fifoCapacity - fifoFrames)
        guard n > 0 else { return }
        upstream.process(FrameBlock(samples: UnsafeMutableBufferPointer(start: block, count: n * channels),
                                    marks: UnsafeMutableBufferPointer(start: marks, count: n), frames: n,
                                    nowNanos: nowNanos, downstreamFrames: Double(fifoFrames) + lookAheadFrames),
                         feedback: feedback)
        (fifo + fifoFrames * channels).update(from: block, count: n * channels)
        fifoFrames += n
    }

    private func dropFIFO(_ n: Int) {
        let rest = fifoFrames - n
        if rest > 0 { fifo.update(from: fifo + n * channels, count: rest * channels) }
        fifoFrames = rest
    }

    /// Bit-exact bypass (ratio exactly 1).
    private func renderBypass<Upstream: FrameStage>(_ out: UnsafeMutablePointer<Float>, frames: Int, nowNanos: UInt64,
                                                    from upstream: inout Upstream, feedback: Upstream.Feedback) {
        if fifoFrames < frames {
            pull(frames: frames - fifoFrames, nowNanos: nowNanos, from: &upstream, feedback: feedback)
        }
        out.update(from: fifo, count: frames * channels)
        dropFIFO(frames)
        // Keep the last `historyFrames` played frames for a seamless switch to resampling.
        let h = historyFrames
        if frames >= h {
            history.update(from: out + (frames - h) * channels, count: h * channels)
        } else {
            history.update(from: history + frames * channels, count: (h - frames) * channels)
            (history + (h - frames) * channels).update(from: out, count: frames * channels)
        }
    }

    /// Drift-corrected resampling.
    private func renderResampled<Upstream: FrameStage>(_ out: UnsafeMutablePointer<Float>, frames: Int,
                                                       nowNanos: UInt64, from upstream: inout Upstream,
                                                       feedback: Upstream.Feedback) {
        var produced = 0
        var guardPasses = 0
        while produced < frames && guardPasses < 4 {
            guardPasses += 1
            let want = Int((Double(frames - produced) * resampler.ratio).rounded(.up)) + 2
            if fifoFrames < want { pull(frames: want - fifoFrames, nowNanos: nowNanos, from: &upstream, feedback: feedback) }
            do {
                let r = try resampler.process(
                    input: UnsafeBufferPointer(start: fifo, count: fifoFrames * channels),
                    output: UnsafeMutableBufferPointer(start: out + produced * channels, count: (frames - produced) * channels))
                dropFIFO(r.consumed)
                produced += r.produced
            } catch {
                errors &+= 1
                break
            }
        }
        if produced < frames {
            // Should not happen (the FIFO is topped up before each pass); hold the last value rather than click.
            for i in produced..<frames {
                for c in 0..<channels {
                    out[i * channels + c] = i > 0 ? out[(i - 1) * channels + c] : lastOutput[c]
                }
            }
        }
    }
}
