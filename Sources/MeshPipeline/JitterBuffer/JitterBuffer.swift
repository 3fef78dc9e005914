import MeshAudio

/// The receive-side jitter buffer: packets in, a steady stream of frames (with loss marks) out.
///
/// A pure struct, driven by the render thread; no allocation after `init`, no clocks of its own — arrival and render
/// times are passed in, so it runs in virtual time under test. It is a thin composition of pure parts: the frames
/// (`FrameStore`), the loss count (`LossTracker`), the jitter measure (`JitterEstimator`), the target policy
/// (`LatencyTarget`), and the stretch/skip (`LatencyCorrector`, `CrossfadeGuard`) and resync (`ResyncDetector`)
/// decisions. Packets come decoded and in the buffer's format: `PacketIngress` is where formats are checked.
///
/// - Ordering: packets land at their frame index, so reordering is free. A packet any part of which is behind
///   the playout point is dropped as `late` (even a late copy of a packet already played); one whose frames
///   are all present already is a `duplicate`. A 1024-entry sequence bitmap keeps late copies out of the loss
///   count. One exception, a *late resume*: the packet that continues the stream exactly where the newest one
///   ended, less than a render block + packet behind (the stream stalled, or its timeline moved a little later:
///   its frames were concealed at the newest end), moves the playout point back to it and plays — the concealment
///   becomes a stretch (`stretchedFrames`, `lateResumes`) that the latency corrector may give back — instead of
///   dropping it and every packet after it that would be late the same way.
/// - Startup: the first packet sets the playout point at its first frame (a burst beyond the target drops the
///   oldest frames before the start); output stays silent (`.silent` marks, so that after a resync the concealer
///   fades out what was playing) until the buffered latency reaches the target — playback starts inside the read at the exact frame where it does —
///   then starts with a fade-in (a `.discontinuity` mark).
/// - Playout never stops: a frame that is not there when its turn comes is marked missing (`lostFrames`,
///   concealed downstream); an empty buffer at that moment also counts an `underrun`.
/// - Latency is measured in frames as `newestEnd − playout + (now − newestArrival)·rate` — the newest frame's
///   index extrapolated by the time since it arrived — which has no packet-period sawtooth and is what the
///   drift controller regulates.
/// - Target delay: `.low` pins it to one render block + one packet + `safetyMilliseconds`; `.fixed(ms)` uses
///   that (never below block + packet); `.auto` adds the transit deviation (arrival time minus nominal capture
///   time of each packet over a `jitterWindowSeconds` window: a high quantile — all but the top 0.3 %, so a rare
///   outlier does not set everyone's latency — minus the least) to the `.low` figure, rises at once when that
///   grows (to the full maximum when packets come late several in a row: the delay stepped up), and decays back
///   exponentially with `shrinkSeconds` when the link calms (1 s in a stream's first 5 s: start-up transients). A lost packet (even at the newest end) does not
///   raise it, and neither does a rare stall (a burst of at most 50 ms, `stallSpacingSeconds` after the last one:
///   a hiccup on the host, concealed once) nor a step of the host's timeline (every packet off the same way for
///   50 ms: the jitter window starts over after it). Transits are measured on the playout device's clock
///   (`deviceClockPPM`, from the sink's pulls), so a sender and player on one slow or fast clock (a JACK graph)
///   show no creep. RFC 3550 interarrival jitter is reported too.
/// - Latency errors are judged on the caller's jitter-free latency (`pipelineFrames` carries the offset), with
///   hysteresis, so normal jitter never triggers a correction: more than `max(block, 2 ms)` short → the playout
///   point holds and frames are synthesized (`stretchedFrames`); more than 0.5 ms short for 0.25 s → it holds
///   for just the missing frames, once; more than `max(block + packet, 4 ms)` over for 0.5 s, or more than 0.5 ms
///   over for 2 s (what a stretch leaves once the target has decayed) → it jumps ahead by the least excess seen
///   meanwhile (`skippedFrames`) with a crossfade. Smaller errors are the drift controller's job. Neither starts within 5 ms after a discontinuity or a resumption after missing frames, so
///   the concealer's crossfade can finish.
/// - Resync (`resyncs`): a packet more than the buffer's length ahead of the playout point, one far behind it
///   (more than max(2 × target, 100 ms)) whose sequence number moved on or jumped by over 1000, or the 8th late
///   packet in a row (the host restarted its frame count) restarts the stream at that packet.
/// - Frame indices (UInt64) and sequence numbers (UInt32) are compared with wrapping arithmetic.
public struct JitterBuffer {
    /// How the target delay is chosen.
    public enum Mode: Sendable, Equatable {
        /// Adapts to measured jitter.
        case auto
        /// Pinned to the minimum: one render block + one packet + the safety margin.
        case low
        /// A fixed delay in milliseconds (never below one render block + one packet).
        case fixed(milliseconds: Double)
    }

    /// Tuning.
    public struct Configuration: Sendable, Equatable {
        /// How the target delay is chosen: from the measured jitter (`.auto`, the default), or fixed.
        public var mode: Mode = .auto
        /// The most delay the buffer can hold; also bounds the target. A `.fixed` delay above it raises it to that
        /// delay (a player asked for 2 s plays 2 s behind, not the 500 ms the ring would otherwise be cut to).
        public var maximumDelayMilliseconds: Double = 500
        /// Margin added to the structural minimum (render block + packet).
        public var safetyMilliseconds: Double = 0.5
        /// Window of the transit deviation quantile (`.auto`).
        public var jitterWindowSeconds: Double = 2
        /// Time constant of the target's decay when jitter falls (`.auto`).
        public var shrinkSeconds: Double = 5
        /// A burst of late (or early) packets this long after the previous one is held for up to 50 ms: a rare
        /// stall is concealed and does not raise the target, a step of the timeline starts the jitter window over
        /// (`.auto`; 0: every burst counts).
        public var stallSpacingSeconds: Double = 2.5
        /// The defaults, in `mode`.
        public init(mode: Mode = .auto) { self.mode = mode }

        /// `maximumDelayMilliseconds`, or the `.fixed` delay when that is longer.
        var heldDelayMilliseconds: Double {
            guard case .fixed(let ms) = mode, ms.isFinite else { return maximumDelayMilliseconds }
            return max(maximumDelayMilliseconds, ms)
        }
    }

    /// What `insert` did with a packet.
    public enum InsertResult: Sendable, Equatable {
        case accepted, late, duplicate, resync
    }

    /// What `read` produced.
    public enum ReadResult: Sendable, Equatable {
        /// No stream yet: silence.
        case idle
        /// Waiting for the target delay to fill: silence.
        case priming
        /// Frames from the buffer (some possibly marked missing).
        case playing
        /// The playout point held to grow the delay: all frames marked missing.
        case stretched
    }

    /// Exact counters since `init`.
    public struct Counters: Sendable, Equatable, BitwiseCopyable {
        /// Packets offered to `insert`.
        public var received: UInt64 = 0
        /// Packets stored.
        public var accepted: UInt64 = 0
        /// Packets dropped because (part of) them was behind the playout point.
        public var late: UInt64 = 0
        /// Packets dropped because all their frames were already there.
        public var duplicates: UInt64 = 0
        /// Packets never received, from sequence-number gaps (RFC 3550 style; late ones count as received).
        public var lostPackets: UInt64 = 0
        /// Frames that reached the playout point without data (concealed).
        public var lostFrames: UInt64 = 0
        /// Reads that found the buffer empty at some frame they needed.
        public var underruns: UInt64 = 0
        /// Frames synthesized while holding the playout point to grow the delay.
        public var stretchedFrames: UInt64 = 0
        /// Frames jumped over to shrink an excess delay.
        public var skippedFrames: UInt64 = 0
        /// Stream restarts (host restarted, huge index jump).
        public var resyncs: UInt64 = 0
        /// Late packets that continued the stream where it had run dry, played after the playout point moved back
        /// to them (their frames had been concealed: that concealment counts as a stretch).
        public var lateResumes: UInt64 = 0
        /// Frames that left the buffer (played, lost or skipped — everything the playout point passed).
        public var playedFrames: UInt64 = 0
        public init() {}
    }

    private enum State {
        /// No stream: silence.
        case idle
        /// A stream is buffering up to the target; nothing played yet.
        case priming(StreamCursor)
        /// A stream is playing.
        case playing(StreamCursor)
    }

    /// Where a stream stands: the next frame to play, and the newest frame received.
    private struct StreamCursor {
        /// The next frame index to be played.
        var playout: UInt64
        /// One past the newest frame received.
        var newestEnd: UInt64
        /// Arrival time of the packet that holds the newest frame, nanoseconds.
        var newestArrival: UInt64
    }

    /// The stream format the buffer plays.
    public let format: AudioFormat
    /// The configuration in use.
    public let configuration: Configuration
    /// Frames the ring holds.
    public var capacityFrames: Int { frames.capacityFrames }

    private let rate: Double
    private var state = State.idle
    private var counters = Counters()
    private var frames: FrameStore
    private var losses = LossTracker()
    private var jitter: JitterEstimator
    private var target: LatencyTarget
    private var corrector: LatencyCorrector
    private var crossfades: CrossfadeGuard
    private var resync = ResyncDetector()
    /// The largest packet and the largest read seen (never forgotten): together the structural minimum delay.
    private var maxPacketFrames = 0
    private var blockFrames = 0

    /// Allocates the ring for `format`.
    public init(format: AudioFormat, configuration: Configuration = Configuration()) {
        self.format = format
        self.configuration = configuration
        rate = Double(format.sampleRate)
        let capacity = max(4096, Int(rate * (configuration.heldDelayMilliseconds / 1000 + 0.25)))
        frames = FrameStore(channels: format.channels, capacityFrames: capacity)
        jitter = JitterEstimator(windowSeconds: configuration.jitterWindowSeconds,
                                 stallSpacingSeconds: configuration.stallSpacingSeconds)
        target = LatencyTarget(configuration: configuration, rate: rate)
        corrector = LatencyCorrector(rate: rate, givesBackStartSteps: configuration.mode != .auto)
        crossfades = CrossfadeGuard(rate: rate)
    }

    // MARK: - Reports

    /// Current target delay, frames.
    public var targetFrames: Double { target.frames }
    /// RFC 3550 interarrival jitter estimate, nanoseconds.
    public var interarrivalJitterNanos: Double { jitter.interarrivalJitterNanos }
    /// Transit deviation over the jitter window (high quantile minus least), nanoseconds.
    public var peakDeviationNanosInWindow: Double { jitter.deviationNanos }
    /// How much slower the playout device's clock runs than the monotonic clock that stamps arrivals, ppm (an input
    /// from the sink's side, `DeviceClockMeter`): the jitter estimate takes that creep out of the transits.
    public var deviceClockPPM: Double {
        get { jitter.deviceClockPPM }
        set { jitter.deviceClockPPM = newValue }
    }
    /// Bursts of late packets read as rare stalls (concealed, the target not raised) since `init`.
    public var rareStalls: UInt64 { jitter.rareStalls }
    /// Steps of the host's timeline (the jitter window started over after them) since `init`.
    public var timelineSteps: UInt64 { jitter.timelineSteps }
    /// Whether a stream is being played (or primed).
    public var isActive: Bool { cursor != nil }
    /// Whether a stream is being played (priming is over).
    public var isPlaying: Bool { if case .playing = state { true } else { false } }
    /// The next frame index to be played (0 when idle).
    public var playoutFrameIndex: UInt64 { cursor?.playout ?? 0 }
    /// Largest packet seen, frames.
    public var packetFrames: Int { maxPacketFrames }
    /// One past the newest frame received, the latency measure's reference (0 when idle).
    public var newestFrameEnd: UInt64 { cursor?.newestEnd ?? 0 }
    /// Arrival time of the packet that holds the newest frame, nanoseconds (0 when idle).
    public var newestArrivalNanos: UInt64 { cursor?.newestArrival ?? 0 }

    /// The stream as the drift controller sees it; nil when idle.
    public var bufferedStream: BufferedStream? {
        guard let cursor else { return nil }
        return BufferedStream(newestFrameEnd: cursor.newestEnd, newestArrivalNanos: cursor.newestArrival,
                              targetFrames: target.frames, isPlaying: isPlaying)
    }

    /// Whether a read of `count` frames now would find every one of them (or has nothing to conceal: idle or
    /// priming). A sink that serves the network input itself waits for this before it renders.
    public func holdsNext(_ count: Int) -> Bool {
        guard case .playing(let cursor) = state else { return true }
        return frames.holdsAll(first: cursor.playout, count: count)
    }

    /// Buffered latency in frames at `nowNanos` (see the type's doc); 0 when idle.
    public func latencyFrames(nowNanos: UInt64) -> Double {
        guard let cursor else { return 0 }
        return latencyFrames(cursor, nowNanos: nowNanos)
    }

    /// Packets the host sent by their sequence numbers (received or lost, over every stream): the whole that
    /// `Counters.lostPackets` is a part of.
    public var expectedPackets: UInt64 { losses.expectedPackets }

    /// The exact counters (with `lostPackets` from the sequence numbers seen so far).
    public var snapshot: Counters {
        var c = counters
        c.lostPackets = losses.lostPackets
        return c
    }

    /// Back to idle: forget the stream (counters are kept).
    public mutating func reset() {
        losses.closeStream()
        state = .idle
        frames.clear()
        jitter.restart()
    }

    // MARK: - Insert (render thread, after popping the PacketRing)

    /// Stores one packet (`samples` holds `frameCount × channels` interleaved samples) that arrived at
    /// `arrivalNanos` (receiver clock). The packet is in the buffer's format (`PacketIngress` checked it).
    @discardableResult
    public mutating func insert(_ packet: ReceivedPacket, samples: UnsafeBufferPointer<Float>) -> InsertResult {
        let h = packet.header
        precondition(h.format == format && samples.count >= h.frameCount * format.channels,
                     "JitterBuffer.insert: a packet of another format (PacketIngress passes only the buffer's)")
        counters.received &+= 1
        let n = h.frameCount
        let f = h.firstFrameIndex
        let end = f &+ UInt64(n)
        guard var cursor else {
            startStream(packet, samples: samples)
            return .accepted
        }
        let behind = Int64(bitPattern: cursor.playout &- f)  // > 0: starts before the playout point
        // How far past the playout point the packet ends, saturated: a packet half the index space away, where the
        // wrapping difference flips sign, is far ahead (a jump), never both "ahead" and "behind" at once.
        let (ahead, overflow) = Int64(n).subtractingReportingOverflow(behind)
        let aheadEnd = overflow ? Int64.max : ahead
        if resync.packetArrived(behindFrames: behind, aheadEndFrames: aheadEnd,
                                sequenceDistance: losses.distance(to: h.sequence), targetFrames: target.frames,
                                rate: rate, capacityFrames: capacityFrames) {
            counters.resyncs &+= 1
            losses.closeStream()
            startStream(packet, samples: samples)
            return .resync
        }
        if behind > 0, case .priming = state, (0...Int64(capacityFrames)).contains(Int64(bitPattern: cursor.newestEnd &- f)) {
            // Nothing played yet: an earlier packet that arrives during priming moves the start back.
            frames.drop(first: f, count: Int(behind))
            cursor.playout = f
            state = .priming(cursor)
        }
        // Frames the Opus decoder concealed stand in for a packet the network lost: played, but neither a
        // transit (they arrived with the next packet) nor a received packet.
        let newSequence = losses.noteSequence(h.sequence)
        let arrived = newSequence && !packet.concealed
        if arrived { noteTransit(packet) }
        let lateBy = Int64(bitPattern: cursor.playout &- f)
        if lateBy > 0, case .playing = state, arrived, f == cursor.newestEnd, lateBy <= Int64(blockFrames + max(maxPacketFrames, n)) {
            // A late resume: the stream ran dry and this packet continues it. Play it: back to its first frame.
            cursor.playout = f
            updateCursor(cursor)
            counters.lateResumes &+= 1
            counters.stretchedFrames &+= UInt64(lateBy)
            corrector.noteLateResume(frames: Double(lateBy), atNanos: packet.arrivalNanos)
            crossfades.noteStretch()
        } else if lateBy > 0 {
            // Behind the playout point: too late (a late copy of a packet already received is not unique).
            counters.late &+= 1
            // A run of late packets is no isolated outlier (the delay stepped up): cover all of it at once.
            if resync.packetLate() && arrived { jitter.coverWholeWindow(nowNanos: packet.arrivalNanos) }
            if arrived { losses.countReceived() }
            return .late
        }
        if frames.holdsAll(first: f, count: n) {
            counters.duplicates &+= 1
            return .duplicate
        }
        if arrived { losses.countReceived() }
        resync.packetStored()
        counters.accepted &+= 1
        maxPacketFrames = max(maxPacketFrames, n)
        frames.store(samples, first: f, count: n)
        if Int64(bitPattern: end &- cursor.newestEnd) > 0 {
            cursor.newestEnd = end
            cursor.newestArrival = packet.arrivalNanos
            updateCursor(cursor)
        }
        return .accepted
    }

    // MARK: - Read (render thread)

    /// Produces `frames` frames into `output` (interleaved, at least `frames × channels` samples) with one mark
    /// per frame in `marks` (`FrameMark`). `pipelineFrames` is the latency already queued downstream (resampler
    /// look-ahead, staging FIFO), added to the buffer's own when comparing with the target. With `holdStart`, a
    /// priming buffer does not start yet: it stays silent and drops its oldest frames so as not to exceed the
    /// target (the caller's latency measure is not trustworthy yet).
    @discardableResult
    public mutating func read(into output: UnsafeMutableBufferPointer<Float>, marks: UnsafeMutableBufferPointer<UInt8>,
                              frames count: Int, nowNanos: UInt64, pipelineFrames: Double = 0, holdStart: Bool = false)
        -> ReadResult
    {
        if count > blockFrames { blockFrames = count }
        let previousTarget = target.frames
        target.update(nowNanos: nowNanos, structuralFrames: Double(blockFrames + maxPacketFrames),
                      deviationNanos: jitter.deviationNanos,
                      maximumFrames: Double(capacityFrames) - rate * 0.25 + Double(maxPacketFrames))
        corrector.noteTarget(from: previousTarget, to: target.frames)
        switch state {
        case .idle:
            silence(output, marks: marks, from: 0, to: count)
            return .idle
        case .priming(var cursor):
            // More than the target buffered (a burst, or a held start): drop the oldest frames — nothing has
            // been played yet — so that playback starts at the target exactly.
            let excess = latencyFrames(cursor, nowNanos: nowNanos) + pipelineFrames - target.frames
            let ahead = Int64(bitPattern: cursor.newestEnd &- cursor.playout)
            let drop = min(Int(max(0, excess)), Int(max(0, ahead)))
            frames.drop(first: cursor.playout, count: drop)
            cursor.playout &+= UInt64(drop)
            state = .priming(cursor)
            var wait = count
            if !holdStart {
                // Start inside this block at the frame where the buffered latency reaches the target exactly.
                let missing = target.frames - (latencyFrames(cursor, nowNanos: nowNanos) + pipelineFrames)
                wait = min(count, max(0, Int(missing.rounded(.up))))
            }
            if wait == count {
                silence(output, marks: marks, from: 0, to: count)
                return .priming
            }
            state = .playing(cursor)
            silence(output, marks: marks, from: 0, to: wait)
            play(into: output, marks: marks, offset: wait, frames: count - wait)
            return .playing
        case .playing(let cursor):
            let error = latencyFrames(cursor, nowNanos: nowNanos) + pipelineFrames - target.frames
            if crossfades.isGuarding {
                play(into: output, marks: marks, offset: 0, frames: count)
                return .playing
            }
            switch corrector.decide(errorFrames: error, targetFrames: target.frames, frames: count, blockFrames: blockFrames,
                                    packetFrames: maxPacketFrames, nowNanos: nowNanos) {
            case .stretchBlock:
                for i in 0..<count { marks[i] = FrameMark.missing }
                counters.stretchedFrames &+= UInt64(count)
                crossfades.noteStretch()
                return .stretched
            case .hold(let hold):
                for i in 0..<hold { marks[i] = FrameMark.missing }
                counters.stretchedFrames &+= UInt64(hold)
                crossfades.noteStretch()
                play(into: output, marks: marks, offset: hold, frames: count - hold)
                return .stretched
            case .skip(let skip):
                frames.drop(first: cursor.playout, count: min(skip, capacityFrames))
                var skipped = cursor
                skipped.playout &+= UInt64(skip)
                state = .playing(skipped)
                counters.skippedFrames &+= UInt64(skip)
                counters.playedFrames &+= UInt64(skip)
                crossfades.noteDiscontinuity()
                play(into: output, marks: marks, offset: 0, frames: count)
                return .playing
            case .play:
                play(into: output, marks: marks, offset: 0, frames: count)
                return .playing
            }
        }
    }

    /// Moves `count` frames from the playout point to `output[offset...]`, marking each.
    private mutating func play(into out: UnsafeMutableBufferPointer<Float>, marks: UnsafeMutableBufferPointer<UInt8>,
                               offset: Int, frames count: Int) {
        guard var cursor else { return }
        var underrun = false
        for i in 0..<count {
            let index = cursor.playout &+ UInt64(i)
            let present = frames.take(index, into: out, frame: offset + i)
            marks[offset + i] = crossfades.play(present: present)
            if !present {
                counters.lostFrames &+= 1
                if Int64(bitPattern: index &- cursor.newestEnd) >= 0 { underrun = true }
            }
        }
        cursor.playout &+= UInt64(count)
        updateCursor(cursor)
        counters.playedFrames &+= UInt64(count)
        if underrun { counters.underruns &+= 1 }
    }

    // MARK: - Internals

    private var cursor: StreamCursor? {
        switch state {
        case .idle: nil
        case .priming(let cursor), .playing(let cursor): cursor
        }
    }

    /// Stores `cursor` as the stream's, in the phase it is in.
    private mutating func updateCursor(_ cursor: StreamCursor) {
        switch state {
        case .idle: break
        case .priming: state = .priming(cursor)
        case .playing: state = .playing(cursor)
        }
    }

    private func latencyFrames(_ cursor: StreamCursor, nowNanos: UInt64) -> Double {
        let elapsed = nowNanos > cursor.newestArrival ? Double(nowNanos - cursor.newestArrival) : 0
        let ahead = Double(Int64(bitPattern: cursor.newestEnd &- cursor.playout))
        return ahead + min(elapsed * rate / 1e9, Double(capacityFrames))
    }

    private func silence(_ output: UnsafeMutableBufferPointer<Float>, marks: UnsafeMutableBufferPointer<UInt8>,
                         from start: Int, to end: Int) {
        let ch = format.channels
        for i in (start * ch)..<(end * ch) { output[i] = 0 }
        for i in start..<end { marks[i] = FrameMark.silent }
    }

    /// A new stream starts at `packet`: everything stream-related starts over, and the packet is stored.
    private mutating func startStream(_ packet: ReceivedPacket, samples: UnsafeBufferPointer<Float>) {
        let h = packet.header
        frames.restart(at: h.firstFrameIndex)
        state = .priming(StreamCursor(playout: h.firstFrameIndex, newestEnd: h.firstFrameIndex &+ UInt64(h.frameCount),
                                      newestArrival: packet.arrivalNanos))
        crossfades.noteDiscontinuity()
        corrector.restart(atNanos: packet.arrivalNanos)
        jitter.restart()
        target.streamStarted(atNanos: packet.arrivalNanos)
        losses.startStream(at: h.sequence)
        counters.accepted &+= 1
        // The new stream's packets, not the old one's (nor one outsized packet of it), set the structural latency.
        maxPacketFrames = h.frameCount
        if !packet.concealed { noteTransit(packet) }
        frames.store(samples, first: h.firstFrameIndex, count: h.frameCount)
    }

    /// Feeds the packet's transit — arrival minus the nominal time of its last frame on the stream's timeline — to
    /// the jitter estimate.
    private mutating func noteTransit(_ packet: ReceivedPacket) {
        let h = packet.header
        let end = h.firstFrameIndex &+ UInt64(h.frameCount)
        let nominal = Double(Int64(bitPattern: end &- frames.streamStart)) * 1e9 / rate
        jitter.note(transitNanos: Double(packet.arrivalNanos) - nominal, arrivalNanos: packet.arrivalNanos)
    }
}

extension JitterBuffer: FrameStage {
    /// What the drift controller tells the jitter buffer before each block.
    public struct DriftFeedback: Sendable, Equatable {
        /// The jitter-free latency minus the measured one, frames: the jitter of the newest arrival and of the
        /// render call, taken out of the latency compared with the target.
        public var steadyOffsetFrames: Double
        /// Whether the controller's floors are not trustworthy yet: a priming buffer must not start.
        public var holdStart: Bool

        public init(steadyOffsetFrames: Double = 0, holdStart: Bool = false) {
            self.steadyOffsetFrames = steadyOffsetFrames
            self.holdStart = holdStart
        }
    }

    /// Reads `block.frames` frames into the block, comparing its latency plus what is queued downstream plus the
    /// drift controller's offset with the target.
    public mutating func process(_ block: FrameBlock, feedback: DriftFeedback) {
        read(into: block.samples, marks: block.marks, frames: block.frames, nowNanos: block.nowNanos,
             pipelineFrames: block.downstreamFrames + feedback.steadyOffsetFrames, holdStart: feedback.holdStart)
    }
}
