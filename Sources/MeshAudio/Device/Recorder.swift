import Synchronization
import MeshPOSIX

/// Captures from an ALSA device on a dedicated real-time thread and hands periods to one consumer.
///
/// The capture thread waits for a period (`snd_pcm_wait`, at most 100 ms at a time), reads it (`snd_pcm_readi`),
/// stamps it with its frame index and the monotonic time its first frame was captured, and hands it to the
/// `CaptureConsumer` on the same thread (`start(consumer:)`) or pushes it into a preallocated `ChunkRing`
/// (`start()`). It never allocates, locks or logs itself. Over/underruns are recovered with `snd_pcm_recover` and
/// counted in `stats.xruns`; the frames an overrun lost, as the capture clock measures them, are counted in
/// `stats.overrunFrames`. Chunks that do not fit because the consumer is late are dropped and counted in
/// `stats.overflowFrames`. Either way the next chunk's `firstFrameIndex` jumps, so the consumer can see the gap.
/// A device that delivers no period for eight buffers (at least 4 s; its sound server died) ends capture with an
/// `ALSAError` of kind `.stalled` in `failure`, and `stop` returns promptly even then.
///
/// A device that refuses Float32LE or the requested rate/channels is re-opened as `plug:<device>` automatically.
public final class Recorder: AudioSource {
    public let format: AudioFormat
    /// Frames per chunk, as granted by the device.
    public let periodFrames: Int
    /// Frames in the device buffer, as granted by the device.
    public let bufferFrames: Int
    /// The ALSA name actually opened (`plug:…` when conversion was needed).
    public let deviceName: String
    /// True when the device was re-opened through ALSA's `plug` conversion.
    public let usesPlugConversion: Bool

    private let loop: CaptureLoop
    private let lifecycle: StageLifecycle

    /// Opens `device` for capture. Throws `AudioFormatError` for an unsupported format and `ALSAError` when the
    /// device cannot be opened or configured (the message names the device and says to run `arecord -L`).
    ///
    /// - Parameters:
    ///   - periodFrames: frames per chunk (the device may round it).
    ///   - bufferFrames: device buffer; defaults to four periods.
    ///   - ringChunks: chunks the hand-over ring holds before dropping (rounded up to a power of two).
    public init(device: String = "default", format: AudioFormat = .default, periodFrames: Int = 128,
                bufferFrames: Int? = nil, ringChunks: Int = 64) throws {
        try format.validate()
        precondition(periodFrames > 0 && ringChunks > 0, "periodFrames and ringChunks must be positive")
        let configuration = PCMConfiguration(format: format, periodFrames: periodFrames,
                                             bufferFrames: bufferFrames ?? periodFrames * 4, startThresholdFrames: nil)
        let handle = try PCMHandle.open(device: device, stream: .capture, configuration: configuration)
        self.format = format
        self.periodFrames = handle.periodFrames
        self.bufferFrames = handle.bufferFrames
        self.deviceName = handle.deviceName
        self.usesPlugConversion = handle.usesPlugConversion
        let lifecycle = StageLifecycle(stage: "Recorder(\(handle.deviceName))", threadName: "pm-capture")
        self.lifecycle = lifecycle
        self.loop = CaptureLoop(handle: handle, ringChunks: ringChunks, lifecycle: lifecycle)
    }

    deinit {
        stop()
    }

    /// Starts the device and the capture thread. Calling it while running does nothing.
    public func start() throws {
        let loop = self.loop
        try lifecycle.start(prepare: { try loop.handle.start() }, body: { loop.run(consumer: nil) })
    }

    /// Starts the device and the capture thread, which hands each period to `consumer`. Calling it while running
    /// does nothing.
    public func start(consumer: any CaptureConsumer) throws {
        let loop = self.loop
        try lifecycle.start(prepare: { try loop.handle.start() }, body: { loop.run(consumer: consumer) })
    }

    /// Stops the capture thread (within one period) and the device. A blocked `read` returns `nil` once the
    /// chunks already captured have been read.
    public func stop() {
        if lifecycle.stop() { loop.handle.finish() }
        loop.ring.finish()
    }

    public func read(into buffer: UnsafeMutableBufferPointer<Float>, timeoutNanos: UInt64) -> ChunkInfo? {
        guard let info = loop.ring.read(into: buffer, timeoutNanos: timeoutNanos) else { return nil }
        AudioCounters.bump(loop.counters.framesOut, by: info.frames)
        return info
    }

    public var stats: AudioStats { loop.counters.snapshot() }

    /// Whether the capture thread got `SCHED_FIFO` (false before `start`).
    public var isRealtime: Bool { lifecycle.isRealtime }

    /// Why the device thread runs without real-time priority, for the user; nil when it has it (or is not running).
    public var schedulingNote: String? { lifecycle.schedulingNote }

    /// The error that ended capture, if the device failed in a way `snd_pcm_recover` could not fix, or stalled.
    public var failure: ALSAError? { loop.failure }

    public var fault: (any Error)? { failure }
}

/// Everything the capture thread touches, so the thread does not keep the `Recorder` alive.
final class CaptureLoop: @unchecked Sendable {  // `scratch` is used only by the capture thread; the rest is Sendable.
    let handle: PCMHandle
    let ring: ChunkRing
    let counters = AudioCounters()
    /// Whose `isRunning` keeps the loop going.
    let lifecycle: StageLifecycle
    /// What ended the loop, if anything did.
    let fault: DeviceFault
    private let scratch: UnsafeMutablePointer<Float>

    init(handle: PCMHandle, ringChunks: Int, lifecycle: StageLifecycle) {
        self.handle = handle
        self.lifecycle = lifecycle
        self.ring = ChunkRing(channels: handle.format.channels, maxChunkFrames: handle.periodFrames,
                              minimumChunks: ringChunks)
        self.scratch = .allocate(capacity: handle.periodFrames * handle.format.channels)
        self.scratch.initialize(repeating: 0, count: handle.periodFrames * handle.format.channels)
        fault = DeviceFault(handle: handle)
    }

    deinit {
        scratch.deallocate()
    }

    var failure: ALSAError? { fault.error(for: handle) }

    /// The real-time loop: each period goes to `consumer` on this thread, or to the ring when there is none.
    /// No allocation, locks, logging or Foundation below this line.
    func run(consumer: (any CaptureConsumer)?) {
        let period = handle.periodFrames
        let channels = handle.format.channels
        let rate = UInt64(handle.format.sampleRate)
        var frameIndex: UInt64 = 0
        // When the next chunk's first frame is due on the capture clock (0 before the first chunk), and whether the
        // device overran since the last chunk.
        var dueNanos: UInt64 = 0
        var overran = false
        // A device that stops delivering (its server died) must neither hold this thread forever nor go unnoticed:
        // wait for each period in short waits, and read only what is there (`snd_pcm_readi` then never blocks).
        var watchdog = DeviceWatchdog(limitNanos: fault.stallLimitNanos, nowNanos: MonotonicClock.nowNanos())
        while lifecycle.isRunning {
            let available = handle.availableFrames()
            if available >= 0 && available < period {
                let now = MonotonicClock.nowNanos()
                if watchdog.isStalled(nowNanos: now) { fault.recordStall(in: .wait); break }
                // After an xrun the device is prepared again but not started: nothing would ever arrive.
                let started = handle.startIfStuck(periodFrames: period)
                if started < 0 { fault.record(Int(started), from: .start); break }
                let waited = handle.waitForPeriod(milliseconds: watchdog.waitMilliseconds(nowNanos: now))
                if waited >= 0 { continue }
                guard fault.recover(handle, from: Int(waited), returnedBy: .wait, counters: counters) else { break }
                overran = true
                continue
            }
            let got = available < 0 ? available : handle.readFrames(into: scratch, frames: period)
            let now = MonotonicClock.nowNanos()
            if got < 0 {
                guard fault.recover(handle, from: got, returnedBy: available < 0 ? .avail : .readi, counters: counters) else { break }
                overran = true
                continue
            }
            guard got > 0 else { continue }
            watchdog.progressed(nowNanos: now)
            // Frames still waiting in the device were captured after ours: age of our first frame.
            let waiting = max(handle.delayFrames() ?? 0, 0)
            counters.delayFrames.store(waiting, ordering: .relaxed)
            let age = UInt64(waiting + got) &* 1_000_000_000 / rate
            let timestamp = now >= age ? now - age : 0
            if overran {
                // The device dropped what it held and what came while it stood: skip as many frames in the index as
                // the clock says were lost, so the gap shows. Before the first chunk there is nothing to go by.
                overran = false
                let lost = dueNanos == 0 ? 0 : Self.framesLost(timestampNanos: timestamp, dueNanos: dueNanos,
                                                              sampleRate: rate, periodFrames: period)
                frameIndex &+= lost
                counters.overrunFrames.wrappingAdd(lost, ordering: .relaxed)
            }
            let info = ChunkInfo(firstFrameIndex: frameIndex, frames: got, timestampNanos: timestamp)
            AudioCounters.bump(counters.framesIn, by: got)
            if let consumer {
                consumer.consume(UnsafeMutableBufferPointer(start: scratch, count: got * channels), info: info,
                                 deviceDelayFrames: waiting)
                AudioCounters.bump(counters.framesOut, by: got)
            } else if !ring.push(UnsafeBufferPointer(start: scratch, count: got * channels), info: info) {
                AudioCounters.bump(counters.overflowFrames, by: got)
            }
            frameIndex &+= UInt64(got)
            dueNanos = timestamp &+ UInt64(got) &* 1_000_000_000 / rate
        }
        ring.finish()
    }

    /// Frames lost before a chunk stamped `timestampNanos` that was due at `dueNanos` (the last chunk's timestamp
    /// plus its length): the lateness rounded to frames. Timestamps jitter by about a period, so a lateness under half
    /// a period is 0, as is a chunk stamped early: the index never moves back or on jitter alone. Plain integer
    /// arithmetic, for the real-time thread.
    static func framesLost(timestampNanos: UInt64, dueNanos: UInt64, sampleRate: UInt64, periodFrames: Int) -> UInt64 {
        guard timestampNanos > dueNanos else { return 0 }
        let late = timestampNanos - dueNanos
        // Whole seconds apart from the rest, so no lateness overflows.
        let lost = late / 1_000_000_000 * sampleRate + (late % 1_000_000_000 * sampleRate + 500_000_000) / 1_000_000_000
        return lost * 2 > UInt64(periodFrames) ? lost : 0
    }
}
