import MeshAudio

/// The receive-side jitter buffer: packets in, a steady stream of frames (with loss marks) out.
///
/// A pure struct with preallocated storage (a ring of `capacityFrames` frames plus a presence map), driven by the
/// render thread; no allocation after `init`, no clocks of its own — arrival and render times are passed in, so
/// it runs in virtual time under test.
///
/// - Ordering: packets land at their frame index, so reordering is free. A packet any part of which is behind
///   the playout point is dropped as `late` (even a late copy of a packet already played); one whose frames
///   are all present already is a `duplicate`. A 1024-entry sequence bitmap keeps late copies out of the loss
///   count.
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
///   exponentially with `shrinkSeconds` when the link calms. A lost packet (even at the newest end) does not
///   raise it. RFC 3550 interarrival jitter is reported too.
/// - Latency errors are judged on the caller's jitter-free latency (`pipelineFrames` carries the offset), with
///   hysteresis, so normal jitter never triggers a correction: more than `max(block, 2 ms)` short → the playout
///   point holds and frames are synthesized (`stretchedFrames`); more than 0.5 ms short for 0.25 s → it holds
///   for just the missing frames, once; more than `max(block + packet, 4 ms)` over for 0.5 s → it jumps ahead by
///   the least excess seen meanwhile (`skippedFrames`) with a crossfade. Smaller errors are the drift
///   controller's job. Neither starts within 5 ms after a discontinuity or a resumption after missing frames, so
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
        public var mode: Mode = .auto
        /// The most delay the buffer can hold; also bounds the target.
        public var maximumDelayMilliseconds: Double = 500
        /// Margin added to the structural minimum (render block + packet).
        public var safetyMilliseconds: Double = 0.5
        /// Window of the transit deviation quantile (`.auto`).
        public var jitterWindowSeconds: Double = 2
        /// Time constant of the target's decay when jitter falls (`.auto`).
        public var shrinkSeconds: Double = 10
        public init(mode: Mode = .auto) { self.mode = mode }
    }

    /// What `insert` did with a packet.
    public enum InsertResult: Sendable, Equatable {
        case accepted, late, duplicate, resync, formatMismatch
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
    public struct Counters: Sendable, Equatable {
        /// Packets offered to `insert`.
        public var received: UInt64 = 0
        /// Packets stored.
        public var accepted: UInt64 = 0
        /// Packets dropped because (part of) them was behind the playout point.
        public var late: UInt64 = 0
        /// Packets dropped because all their frames were already there.
        public var duplicates: UInt64 = 0
        /// Packets of another format than the buffer's, dropped.
        public var formatMismatches: UInt64 = 0
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
        /// Frames that left the buffer (played, lost or skipped — everything the playout point passed).
        public var playedFrames: UInt64 = 0
        public init() {}
    }

    private enum State { case idle, priming, playing }

    /// The stream format the buffer accepts.
    public let format: AudioFormat
    /// The configuration in use.
    public let configuration: Configuration
    /// Frames the ring holds.
    public let capacityFrames: Int
    /// Counters.
    private var counters = Counters()

    private var storage: [Float]
    private var present: [UInt8]
    private var state = State.idle
    private var playout: UInt64 = 0
    private var newestEnd: UInt64 = 0
    private var newestArrival: UInt64 = 0
    private var maxPacketFrames = 0
    private var blockFrames = 0
    private var target: Double = 0
    private var lastReadNanos: UInt64 = 0
    private var pendingDiscontinuity = false
    // Frames left during which no stretch or skip starts: the concealer's crossfade after a discontinuity or a
    // resumption is given time to finish (an interrupted crossfade is the hardest transition to keep smooth).
    private var transitionFrames = 0
    private var lastWasMissing = false
    private var consecutiveLate = 0
    // Jitter estimation.
    private let rate: Double
    private var baseFrame: UInt64 = 0
    private var lastTransit: Double = 0
    private var haveTransit = false
    private var rfcJitterNanos: Double = 0
    // Transits of the packets of the last `jitterWindowSeconds` (ring, arrival order) and a scratch copy for the
    // quantile selection; the deviation is recomputed at most every `deviationIntervalNanos`.
    private var transitValues: [Double]
    private var transitTimes: [UInt64]
    private var transitScratch: [Double]
    private var transitNext = 0
    private var transitCount = 0
    private var lastDeviationNanos: UInt64 = 0
    private let deviationIntervalNanos: UInt64 = 20_000_000
    private var peakDeviationNanos: Double = 0
    private var transitLow: Double = 0
    // Skip evidence: since when the latency has been continuously over the skip threshold, and the least excess
    // seen since (what is skipped: the jitter-free part of the error).
    private var excessSince: UInt64 = 0
    private var deficitSince: UInt64 = 0
    private var leastExcess: Double = 0
    // Sequence tracking.
    private var highestSequence: Int64 = 0
    private var baseSequence: Int64 = 0
    private var uniqueInStream: UInt64 = 0
    private var lostBeforeResync: UInt64 = 0
    private var seen = [UInt64](repeating: 0, count: 16)   // bitmap of the last 1024 extended sequence numbers

    /// Allocates the ring for `format`.
    public init(format: AudioFormat, configuration: Configuration = Configuration()) {
        self.format = format
        self.configuration = configuration
        rate = Double(format.sampleRate)
        capacityFrames = max(4096, Int(rate * (configuration.maximumDelayMilliseconds / 1000 + 0.25)))
        storage = [Float](repeating: 0, count: capacityFrames * format.channels)
        present = [UInt8](repeating: 0, count: capacityFrames)
        transitValues = [Double](repeating: 0, count: Self.transitCapacity)
        transitTimes = [UInt64](repeating: 0, count: Self.transitCapacity)
        transitScratch = [Double](repeating: 0, count: Self.transitCapacity)
    }

    // MARK: - Reports

    /// Current target delay, frames.
    public var targetFrames: Double { target }
    /// RFC 3550 interarrival jitter estimate, nanoseconds.
    public var interarrivalJitterNanos: Double { rfcJitterNanos }
    /// Transit deviation over the jitter window (high quantile minus least), nanoseconds.
    public var peakDeviationNanosInWindow: Double { peakDeviationNanos }
    /// Whether a stream is being played (or primed).
    public var isActive: Bool { state != .idle }
    /// Whether a stream is being played (priming is over).
    public var isPlaying: Bool { state == .playing }
    /// The next frame index to be played.
    public var playoutFrameIndex: UInt64 { playout }
    /// Largest packet seen, frames.
    public var packetFrames: Int { maxPacketFrames }
    /// One past the newest frame received (the latency measure's reference).
    public var newestFrameEnd: UInt64 { newestEnd }
    /// Arrival time of the packet that holds the newest frame, nanoseconds.
    public var newestArrivalNanos: UInt64 { newestArrival }

    /// Buffered latency in frames at `nowNanos` (see the type's doc); 0 when idle.
    public func latencyFrames(nowNanos: UInt64) -> Double {
        guard state != .idle else { return 0 }
        let elapsed = nowNanos > newestArrival ? Double(nowNanos - newestArrival) : 0
        let ahead = Double(Int64(bitPattern: newestEnd &- playout))
        return ahead + min(elapsed * rate / 1e9, Double(capacityFrames))
    }

    /// Back to idle: forget the stream (counters are kept).
    public mutating func reset() {
        closeLossAccounting()
        state = .idle
        clearPresence()
        haveTransit = false
        clearTransits()
    }

    // MARK: - Insert (render thread, after popping the PacketRing)

    /// Stores one packet (`samples` holds `frameCount × channels` interleaved samples) that arrived at
    /// `arrivalNanos` (receiver clock).
    @discardableResult
    public mutating func insert(_ packet: ReceivedPacket, samples: UnsafeBufferPointer<Float>) -> InsertResult {
        counters.received &+= 1
        let h = packet.header
        guard h.format == format, h.frameCount >= 1, h.frameCount * 4 <= capacityFrames,
              samples.count >= h.frameCount * format.channels
        else {
            counters.formatMismatches &+= 1
            return .formatMismatch
        }
        let n = h.frameCount
        let f = h.firstFrameIndex
        let end = f &+ UInt64(n)
        if state == .idle {
            startStream(packet)
            store(f, n, samples)
            return .accepted
        }
        let seqDelta = Int64(Int32(bitPattern: h.sequence &- UInt32(truncatingIfNeeded: highestSequence)))
        let behind = Int64(bitPattern: playout &- f)  // > 0: starts before the playout point
        let aheadEnd = Int64(bitPattern: end &- playout)
        let farBehind = behind > Int64(max(2 * target, rate * 0.1))
        let restart = aheadEnd > Int64(capacityFrames)                 // jumped beyond the buffer
            || (farBehind && (seqDelta > 0 || seqDelta < -1000))        // index went back while sequence moved on
            || (behind > 0 && consecutiveLate >= 7)                       // a run of late packets: the stream moved
        if restart {
            consecutiveLate = 0
            counters.resyncs &+= 1
            closeLossAccounting()
            startStream(packet)
            store(f, n, samples)
            return .resync
        }
        if behind > 0, state == .priming, Int64(bitPattern: newestEnd &- f) <= Int64(capacityFrames) {
            // Nothing played yet: an earlier packet that arrives during priming moves the start back.
            for i in 0..<Int(behind) { present[slot(f &+ UInt64(i))] = 0 }
            playout = f
        }
        let newSequence = noteSequence(h.sequence)
        if newSequence { noteTransit(packet) }
        if Int64(bitPattern: playout &- f) > 0 {
            // Behind the playout point: too late (a late copy of a packet already received is not unique).
            consecutiveLate += 1
            counters.late &+= 1
            // A run of late packets is no isolated outlier (the delay stepped up): cover all of it at once.
            if consecutiveLate >= 3 && newSequence { updateDeviation(nowNanos: packet.arrivalNanos, outliers: false) }
            if newSequence { uniqueInStream &+= 1 }
            return .late
        }
        var all = true
        for i in 0..<n where present[slot(f &+ UInt64(i))] == 0 {
            all = false
            break
        }
        if all {
            counters.duplicates &+= 1
            return .duplicate
        }
        if newSequence { uniqueInStream &+= 1 }
        consecutiveLate = 0
        counters.accepted &+= 1
        maxPacketFrames = max(maxPacketFrames, n)
        write(f, n, samples)
        if Int64(bitPattern: end &- newestEnd) > 0 {
            newestEnd = end
            newestArrival = packet.arrivalNanos
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
                              frames: Int, nowNanos: UInt64, pipelineFrames: Double = 0, holdStart: Bool = false)
        -> ReadResult
    {
        let ch = format.channels
        if frames > blockFrames { blockFrames = frames }
        updateTarget(nowNanos: nowNanos)
        var wait = state == .idle ? frames : 0
        if state == .priming {
            // More than the target buffered (a burst, or a held start): drop the oldest frames — nothing has
            // been played yet — so that playback starts at the target exactly.
            let excess = latencyFrames(nowNanos: nowNanos) + pipelineFrames - target
            let ahead = Int64(bitPattern: newestEnd &- playout)
            let drop = min(Int(max(0, excess)), Int(max(0, ahead)))
            for i in 0..<drop { present[slot(playout &+ UInt64(i))] = 0 }
            playout &+= UInt64(drop)
            if holdStart {
                wait = frames
            } else {
                // Start inside this block at the frame where the buffered latency reaches the target exactly.
                let missing = target - (latencyFrames(nowNanos: nowNanos) + pipelineFrames)
                wait = min(frames, max(0, Int(missing.rounded(.up))))
            }
        }
        if state == .idle || wait == frames {
            for i in 0..<(frames * ch) { output[i] = 0 }
            for i in 0..<frames { marks[i] = FrameMark.silent }
            return state == .idle ? .idle : .priming
        }
        if state == .priming {
            state = .playing
            for i in 0..<(wait * ch) { output[i] = 0 }
            for i in 0..<wait { marks[i] = FrameMark.silent }
            play(into: output, marks: marks, offset: wait, frames: frames - wait)
            return .playing
        }
        let error = latencyFrames(nowNanos: nowNanos) + pipelineFrames - target
        if transitionFrames > 0 {
            play(into: output, marks: marks, offset: 0, frames: frames)
            return .playing
        }
        if error < -max(Double(blockFrames), rate * 0.002) {
            for i in 0..<frames { marks[i] = FrameMark.missing }
            counters.stretchedFrames &+= UInt64(frames)
            lastWasMissing = true
            return .stretched
        }
        // A small deficit that lasts `stretchConfirmSeconds` (the target rose a little, the start fell short): hold
        // the playout point for just the missing frames, once. Jitter never triggers it (the latency measure is
        // jitter-free, and the deficit must persist).
        if error >= -rate * Self.smallDeficitSeconds {
            deficitSince = 0
        } else if deficitSince == 0 {
            deficitSince = max(1, nowNanos)
        } else if nowNanos > deficitSince, Double(nowNanos - deficitSince) >= Self.stretchConfirmSeconds * 1e9 {
            deficitSince = 0
            let hold = min(frames, Int((-error).rounded(.up)))
            for i in 0..<hold { marks[i] = FrameMark.missing }
            counters.stretchedFrames &+= UInt64(hold)
            lastWasMissing = true
            play(into: output, marks: marks, offset: hold, frames: frames - hold)
            return .stretched
        }
        // Too much latency: skip only when the excess has lasted `skipConfirmSeconds` (jitter in the measure or a
        // short-lived target bump never triggers it), and only by the least excess seen meanwhile.
        let threshold = max(Double(blockFrames + maxPacketFrames), rate * 0.004)
        if error <= threshold {
            excessSince = 0
        } else if excessSince == 0 {
            excessSince = max(1, nowNanos)
            leastExcess = error
        } else {
            leastExcess = min(leastExcess, error)
        }
        if excessSince != 0, nowNanos > excessSince,
           Double(nowNanos - excessSince) >= Self.skipConfirmSeconds * 1e9 {
            excessSince = 0
            let skip = Int(leastExcess)
            for i in 0..<min(skip, capacityFrames) { present[slot(playout &+ UInt64(i))] = 0 }
            playout &+= UInt64(skip)
            counters.skippedFrames &+= UInt64(skip)
            counters.playedFrames &+= UInt64(skip)
            pendingDiscontinuity = true
        }
        play(into: output, marks: marks, offset: 0, frames: frames)
        return .playing
    }

    /// Moves `frames` frames from the playout point to `output[offset...]`, marking each.
    private mutating func play(into out: UnsafeMutableBufferPointer<Float>, marks: UnsafeMutableBufferPointer<UInt8>,
                               offset: Int, frames: Int) {
        let ch = format.channels
        var underrun = false
        for i in 0..<frames {
            let index = playout &+ UInt64(i)
            let s = slot(index)
            if transitionFrames > 0 { transitionFrames -= 1 }
            if present[s] != 0 {
                present[s] = 0
                let src = s * ch, dst = (offset + i) * ch
                for c in 0..<ch { out[dst + c] = storage[src + c] }
                if pendingDiscontinuity || lastWasMissing { transitionFrames = Int(rate * 0.005) }
                marks[offset + i] = pendingDiscontinuity ? FrameMark.discontinuity : FrameMark.present
                pendingDiscontinuity = false
                lastWasMissing = false
            } else {
                lastWasMissing = true
                marks[offset + i] = FrameMark.missing
                counters.lostFrames &+= 1
                if Int64(bitPattern: index &- newestEnd) >= 0 { underrun = true }
            }
        }
        playout &+= UInt64(frames)
        counters.playedFrames &+= UInt64(frames)
        if underrun { counters.underruns &+= 1 }
    }

    // MARK: - Internals

    @inline(__always)
    private func slot(_ index: UInt64) -> Int {
        // Relative to the stream's first frame, so the mapping stays continuous across the UInt64 wrap.
        let r = Int(Int64(bitPattern: index &- baseFrame) % Int64(capacityFrames))
        return r < 0 ? r + capacityFrames : r
    }

    private var maximumTarget: Double {
        Double(capacityFrames) - rate * 0.25 + Double(maxPacketFrames)
    }

    private mutating func updateTarget(nowNanos: UInt64) {
        let structural = Double(blockFrames + maxPacketFrames)
        let safety = configuration.safetyMilliseconds * rate / 1000
        let dt = lastReadNanos == 0 || nowNanos < lastReadNanos ? 0 : Double(nowNanos - lastReadNanos) / 1e9
        lastReadNanos = nowNanos
        switch configuration.mode {
        case .low:
            target = structural + safety
        case .fixed(let ms):
            target = max(ms * rate / 1000, structural)
        case .auto:
            let desired = structural + safety + peakDeviationNanos * rate / 1e9
            if desired >= target {
                target = desired
            } else {
                target += (desired - target) * min(1, dt / configuration.shrinkSeconds)
            }
        }
        target = min(target, maximumTarget)
    }

    private mutating func startStream(_ packet: ReceivedPacket) {
        let h = packet.header
        clearPresence()
        state = .priming
        playout = h.firstFrameIndex
        newestEnd = h.firstFrameIndex &+ UInt64(h.frameCount)
        newestArrival = packet.arrivalNanos
        baseFrame = h.firstFrameIndex
        pendingDiscontinuity = true
        excessSince = 0
        deficitSince = 0
        haveTransit = false
        clearTransits()
        highestSequence = Int64(h.sequence)
        baseSequence = highestSequence
        for i in seen.indices { seen[i] = 0 }
        _ = noteSequence(h.sequence)
        uniqueInStream = 1
        counters.accepted &+= 1
        maxPacketFrames = max(maxPacketFrames, h.frameCount)
        noteTransit(packet)
    }

    private mutating func store(_ f: UInt64, _ n: Int, _ samples: UnsafeBufferPointer<Float>) {
        write(f, n, samples)
    }

    private mutating func write(_ f: UInt64, _ n: Int, _ samples: UnsafeBufferPointer<Float>) {
        let ch = format.channels
        var s = slot(f)
        for i in 0..<n {
            let src = i * ch, dst = s * ch
            for c in 0..<ch { storage[dst + c] = samples[src + c] }
            present[s] = 1
            s += 1
            if s == capacityFrames { s = 0 }
        }
    }

    private mutating func clearPresence() {
        for i in present.indices { present[i] = 0 }
    }

    /// Records a sequence number; returns false when it was seen already (a duplicate).
    private mutating func noteSequence(_ sequence: UInt32) -> Bool {
        let delta = Int64(Int32(bitPattern: sequence &- UInt32(truncatingIfNeeded: highestSequence)))
        let ext = highestSequence + delta
        if delta > 0 {
            var s = highestSequence + 1
            let stop = min(ext, highestSequence + 1024)
            while s <= stop { clearSeen(s); s += 1 }
            highestSequence = ext
        } else if delta <= -1024 {
            return true  // too old to tell
        }
        let bit = Int(UInt64(bitPattern: ext) % 1024)
        if seen[bit >> 6] & (1 << UInt64(bit & 63)) != 0 { return false }
        seen[bit >> 6] |= 1 << UInt64(bit & 63)
        return true
    }

    private mutating func clearSeen(_ ext: Int64) {
        let bit = Int(UInt64(bitPattern: ext) % 1024)
        seen[bit >> 6] &= ~(1 << UInt64(bit & 63))
    }

    private var lostInStream: UInt64 {
        let expected = highestSequence - baseSequence + 1
        return expected > Int64(uniqueInStream) ? UInt64(expected - Int64(uniqueInStream)) : 0
    }

    private mutating func closeLossAccounting() {
        if state != .idle { lostBeforeResync &+= lostInStream }
        uniqueInStream = 0
        highestSequence = 0
        baseSequence = 0
    }

    /// The exact counters (with `lostPackets` computed from the sequence numbers seen so far).
    public var snapshot: Counters {
        var c = counters
        c.lostPackets = lostBeforeResync &+ (state == .idle ? 0 : lostInStream)
        return c
    }

    private mutating func noteTransit(_ packet: ReceivedPacket) {
        let h = packet.header
        let nominal = Double(Int64(bitPattern: (h.firstFrameIndex &+ UInt64(h.frameCount)) &- baseFrame)) * 1e9 / rate
        let transit = Double(packet.arrivalNanos) - nominal
        if haveTransit {
            rfcJitterNanos += (abs(transit - lastTransit) - rfcJitterNanos) / 16
        }
        lastTransit = transit
        haveTransit = true
        transitValues[transitNext] = transit
        transitTimes[transitNext] = packet.arrivalNanos
        transitNext = (transitNext + 1) % Self.transitCapacity
        transitCount = min(transitCount + 1, Self.transitCapacity)
        if lastDeviationNanos == 0 || packet.arrivalNanos < lastDeviationNanos
            || packet.arrivalNanos - lastDeviationNanos >= deviationIntervalNanos
            || transit - transitLow > peakDeviationNanos   // beyond what the target covers: at once
        {
            lastDeviationNanos = max(1, packet.arrivalNanos)
            updateDeviation(nowNanos: packet.arrivalNanos)
        }
    }

    /// Most transits kept for the deviation quantile (the window is shortened beyond that many packets).
    static let transitCapacity = 4096
    /// Fraction of the window's packets whose excess transit the target does not cover (rare outliers: a
    /// scheduling stall, one odd packet), so one outlier does not double the latency for everyone.
    static let outlierFraction = 0.003
    /// How long the latency must stay over the skip threshold before frames are skipped.
    static let skipConfirmSeconds = 0.5
    /// A latency deficit beyond this, lasting `stretchConfirmSeconds`, is stretched away.
    static let smallDeficitSeconds = 0.0005
    /// How long a small latency deficit must last before the playout point holds.
    static let stretchConfirmSeconds = 0.25

    private mutating func clearTransits() {
        transitNext = 0
        transitCount = 0
        lastDeviationNanos = 0
    }

    /// The transit deviation of the window: a high quantile of the transits (all but the top `outlierFraction`)
    /// minus their minimum — the delay spread the target has to cover, robust to a rare outlier.
    private mutating func updateDeviation(nowNanos: UInt64, outliers: Bool = true) {
        let window = UInt64(max(0.05, configuration.jitterWindowSeconds) * 1e9)
        var n = 0
        var lo = Double.infinity
        var i = transitNext
        for _ in 0..<transitCount {
            i = i == 0 ? Self.transitCapacity - 1 : i - 1
            let t = transitTimes[i]
            if t <= nowNanos && nowNanos - t > window { break }
            transitScratch[n] = transitValues[i]
            lo = min(lo, transitValues[i])
            n += 1
        }
        guard n > 0 else { peakDeviationNanos = 0; return }
        let k = outliers ? min(n - 1, Int(Double(n) * Self.outlierFraction)) : 0   // drop the k largest
        transitLow = lo
        peakDeviationNanos = selectLargest(rank: k, count: n) - lo
    }

    /// The value of rank `rank` (0 = largest) among `transitScratch[0..<count]` (Hoare quickselect, in place).
    private mutating func selectLargest(rank: Int, count: Int) -> Double {
        var left = 0, right = count - 1
        let want = rank
        while left < right {
            let pivot = transitScratch[(left + right) / 2]
            var a = left, b = right
            while a <= b {
                while transitScratch[a] > pivot { a += 1 }
                while transitScratch[b] < pivot { b -= 1 }
                if a <= b {
                    transitScratch.swapAt(a, b)
                    a += 1
                    b -= 1
                }
            }
            if want <= b { right = b } else if want >= a { left = a } else { break }
        }
        return transitScratch[want]
    }
}
