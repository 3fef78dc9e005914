import Synchronization
import MeshPOSIX

/// Records what a renderer produces into a WAV file, the file sibling of `Player`.
///
/// A thread pulls `periodFrames` at a time from the renderer and writes them, paced in real time unless `realtime`
/// is false. Paced, it plays a device with a buffer of two periods on the monotonic clock, with the `Player`'s
/// `RenderSchedule`: the same wait for a renderer's input and the same deadlines, so what a player does on a device
/// it does into a file. Unpaced, it pulls as fast as the renderer and the disk go (`deviceDelayFrames` 0).
/// The header is kept up to date as frames are written and finalized by `stop()`, so a caller that handles SIGINT
/// by calling `stop()` leaves a valid file. With `maxFrames`, the sink stops pulling after that many frames
/// (`waitUntilFinished` waits for it).
public final class WAVFileSink: AudioSink {
    /// The file's path.
    public let path: String
    public let format: AudioFormat
    public let periodFrames: Int
    /// Sample encoding in the file.
    public let encoding: SoundFileEncoding
    /// Frames after which the sink stops pulling, if set.
    public let maxFrames: Int?
    /// Whether the sink keeps real time.
    public let realtime: Bool
    private let loop: SinkLoop
    private let lifecycle: StageLifecycle

    /// Creates (or truncates) the WAV file at `path`; a new one is made mode 0600 (what a microphone heard is for its
    /// owner). `exclusive`: only a new file, never through a link in its place (for a name the program chose).
    /// Throws `SndfileError` if it cannot be created and `AudioFormatError` for an unsupported format.
    public init(path: String, format: AudioFormat = .default, periodFrames: Int = 128, encoding: SoundFileEncoding = .float32,
                realtime: Bool = true, maxFrames: Int? = nil, exclusive: Bool = false) throws {
        try format.validate()
        precondition(periodFrames > 0, "periodFrames must be positive")
        let file = try SoundFile.create(path: path, format: format, encoding: encoding, exclusive: exclusive)
        self.path = path
        self.format = format
        self.periodFrames = periodFrames
        self.encoding = encoding
        self.maxFrames = maxFrames
        self.realtime = realtime
        let lifecycle = StageLifecycle(stage: "WAVFileSink(\(path))", threadName: "pm-wavsink")
        self.lifecycle = lifecycle
        self.loop = SinkLoop(file: file, format: format, periodFrames: periodFrames, realtime: realtime,
                             maxFrames: maxFrames, lifecycle: lifecycle)
    }

    deinit {
        stop()
    }

    public func start(renderer: any AudioRenderer) throws {
        try lifecycle.start { [loop] in loop.run(renderer: renderer) }
    }

    /// Stops pulling and closes the file, finalizing its header. Safe to call more than once.
    public func stop() {
        lifecycle.stop()
        loop.close()
    }

    /// Waits until `maxFrames` have been written (or a write failed). Returns `false` on timeout.
    public func waitUntilFinished(timeoutNanos: UInt64) -> Bool {
        let deadline = MonotonicClock.deadline(after: timeoutNanos)
        while !loop.done.load(ordering: .acquiring) {
            if !loop.doneSignal.wait(untilNanos: deadline) { return loop.done.load(ordering: .acquiring) }
        }
        return true
    }

    public var stats: AudioStats { loop.counters.snapshot() }

    /// A paced sink's thread serves the renderer's input, as a `Player`'s does; an unpaced one does not.
    public var servesInput: Bool { realtime }

    /// The write or close error, if one happened.
    public var failure: SndfileError? { loop.failure }

    public var fault: (any Error)? { failure }
}

/// Everything the sink thread touches.
final class SinkLoop: @unchecked Sendable {  // `file`, `block` and `polls` are used by the sink thread, then by `close` after join.
    let counters = AudioCounters()
    /// Whose `isRunning` keeps the loop going.
    let lifecycle: StageLifecycle
    let done = Atomic<Bool>(false)
    let doneSignal = WakeSignal()
    private let file: SoundFile
    private let format: AudioFormat
    private let periodFrames: Int
    private let realtime: Bool
    private let maxFrames: Int?
    private let block: UnsafeMutablePointer<Float>
    /// What the paced loop waits on: the renderer's input.
    private let polls = PollSet(capacity: 1)
    private let failureStore = Mutex<SndfileError?>(nil)
    /// Held while the file is closed: a second, concurrent `stop` finds it closed.
    private let closing = Mutex(())

    init(file: SoundFile, format: AudioFormat, periodFrames: Int, realtime: Bool, maxFrames: Int?,
         lifecycle: StageLifecycle) {
        self.file = file
        self.lifecycle = lifecycle
        self.format = format
        self.periodFrames = periodFrames
        self.realtime = realtime
        self.maxFrames = maxFrames
        self.block = .allocate(capacity: periodFrames * format.channels)
        self.block.initialize(repeating: 0, count: periodFrames * format.channels)
    }

    deinit {
        block.deallocate()
    }

    var failure: SndfileError? { failureStore.withLock { $0 } }

    func run(renderer: any AudioRenderer) {
        let channels = format.channels
        let rate = Double(format.sampleRate)
        let input = realtime ? renderer.input : nil
        var inputOpen = input != nil
        // The paced sink's device: two periods of buffer, played out at the rate from the first block on.
        let buffer = 2 * periodFrames
        var schedule = RenderSchedule(configuration: .init(periodFrames: periodFrames, bufferFrames: buffer,
                                                           sampleRate: format.sampleRate))
        let polls = self.polls
        var started: UInt64 = 0
        var written = 0
        /// Frames of the virtual device's queue at `now`.
        func queued(_ now: UInt64) -> Int {
            guard started != 0 else { return 0 }
            let played = Int(Double(now &- started) * rate / 1e9)
            return max(0, written - played)
        }
        while lifecycle.isRunning {
            let frames = min(periodFrames, (maxFrames ?? Int.max) - written)
            guard frames > 0 else { break }
            let now = MonotonicClock.nowNanos()
            var asOf = now, delay = 0
            if realtime {
                let ready = inputOpen ? renderer.isReady(frames: frames) : true
                switch schedule.next(nowNanos: now, roomFrames: buffer - queued(now), hasInput: inputOpen, ready: ready) {
                case .render(let at):
                    asOf = at
                    delay = max(0, queued(now) - (at > now ? Int(Double(at - now) * rate / 1e9) : 0))
                case .wait(let until, let forDevice):
                    var deadline = until
                    if forDevice {
                        // The device has room once its queue is down to buffer − period.
                        let roomAt = started &+ UInt64(Double(written - buffer + periodFrames) * 1e9 / rate)
                        deadline = min(deadline ?? roomAt, roomAt)
                    }
                    polls.removeAll()
                    let slot = inputOpen ? polls.appendReadable(input!.descriptor) : -1
                    _ = polls.wait(untilNanos: deadline)
                    if slot >= 0 {
                        switch polls.readiness(at: slot) {
                        case .readable: input!.pump()
                        case .gone: inputOpen = false
                        case .idle: break
                        }
                    }
                    continue
                }
            }
            if started == 0 { started = max(1, now) }
            let context = RenderContext(frames: frames, deviceDelayFrames: delay, nowNanos: asOf)
            renderer.render(into: UnsafeMutableBufferPointer(start: block, count: frames * channels), context: context)
            AudioCounters.bump(counters.framesIn, by: frames)
            let stored = file.writeFrames(from: block, frames: frames)
            AudioCounters.bump(counters.framesOut, by: stored)
            written += stored
            if realtime { schedule.rendered() }
            if stored < frames {
                let error = file.error(operation: "write")
                    ?? SndfileError(path: file.path, operation: "write", message: "short write (\(stored) of \(frames) frames)")
                failureStore.withLock { $0 = error }
                break
            }
        }
        done.store(true, ordering: .releasing)
        doneSignal.signal()
    }

    /// Closes the file; records a close error. Called after the thread has been joined (or never started).
    func close() {
        let error = closing.withLock { _ -> SndfileError? in
            do throws(SndfileError) { try file.close() } catch { return error }
            return nil
        }
        if let error { failureStore.withLock { if $0 == nil { $0 = error } } }
        done.store(true, ordering: .releasing)
        doneSignal.signal()
    }
}
