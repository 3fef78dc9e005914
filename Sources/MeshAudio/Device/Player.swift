import Synchronization
import MeshPOSIX

/// Plays to an ALSA device, pulling each period from an `AudioRenderer` on a dedicated real-time thread.
///
/// Pull model: the thread asks the renderer for exactly one period, then writes it with blocking
/// `snd_pcm_writei`, so the renderer is called each time the device has room for a period. Each pull carries
/// `snd_pcm_delay` (frames queued ahead) and the monotonic time. Underruns are recovered with `snd_pcm_recover`,
/// counted in `stats.xruns`, and playback continues.
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

    /// Whether the playback thread got `SCHED_FIFO` (false before `start`).
    public var isRealtime: Bool { lifecycle.isRealtime }

    /// The error that ended playback, if the device failed in a way `snd_pcm_recover` could not fix.
    public var failure: ALSAError? { loop.failure }
}

/// Everything the playback thread touches, so the thread does not keep the `Player` alive.
final class PlaybackLoop: @unchecked Sendable {  // `block` is used only by the playback thread; the rest is Sendable.
    let handle: PCMHandle
    let counters = AudioCounters()
    /// Whose `isRunning` keeps the loop going.
    let lifecycle: StageLifecycle
    let prefillFrames: Int
    private let failureCode = Atomic<Int>(0)
    private let failedInWrite = Atomic<Bool>(false)
    /// One period of interleaved samples: the renderer's output, and silence for the prefill.
    private let block: UnsafeMutablePointer<Float>

    init(handle: PCMHandle, prefillFrames: Int, lifecycle: StageLifecycle) {
        self.handle = handle
        self.lifecycle = lifecycle
        self.prefillFrames = prefillFrames
        let samples = handle.periodFrames * handle.format.channels
        self.block = .allocate(capacity: samples)
        self.block.initialize(repeating: 0, count: samples)
    }

    deinit {
        block.deallocate()
    }

    var failure: ALSAError? {
        let code = failureCode.load(ordering: .acquiring)
        guard code != 0 else { return nil }
        let call = failedInWrite.load(ordering: .relaxed) ? "snd_pcm_writei" : "snd_pcm_recover"
        return handle.error(call: call, code: Int32(truncatingIfNeeded: code))
    }

    /// The real-time loop. No allocation, locks, logging or Foundation below this line (the renderer promises
    /// the same).
    func run(renderer: any AudioRenderer) {
        let period = handle.periodFrames
        let channels = handle.format.channels
        let output = UnsafeMutableBufferPointer(start: block, count: period * channels)

        var silence = prefillFrames
        while silence > 0 && lifecycle.isRunning {
            let frames = min(silence, period)
            output.update(repeating: 0)
            guard write(frames: frames, countingOutput: false) else { return }
            silence -= frames
        }

        while lifecycle.isRunning {
            let delay = max(handle.delayFrames() ?? 0, 0)
            counters.delayFrames.store(delay, ordering: .relaxed)
            let context = RenderContext(frames: period, deviceDelayFrames: delay, nowNanos: MonotonicClock.nowNanos())
            renderer.render(into: output, context: context)
            AudioCounters.bump(counters.framesIn, by: period)
            guard write(frames: period, countingOutput: true) else { return }
        }
    }

    /// Writes the first `frames` frames of `block`, recovering from xruns. Returns `false` after a fatal error.
    private func write(frames: Int, countingOutput: Bool) -> Bool {
        let channels = handle.format.channels
        var offset = 0
        while offset < frames {
            let written = handle.writeFrames(from: block + offset * channels, frames: frames - offset)
            if written >= 0 {
                offset += written
                if countingOutput { AudioCounters.bump(counters.framesOut, by: written) }
                continue
            }
            guard PCMHandle.isXrun(written) else { fail(code: written, inWrite: true); return false }
            let recovered = handle.recover(from: written)
            guard recovered >= 0 else { fail(code: Int(recovered), inWrite: false); return false }
            counters.xruns.wrappingAdd(1, ordering: .relaxed)
        }
        return true
    }

    private func fail(code: Int, inWrite: Bool) {
        failedInWrite.store(inWrite, ordering: .relaxed)
        failureCode.store(code, ordering: .releasing)
    }
}
