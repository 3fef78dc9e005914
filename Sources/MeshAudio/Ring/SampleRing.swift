import Synchronization
import MeshPOSIX

/// A preallocated single-producer, single-consumer ring of `Float` samples.
///
/// Exactly one thread may call the producer methods (`write`, `availableToWrite`) and exactly one the consumer
/// methods (`read`, `availableToRead`). Neither side allocates, locks or blocks, so either may be a real-time
/// thread. The capacity is rounded up to a power of two; the indices are free-running counters published with
/// release/acquire atomics, so a sample is visible to the reader only after it has been fully written.
public final class SampleRing: @unchecked Sendable {  // SPSC: each side touches only slots the atomics hand it.
    /// Samples the ring can hold.
    public let capacity: Int
    private let mask: Int
    private let storage: UnsafeMutablePointer<Float>
    /// Total samples ever written (producer-owned, published with release).
    private let head = Atomic<Int>(0)
    /// Total samples ever read (consumer-owned, published with release).
    private let tail = Atomic<Int>(0)

    /// Creates a ring holding at least `minimumCapacity` samples (rounded up to a power of two).
    public init(minimumCapacity: Int) {
        precondition(minimumCapacity > 0, "SampleRing capacity must be positive")
        var capacity = 1
        while capacity < minimumCapacity { capacity <<= 1 }
        self.capacity = capacity
        self.mask = capacity - 1
        self.storage = .allocate(capacity: capacity)
        self.storage.initialize(repeating: 0, count: capacity)
    }

    deinit {
        storage.deallocate()
    }

    /// Samples the consumer can read now.
    public var availableToRead: Int {
        head.load(ordering: .acquiring) - tail.load(ordering: .relaxed)
    }

    /// Samples the producer can write now.
    public var availableToWrite: Int {
        capacity - (head.load(ordering: .relaxed) - tail.load(ordering: .acquiring))
    }

    /// Producer: copies as many of `samples` as fit and publishes them. Returns the number written.
    @discardableResult
    public func write(_ samples: UnsafeBufferPointer<Float>) -> Int {
        let writeIndex = head.load(ordering: .relaxed)
        let free = capacity - (writeIndex - tail.load(ordering: .acquiring))
        let count = min(free, samples.count)
        guard count > 0, let source = samples.baseAddress else { return 0 }
        let start = writeIndex & mask
        let first = min(count, capacity - start)
        (storage + start).update(from: source, count: first)
        if first < count {
            storage.update(from: source + first, count: count - first)
        }
        head.store(writeIndex + count, ordering: .releasing)
        return count
    }

    /// Consumer: copies up to `buffer.count` available samples into `buffer` and frees their slots.
    /// Returns the number read.
    @discardableResult
    public func read(into buffer: UnsafeMutableBufferPointer<Float>) -> Int {
        let readIndex = tail.load(ordering: .relaxed)
        let available = head.load(ordering: .acquiring) - readIndex
        let count = min(available, buffer.count)
        guard count > 0, let destination = buffer.baseAddress else { return 0 }
        let start = readIndex & mask
        let first = min(count, capacity - start)
        destination.update(from: storage + start, count: first)
        if first < count {
            (destination + first).update(from: storage, count: count - first)
        }
        tail.store(readIndex + count, ordering: .releasing)
        return count
    }
}

/// A preallocated SPSC queue of audio chunks: each chunk's interleaved samples travel in a `SampleRing`, its
/// `ChunkInfo` in a parallel slot array. This is the hand-over between every capture thread (ALSA `Recorder`,
/// `ToneSource`, `WAVFileSource`) and the one consumer thread that calls `AudioSource.read`.
///
/// Producer side (`push`, `waitForSpace`, `finish`) is real-time safe except `waitForSpace`, which only
/// non-real-time producers (files running faster than real time) use. Consumer side is `read(into:timeoutNanos:)`.
public final class ChunkRing: @unchecked Sendable {  // SPSC: info slots are handed over by the head/tail atomics.
    /// Interleaved channels per frame.
    public let channels: Int
    /// The most frames one chunk may carry.
    public let maxChunkFrames: Int
    /// The most samples one chunk may carry (`maxChunkFrames × channels`).
    public let maxChunkSamples: Int
    /// Chunks the ring can hold.
    public let chunkCapacity: Int
    private let samples: SampleRing
    private let infos: UnsafeMutablePointer<ChunkInfo>
    private let infoMask: Int
    private let infoHead = Atomic<Int>(0)
    private let infoTail = Atomic<Int>(0)
    private let finished = Atomic<Bool>(false)
    private let dataSignal = WakeSignal()
    private let spaceSignal = WakeSignal()

    /// Creates a ring of at least `minimumChunks` chunks (rounded up to a power of two) of up to
    /// `maxChunkFrames` frames of `channels` interleaved samples each.
    public init(channels: Int, maxChunkFrames: Int, minimumChunks: Int) {
        precondition(channels > 0 && maxChunkFrames > 0 && minimumChunks > 0, "ChunkRing sizes must be positive")
        let maxChunkSamples = channels * maxChunkFrames
        self.channels = channels
        self.maxChunkFrames = maxChunkFrames
        var chunks = 1
        while chunks < minimumChunks { chunks <<= 1 }
        self.maxChunkSamples = maxChunkSamples
        self.chunkCapacity = chunks
        self.infoMask = chunks - 1
        self.samples = SampleRing(minimumCapacity: maxChunkSamples * chunks)
        self.infos = .allocate(capacity: chunks)
        self.infos.initialize(repeating: ChunkInfo(firstFrameIndex: 0, frames: 0, timestampNanos: 0), count: chunks)
    }

    deinit {
        infos.deallocate()
    }

    /// Chunks waiting for the consumer.
    public var count: Int { infoHead.load(ordering: .acquiring) - infoTail.load(ordering: .acquiring) }

    /// Producer: queues one chunk (`info.frames × channels` samples from `chunk`) and wakes the consumer.
    /// Returns `false` (queuing nothing) when the ring is full. Real-time safe.
    public func push(_ chunk: UnsafeBufferPointer<Float>, info: ChunkInfo) -> Bool {
        precondition(info.frames <= maxChunkFrames && info.frames * channels <= chunk.count,
                     "chunk does not match the ring's slot")
        let chunk = UnsafeBufferPointer(rebasing: chunk[0..<(info.frames * channels)])
        let head = infoHead.load(ordering: .relaxed)
        guard head - infoTail.load(ordering: .acquiring) < chunkCapacity,
              samples.availableToWrite >= chunk.count else { return false }
        samples.write(chunk)
        infos[head & infoMask] = info
        infoHead.store(head + 1, ordering: .releasing)
        dataSignal.signal()
        return true
    }

    /// Producer (non-real-time only): waits until a chunk of `sampleCount` samples fits, or until the deadline.
    /// Returns `false` on timeout.
    public func waitForSpace(sampleCount: Int, untilNanos deadline: UInt64) -> Bool {
        while infoHead.load(ordering: .relaxed) - infoTail.load(ordering: .acquiring) >= chunkCapacity
                || samples.availableToWrite < sampleCount {
            if !spaceSignal.wait(untilNanos: deadline) { return false }
        }
        return true
    }

    /// Producer: marks the end of the stream. The consumer drains what is queued, then `read` returns `nil`.
    /// Also used by `stop()` from any thread to release a blocked reader. Real-time safe.
    public func finish() {
        finished.store(true, ordering: .releasing)
        dataSignal.signal()
        spaceSignal.signal()
    }

    /// True once `finish()` has been called.
    public var isFinished: Bool { finished.load(ordering: .acquiring) }

    /// True once `finish()` has been called and every queued chunk has been read.
    public var isDrained: Bool { isFinished && count == 0 }

    /// Consumer: copies the next chunk into `buffer` (which must hold `maxChunkSamples`), waiting up to
    /// `timeoutNanos` for one. Returns `nil` on timeout, or once the stream is finished and drained.
    public func read(into buffer: UnsafeMutableBufferPointer<Float>, timeoutNanos: UInt64) -> ChunkInfo? {
        precondition(buffer.count >= maxChunkSamples, "read buffer smaller than a chunk")
        let deadline = MonotonicClock.deadline(after: timeoutNanos)
        while true {
            let tail = infoTail.load(ordering: .relaxed)
            if infoHead.load(ordering: .acquiring) != tail {
                let info = infos[tail & infoMask]
                let sampleCount = info.frames * channels
                let got = samples.read(into: UnsafeMutableBufferPointer(rebasing: buffer[0..<sampleCount]))
                precondition(got == sampleCount, "ChunkRing lost samples")
                infoTail.store(tail + 1, ordering: .releasing)
                spaceSignal.signal()
                return info
            }
            if finished.load(ordering: .acquiring) && infoHead.load(ordering: .acquiring) == tail { return nil }
            if MonotonicClock.nowNanos() >= deadline { return nil }
            dataSignal.wait(untilNanos: deadline)
        }
    }
}
