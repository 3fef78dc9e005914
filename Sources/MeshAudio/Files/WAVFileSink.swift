import Synchronization
import MeshPOSIX

/// Records what a renderer produces into a WAV file, the file sibling of `Player`.
///
/// A thread pulls `periodFrames` at a time from the renderer (with `deviceDelayFrames` 0) and writes them,
/// paced in real time unless `realtime` is false. The header is kept up to date as frames are written and
/// finalized by `stop()`, so a caller that handles SIGINT by calling `stop()` leaves a valid file.
/// With `maxFrames`, the sink stops pulling after that many frames (`waitUntilFinished` waits for it).
public final class WAVFileSink: AudioSink {
    /// The file's path.
    public let path: String
    public let format: AudioFormat
    public let periodFrames: Int
    /// Sample encoding in the file.
    public let encoding: SoundFileEncoding
    /// Frames after which the sink stops pulling, if set.
    public let maxFrames: Int?
    private let loop: SinkLoop
    private let lifecycle: StageLifecycle

    /// Creates (or truncates) the WAV file at `path`. Throws `SndfileError` if it cannot be created and
    /// `AudioFormatError` for an unsupported format.
    public init(path: String, format: AudioFormat = .default, periodFrames: Int = 128, encoding: SoundFileEncoding = .float32,
                realtime: Bool = true, maxFrames: Int? = nil) throws {
        try format.validate()
        precondition(periodFrames > 0, "periodFrames must be positive")
        let file = try SoundFile.create(path: path, format: format, encoding: encoding)
        self.path = path
        self.format = format
        self.periodFrames = periodFrames
        self.encoding = encoding
        self.maxFrames = maxFrames
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
        let deadline = MonotonicClock.nowNanos() &+ timeoutNanos
        while !loop.done.load(ordering: .acquiring) {
            if !loop.doneSignal.wait(untilNanos: deadline) { return loop.done.load(ordering: .acquiring) }
        }
        return true
    }

    public var stats: AudioStats { loop.counters.snapshot() }

    /// The write or close error, if one happened.
    public var failure: SndfileError? { loop.failure }
}

/// Everything the sink thread touches.
final class SinkLoop: @unchecked Sendable {  // `file` and `block` are used by the sink thread, then by `close` after join.
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
    private let failureStore = Mutex<SndfileError?>(nil)

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
        let clock = PacingClock(sampleRate: format.sampleRate)
        var written = 0
        while lifecycle.isRunning {
            let frames = min(periodFrames, (maxFrames ?? Int.max) - written)
            guard frames > 0 else { break }
            let context = RenderContext(frames: frames, deviceDelayFrames: 0, nowNanos: MonotonicClock.nowNanos())
            renderer.render(into: UnsafeMutableBufferPointer(start: block, count: frames * channels), context: context)
            AudioCounters.bump(counters.framesIn, by: frames)
            let stored = file.writeFrames(from: block, frames: frames)
            AudioCounters.bump(counters.framesOut, by: stored)
            written += stored
            if stored < frames {
                let error = file.error(operation: "write")
                    ?? SndfileError(path: file.path, operation: "write", message: "short write (\(stored) of \(frames) frames)")
                failureStore.withLock { $0 = error }
                break
            }
            if realtime { clock.sleep(untilFrame: UInt64(written)) }
        }
        done.store(true, ordering: .releasing)
        doneSignal.signal()
    }

    /// Closes the file; records a close error. Called after the thread has been joined (or never started).
    func close() {
        do {
            try file.close()
        } catch {
            failureStore.withLock { if $0 == nil { $0 = error } }
        }
        done.store(true, ordering: .releasing)
        doneSignal.signal()
    }
}
