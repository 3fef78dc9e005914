import Synchronization
import MeshPOSIX

/// Plays to an ALSA device, pulling each period from an `AudioRenderer` on a dedicated real-time thread.
///
/// Pull model: the thread waits (`ppoll`) on the device's poll descriptors and, when the renderer has one, on its
/// `RenderInput` (the network end of the playout chain), and a `RenderSchedule` decides when to render: at room for
/// a renderer without an input; with one, as soon as the next block's data is there (`isReady`) and at the latest at
/// the block's deadline, as of which it is rendered. One thread wakes once per period, for the data. Each pull
/// carries the device's queue (`snd_pcm_delay`) and the time as of which it is rendered; the block is written when
/// the device has room for it, so `snd_pcm_writei` never waits. Underruns are recovered with `snd_pcm_recover`,
/// counted in `stats.xruns`, and playback continues. A device that takes no period for eight buffers (at least 4 s;
/// its sound server died) ends playback with an `ALSAError` of kind `.stalled` in `failure`; no wait lasts over
/// 100 ms, so `stop` returns promptly even then.
///
/// Latency knobs: `bufferFrames` (steady-state queue), `startThresholdFrames` (frames queued before the device
/// starts) and `prefillFrames` (silence written before the first rendered period).
public final class Player: AudioSink {
    public let format: AudioFormat
    /// Frames per pull, as granted by the device.
    public let periodFrames: Int
    /// Frames in the device buffer, as granted by the device.
    public let bufferFrames: Int
    /// Frames queued before the device starts.
    public let startThresholdFrames: Int
    /// Silence written before the first rendered period.
    public let prefillFrames: Int
    /// The ALSA name actually opened (`plug:…` when conversion was needed).
    public let deviceName: String
    /// True when the device was re-opened through ALSA's `plug` conversion.
    public let usesPlugConversion: Bool

    private let loop: PlaybackLoop
    private let lifecycle: StageLifecycle

    /// Opens `device` for playback. Throws `AudioFormatError` for an unsupported format and `ALSAError` when the
    /// device cannot be opened or configured (the message names the device and says to run `aplay -L`).
    ///
    /// - Parameters:
    ///   - periodFrames: frames per pull (the device may round it).
    ///   - bufferFrames: device buffer; defaults to four periods.
    ///   - startThresholdFrames: frames queued before the device starts; defaults to the whole buffer.
    ///   - prefillFrames: silence written before the first rendered period (not counted in `stats`).
    public init(device: String = "default", format: AudioFormat = .default, periodFrames: Int = 128,
                bufferFrames: Int? = nil, startThresholdFrames: Int? = nil, prefillFrames: Int = 0) throws {
        try format.validate()
        precondition(periodFrames > 0 && prefillFrames >= 0, "periodFrames must be positive, prefillFrames not negative")
        let configuration = PCMConfiguration(format: format, periodFrames: periodFrames,
                                             bufferFrames: bufferFrames ?? periodFrames * 4,
                                             startThresholdFrames: startThresholdFrames)
        let handle = try PCMHandle.open(device: device, stream: .playback, configuration: configuration)
        self.format = format
        self.periodFrames = handle.periodFrames
        self.bufferFrames = handle.bufferFrames
        self.startThresholdFrames = handle.startThresholdFrames
        self.prefillFrames = min(prefillFrames, handle.bufferFrames)
        self.deviceName = handle.deviceName
        self.usesPlugConversion = handle.usesPlugConversion
        let lifecycle = StageLifecycle(stage: "Player(\(handle.deviceName))", threadName: "pm-playback")
        self.lifecycle = lifecycle
        self.loop = PlaybackLoop(handle: handle, prefillFrames: self.prefillFrames, lifecycle: lifecycle)
    }

    deinit {
        stop()
    }

    /// Starts the playback thread pulling from `renderer`. Calling it while running does nothing.
    public func start(renderer: any AudioRenderer) throws {
        try lifecycle.start { [loop] in loop.run(renderer: renderer) }
    }

    /// Stops pulling (within one period), plays out what is queued and stops the device.
    public func stop() {
        if lifecycle.stop() { loop.handle.finish() }
    }

    public var stats: AudioStats { loop.counters.snapshot() }

    /// The playback thread serves the renderer's input (one thread for the network and the device).
    public var servesInput: Bool { true }

    /// Whether the playback thread got `SCHED_FIFO` (false before `start`).
    public var isRealtime: Bool { lifecycle.isRealtime }

    /// Why the device thread runs without real-time priority, for the user; nil when it has it (or is not running).
    public var schedulingNote: String? { lifecycle.schedulingNote }

    /// The error that ended playback, if the device failed in a way `snd_pcm_recover` could not fix, or stalled.
    public var failure: ALSAError? { loop.failure }

    public var fault: (any Error)? { failure }
}

/// Everything the playback thread touches, so the thread does not keep the `Player` alive.
final class PlaybackLoop: @unchecked Sendable {  // `block` and `polls` are used only by the playback thread; the rest is Sendable.
    let handle: PCMHandle
    let counters = AudioCounters()
    /// Whose `isRunning` keeps the loop going.
    let lifecycle: StageLifecycle
    let prefillFrames: Int
    /// What ended the loop, if anything did.
    let fault: DeviceFault
    /// One period of interleaved samples: the renderer's output, and silence for the prefill.
    private let block: UnsafeMutablePointer<Float>
    /// What the loop waits on: the input's socket and the device's descriptors.
    private let polls: PollSet

    init(handle: PCMHandle, prefillFrames: Int, lifecycle: StageLifecycle) {
        self.handle = handle
        self.lifecycle = lifecycle
        self.prefillFrames = prefillFrames
        let samples = handle.periodFrames * handle.format.channels
        self.block = .allocate(capacity: samples)
        self.block.initialize(repeating: 0, count: samples)
        polls = PollSet(capacity: 1 + max(1, handle.pollDescriptorCount))
        fault = DeviceFault(handle: handle)
    }

    deinit {
        block.deallocate()
    }

    var failure: ALSAError? { fault.error(for: handle) }

    /// The real-time loop. No allocation, locks, logging or Foundation below this line (the renderer and its input
    /// promise the same).
    func run(renderer: any AudioRenderer) {
        let period = handle.periodFrames
        let channels = handle.format.channels
        let rate = Double(handle.format.sampleRate)
        let output = UnsafeMutableBufferPointer(start: block, count: period * channels)

        var silence = prefillFrames
        while silence > 0 && lifecycle.isRunning {
            let frames = min(silence, period)
            output.update(repeating: 0)
            guard write(frames: frames, countingOutput: false) else { return }
            silence -= frames
        }

        let input = renderer.input
        var inputOpen = input != nil
        var schedule = RenderSchedule(configuration: .init(periodFrames: period, bufferFrames: handle.bufferFrames,
                                                           sampleRate: handle.format.sampleRate))
        // A device that stops taking periods (its server died) must neither hold this thread forever nor go unnoticed.
        var watchdog = DeviceWatchdog(limitNanos: fault.stallLimitNanos, nowNanos: MonotonicClock.nowNanos())
        while lifecycle.isRunning {
            let room = handle.availableFrames()
            if room < 0 {
                guard fault.recover(handle, from: room, returnedBy: .avail, counters: counters) else { return }
                schedule.restart()
                continue
            }
            let now = MonotonicClock.nowNanos()
            if watchdog.isStalled(nowNanos: now) {
                fault.recordStall(in: .poll)
                return
            }
            let ready = inputOpen ? renderer.isReady(frames: period) : true
            switch schedule.next(nowNanos: now, roomFrames: room, hasInput: inputOpen, ready: ready) {
            case .render(let asOf):
                // The queue as of the time the block is rendered for (a deadline ahead of now: less of it is left).
                let ahead = asOf > now ? Int(Double(asOf - now) * rate / 1e9) : 0
                let delay = max((handle.delayFrames() ?? 0) - ahead, 0)
                counters.delayFrames.store(delay, ordering: .relaxed)
                renderer.render(into: output, context: RenderContext(frames: period, deviceDelayFrames: delay, nowNanos: asOf))
                AudioCounters.bump(counters.framesIn, by: period)
                guard write(frames: period, countingOutput: true) else { return }
                watchdog.progressed(nowNanos: now)
                schedule.rendered()
            case .wait(let until, let forDevice):
                polls.removeAll()
                let inputSlot = inputOpen ? polls.appendReadable(input!.descriptor) : -1
                var deviceSlot = -1, deviceSlots = 0
                if forDevice {
                    // A device short of its start threshold by less than a period would never start: start it.
                    let started = handle.startIfStuck(periodFrames: period)
                    if started < 0 { fault.record(Int(started), from: .start); return }
                    deviceSlot = polls.reserve(handle.pollDescriptorCount) { handle.fillPollDescriptors($0, space: $1) }
                    deviceSlots = polls.count - deviceSlot
                }
                if polls.wait(untilNanos: watchdog.waitDeadline(nowNanos: now, wanted: until)) < 0 {
                    fault.record(-Int(polls.lastError), from: .poll)
                    return
                }
                if inputSlot >= 0 {
                    switch polls.readiness(at: inputSlot) {
                    case .readable: input!.pump()
                    case .gone: inputOpen = false   // the input's socket is gone: play on, at the device's pace
                    case .idle: break
                    }
                }
                if deviceSlots > 0 {
                    // The jack plugin consumes its wake-up byte here; room is re-read from the device above.
                    _ = handle.pollEvents(polls.slots(from: deviceSlot), count: deviceSlots)
                }
            }
        }
    }

    /// Writes the first `frames` frames of `block`, recovering from xruns. Returns `false` after a fatal error, or
    /// once the stage is stopped (a suspended device is retried a nap at a time: `stop()` must not wait for it).
    private func write(frames: Int, countingOutput: Bool) -> Bool {
        let channels = handle.format.channels
        var offset = 0
        while offset < frames {
            guard lifecycle.isRunning else { return false }
            let written = handle.writeFrames(from: block + offset * channels, frames: frames - offset)
            if written >= 0 {
                offset += written
                if countingOutput { AudioCounters.bump(counters.framesOut, by: written) }
                continue
            }
            guard fault.recover(handle, from: written, returnedBy: .writei, counters: counters) else { return false }
        }
        return true
    }
}
