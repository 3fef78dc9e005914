import MeshPOSIX
/// Fills chunks for a `PacedSource`: the generator behind a file sibling of `Recorder`.
protocol ChunkProducer: AnyObject, Sendable {
    /// Writes up to `frames` interleaved frames into `buffer`; returns how many (0 = end of stream).
    /// Called only on the source's thread.
    func produce(into buffer: UnsafeMutablePointer<Float>, frames: Int) -> Int
}

/// The file/synthetic sibling of the device capture loop: a thread that pulls chunks from a `ChunkProducer`
/// and delivers them as `Recorder` does: to a `CaptureConsumer` on the same thread, or through a `ChunkRing`.
///
/// In real-time mode the thread is paced by a `PacingClock`: a chunk is handed over when its last frame
/// "would have been captured", so one second of audio takes one second. Otherwise it runs as fast as the consumer
/// takes chunks (a ring reader: waiting for ring space instead of dropping).
final class PacedSource: @unchecked Sendable {  // `scratch` is used only by the source thread; the rest is Sendable.
    let format: AudioFormat
    let periodFrames: Int
    let realtime: Bool
    let ring: ChunkRing
    let counters = AudioCounters()
    private let producer: any ChunkProducer
    private let lifecycle: StageLifecycle
    private let scratch: UnsafeMutablePointer<Float>

    /// `name` labels the stage in errors (`ToneSource(440.0 Hz)`); its thread is `pm-source`.
    init(name: String, format: AudioFormat, periodFrames: Int, realtime: Bool, ringChunks: Int,
         producer: any ChunkProducer) {
        precondition(periodFrames > 0 && ringChunks > 0, "periodFrames and ringChunks must be positive")
        self.lifecycle = StageLifecycle(stage: name, threadName: "pm-source")
        self.format = format
        self.periodFrames = periodFrames
        self.realtime = realtime
        self.producer = producer
        self.ring = ChunkRing(channels: format.channels, maxChunkFrames: periodFrames, minimumChunks: ringChunks)
        self.scratch = .allocate(capacity: periodFrames * format.channels)
        self.scratch.initialize(repeating: 0, count: periodFrames * format.channels)
    }

    deinit {
        scratch.deallocate()
    }

    func start(consumer: (any CaptureConsumer)?) throws {
        try lifecycle.start { [self] in run(consumer: consumer) }
    }

    func stop() {
        lifecycle.stop()
        ring.finish()
    }

    func read(into buffer: UnsafeMutableBufferPointer<Float>, timeoutNanos: UInt64) -> ChunkInfo? {
        guard let info = ring.read(into: buffer, timeoutNanos: timeoutNanos) else { return nil }
        AudioCounters.bump(counters.framesOut, by: info.frames)
        return info
    }

    /// The source thread: each chunk goes to `consumer`, or to the ring when there is none.
    private func run(consumer: (any CaptureConsumer)?) {
        let channels = format.channels
        let clock = PacingClock(sampleRate: format.sampleRate)
        var frameIndex: UInt64 = 0
        produce: while lifecycle.isRunning {
            let frames = producer.produce(into: scratch, frames: periodFrames)
            guard frames > 0 else { break }
            let timestamp: UInt64
            if realtime {
                timestamp = clock.time(ofFrame: frameIndex)
                clock.sleep(untilFrame: frameIndex + UInt64(frames))
            } else if consumer != nil {
                timestamp = MonotonicClock.nowNanos()
            } else {
                while !ring.waitForSpace(sampleCount: frames * channels,
                                         untilNanos: MonotonicClock.nowNanos() + 50_000_000) {
                    if !lifecycle.isRunning { break produce }
                }
                timestamp = MonotonicClock.nowNanos()
            }
            AudioCounters.bump(counters.framesIn, by: frames)
            let info = ChunkInfo(firstFrameIndex: frameIndex, frames: frames, timestampNanos: timestamp)
            if let consumer {
                consumer.consume(UnsafeMutableBufferPointer(start: scratch, count: frames * channels), info: info,
                                 deviceDelayFrames: 0)
                AudioCounters.bump(counters.framesOut, by: frames)
            } else if !ring.push(UnsafeBufferPointer(start: scratch, count: frames * channels), info: info) {
                AudioCounters.bump(counters.overflowFrames, by: frames)
            }
            frameIndex &+= UInt64(frames)
        }
        ring.finish()
    }
}

/// A real-time pacing clock for file siblings of devices: maps frame counts to `CLOCK_MONOTONIC` deadlines
/// from a fixed origin (no drift accumulates) and sleeps with `clock_nanosleep(TIMER_ABSTIME)`.
public struct PacingClock: Sendable {
    /// The sample rate frames are counted at.
    public let sampleRate: Int
    /// Monotonic time of frame 0.
    public let originNanos: UInt64

    /// Starts the clock now (or at `originNanos`).
    public init(sampleRate: Int, originNanos: UInt64 = MonotonicClock.nowNanos()) {
        precondition(sampleRate > 0, "sample rate must be positive")
        self.sampleRate = sampleRate
        self.originNanos = originNanos
    }

    /// Monotonic time at which `frame` is due.
    public func time(ofFrame frame: UInt64) -> UInt64 {
        originNanos &+ frame / UInt64(sampleRate) * 1_000_000_000
            &+ frame % UInt64(sampleRate) * 1_000_000_000 / UInt64(sampleRate)
    }

    /// Sleeps until `frame` is due (returns at once if it already is).
    public func sleep(untilFrame frame: UInt64) {
        MonotonicClock.sleep(untilNanos: time(ofFrame: frame))
    }
}

/// A source whose work is a `PacedSource` (the tone and file siblings of `Recorder`): the `AudioSource` calls go
/// straight to it.
protocol PacedSourceBacked: AudioSource {
    var source: PacedSource { get }
}

extension PacedSourceBacked {
    public var format: AudioFormat { source.format }
    public var periodFrames: Int { source.periodFrames }
    public func start() throws { try source.start(consumer: nil) }
    public func start(consumer: any CaptureConsumer) throws { try source.start(consumer: consumer) }
    public func stop() { source.stop() }
    public func read(into buffer: UnsafeMutableBufferPointer<Float>, timeoutNanos: UInt64) -> ChunkInfo? {
        source.read(into: buffer, timeoutNanos: timeoutNanos)
    }
    public var stats: AudioStats { source.counters.snapshot() }
}
