/// The contracts between the stages of the audio path.
///
/// Capture side: an `AudioSource` (ALSA `Recorder`, `ToneSource`, `WAVFileSource`) produces chunks of frames and
/// hands each to a `CaptureConsumer` on its own thread (packetize → send: one wake-up per period), or, started
/// without one, through a ring to a consumer thread that `read`s them. Playback side: an `AudioSink` (ALSA `Player`,
/// `WAVFileSink`) pulls exactly the frames its clock needs from an `AudioRenderer` (jitter buffer → conceal →
/// resample). MeshPipeline assembles them, one place per direction (`CapturePipeline`, `PlayoutPipeline`).

/// Where a chunk of captured frames sits in the capture stream.
public struct ChunkInfo: Sendable, Equatable {
    /// Index, in frames since the source started, of the chunk's first frame.
    public var firstFrameIndex: UInt64
    /// Frames in the chunk.
    public var frames: Int
    /// Monotonic time (`CLOCK_MONOTONIC`, nanoseconds) at which the chunk's first frame was captured, as well as
    /// the source can tell.
    public var timestampNanos: UInt64

    public init(firstFrameIndex: UInt64, frames: Int, timestampNanos: UInt64) {
        self.firstFrameIndex = firstFrameIndex
        self.frames = frames
        self.timestampNanos = timestampNanos
    }
}

/// Counters every device and its file siblings keep. All are readable from any thread.
public struct AudioStats: Sendable, Equatable {
    /// Frames captured from the device (sources) or taken from the renderer (sinks).
    public var framesIn: UInt64 = 0
    /// Frames handed to the consumer (sources) or written to the device (sinks).
    public var framesOut: UInt64 = 0
    /// Under- and overruns recovered with `snd_pcm_recover`.
    public var xruns: UInt64 = 0
    /// Frames dropped because the consumer did not keep up (sources only).
    public var overflowFrames: UInt64 = 0
    /// Frames the device lost in capture overruns, as the capture clock measures them (`Recorder` only): the
    /// `firstFrameIndex` skips them. Never counted in `framesIn`.
    public var overrunFrames: UInt64 = 0
    /// The device's current delay (`snd_pcm_delay`) in frames; 0 for file siblings.
    public var delayFrames: Int = 0

    public init() {}
}

/// The downstream stage of a source started with `AudioSource.start(consumer:)`: called on the source's own
/// thread for each chunk, so the path from the device to the network wakes once per period instead of twice.
///
/// For a device that thread is the real-time capture thread: the consumer must not allocate, log, sleep or wait on
/// anything slow. What it may do is finish the chunk's journey: encode it and make non-blocking sends.
public protocol CaptureConsumer: AnyObject, Sendable {
    /// Takes one chunk: `samples` holds `info.frames` interleaved frames, the consumer's to modify and valid only
    /// during the call. `deviceDelayFrames` is the capture delay after it (`AudioStats.delayFrames`).
    func consume(_ samples: UnsafeMutableBufferPointer<Float>, info: ChunkInfo, deviceDelayFrames: Int)
}

/// A producer of captured audio, clocked in real time.
///
/// Two ways to take its chunks: `start(consumer:)` hands each one to the consumer on the source's own thread (one
/// wake-up per period, what the relay uses); `start()` pushes them into a preallocated ring instead, from which
/// exactly one consumer thread `read(into:timeoutNanos:)`s the next chunk, or `nil` on timeout or after `stop()`.
public protocol AudioSource: AnyObject, Sendable {
    /// The format of the frames the source produces.
    var format: AudioFormat { get }
    /// Frames per chunk (the device period).
    var periodFrames: Int { get }
    /// Starts the capture thread; chunks go to the ring, for `read`.
    func start() throws
    /// Starts the capture thread with `consumer` called on it for every chunk (the ring and `read` stay unused).
    /// Calling it while running does nothing.
    func start(consumer: any CaptureConsumer) throws
    /// Stops capture; a blocked `read` returns `nil`.
    func stop()
    /// Copies the next chunk's interleaved samples into `buffer` (which holds at least
    /// `periodFrames * format.channels` samples) and describes it.
    func read(into buffer: UnsafeMutableBufferPointer<Float>, timeoutNanos: UInt64) -> ChunkInfo?
    /// A snapshot of the counters.
    var stats: AudioStats { get }
    /// The error that ended the source on its own — a device that failed or stopped delivering, a file that could
    /// not be read — or nil (running, stopped, or at a file's end). Readable from any thread; nil by default.
    var fault: (any Error)? { get }
    /// While running: what the user should know about how its thread is scheduled (a device thread refused
    /// real-time priority), or nil. Nil by default.
    var schedulingNote: String? { get }
}

extension AudioSource {
    public var fault: (any Error)? { nil }
    public var schedulingNote: String? { nil }
}

/// Timing facts handed to a renderer on each pull.
public struct RenderContext: Sendable {
    /// Frames requested.
    public var frames: Int
    /// Frames queued in the device ahead of this block as of `nowNanos` (`snd_pcm_delay`), 0 for files.
    public var deviceDelayFrames: Int
    /// Monotonic time the block is rendered as of, nanoseconds: the pull's own time, or — for a sink that waits for
    /// its input's data (`RenderSchedule`) — the block's deadline, the latest the block could have been made.
    public var nowNanos: UInt64

    public init(frames: Int, deviceDelayFrames: Int, nowNanos: UInt64) {
        self.frames = frames
        self.deviceDelayFrames = deviceDelayFrames
        self.nowNanos = nowNanos
    }
}

/// The upstream stage of a sink. Called on the sink's real-time thread: it must not allocate, lock, log or
/// touch Foundation. It fills exactly `context.frames` interleaved frames.
///
/// A renderer whose data comes from a network can hand the sink its `input`: the sink then serves it on its own
/// thread, waiting on the input's descriptor beside the device (one thread wakes per period instead of two), and asks
/// `isReady` before each block so that it renders a block as soon as its data is there — up to a deadline the
/// device's queue allows (`RenderSchedule`).
public protocol AudioRenderer: AnyObject, Sendable {
    /// Fills `context.frames` frames of `buffer`, as of `context.nowNanos`.
    func render(into buffer: UnsafeMutableBufferPointer<Float>, context: RenderContext)
    /// The input the sink's thread serves (nil, the default: data reaches the renderer on another thread).
    var input: (any RenderInput)? { get }
    /// Whether the next `frames` frames can be rendered from the data at hand, with nothing concealed for lack of
    /// data (true, the default, for a renderer with no input). Called on the sink's thread.
    func isReady(frames: Int) -> Bool
}

extension AudioRenderer {
    public var input: (any RenderInput)? { nil }
    public func isReady(frames: Int) -> Bool { true }
}

extension AudioSink {
    public var servesInput: Bool { false }
    public var fault: (any Error)? { nil }
    public var schedulingNote: String? { nil }
}

/// The network end of a playout chain, served by the sink's own thread: the sink waits for `descriptor` to become
/// readable together with its device, and then calls `pump`. Real-time safe, as the renderer.
public protocol RenderInput: AnyObject, Sendable {
    /// What to wait on for `POLLIN` (a UDP socket).
    var descriptor: Int32 { get }
    /// Takes in what has arrived, without blocking (called on the sink's thread when `descriptor` is readable).
    func pump()
}

/// A consumer of audio clocked in real time that pulls from an `AudioRenderer`.
public protocol AudioSink: AnyObject, Sendable {
    /// The format the sink plays.
    var format: AudioFormat { get }
    /// Frames per pull.
    var periodFrames: Int { get }
    /// Whether the sink's thread serves its renderer's `input` (waits on it and pumps it). A sink that does not leaves
    /// the data to another thread. The default is false.
    var servesInput: Bool { get }
    /// Starts the sink's thread, which pulls from `renderer` at the sink's pace.
    func start(renderer: any AudioRenderer) throws
    /// Stops pulling and flushes (WAV files are finalized).
    func stop()
    /// A snapshot of the counters.
    var stats: AudioStats { get }
    /// The error that ended the sink on its own — a device that failed or stopped taking audio, a file that could not
    /// be written — or nil (running or stopped). Readable from any thread; nil by default.
    var fault: (any Error)? { get }
    /// While running: what the user should know about how its thread is scheduled (a device thread refused
    /// real-time priority), or nil. Nil by default.
    var schedulingNote: String? { get }
}
