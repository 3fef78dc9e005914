/// When a sink renders each block: the pure clock shared by the `Player` and its file sibling, `WAVFileSink`.
///
/// A device with a buffer of `bufferFrames` takes a period at a time; it has *room* for the next block once at most
/// `bufferFrames − periodFrames` frames are queued. A block written at any time before the queue runs dry plays at
/// the same instant — the stream is contiguous — so a sink need not render the moment there is room.
///
/// - **Without an input** (`hasInput` false) a block is rendered at room, as of then: the device's own pace.
/// - **With an input** the sink serves itself (a `RenderInput`: the network end of a playout chain), it renders each
///   block as soon as its data is there (`ready`), and at the latest at the block's *deadline*: `slackNanos` after the
///   room appeared, the queue left at room (`bufferFrames − periodFrames`) less a safety margin. Whenever it renders,
///   it renders *as of the deadline*: the renderer is told that time, so the jitter buffer's guarantee — every frame
///   there when its block is made — is kept for the latest moment the block could be made. The jitter buffer then
///   no longer holds a packet's worth of audio in reserve for where in the device's period the packets land; the
///   device's queue covers it, and the wait costs no latency (the block plays when it would have anyway). One thread
///   wakes once per period: for the data, which arrives after the room.
///
/// Room is observed when the loop looks: after a device wake-up, exactly; after the input woke the loop, only as an
/// upper bound on a device whose queue moves in whole periods (JACK's). So room times are predicted one period apart
/// from the last block's, and re-anchored on a device wake-up at least every `resyncBlocks` blocks (the device's clock
/// and the monotonic clock drift apart) and whenever the device is late.
///
/// Pure: the loop passes the time and the device's state in, and performs the decision.
public struct RenderSchedule: Sendable {
    /// The device and the safety margin.
    public struct Configuration: Sendable, Equatable {
        /// Frames per block (the device period).
        public var periodFrames: Int
        /// Frames the device buffer holds.
        public var bufferFrames: Int
        /// Frames per second.
        public var sampleRate: Int
        /// How long before the device's queue would run dry a block is written at the latest (default 1 ms).
        public var marginNanos: UInt64 = 1_000_000
        /// Blocks between two re-anchorings of the predicted room times on a device wake-up (default 128: 0.37 s at
        /// 128 frames and 44.1 kHz, over which a device 100 ppm off the monotonic clock drifts 37 µs).
        public var resyncBlocks: Int = 128

        public init(periodFrames: Int, bufferFrames: Int, sampleRate: Int) {
            self.periodFrames = periodFrames
            self.bufferFrames = bufferFrames
            self.sampleRate = sampleRate
        }
    }

    /// What the loop does next.
    public enum Decision: Sendable, Equatable {
        /// Render one block now, telling the renderer it is `asOfNanos`.
        case render(asOfNanos: UInt64)
        /// Wait for the input (when there is one), and for the device's room when `forDevice`, until `untilNanos` at
        /// the latest (nil: no limit); then ask again.
        case wait(untilNanos: UInt64?, forDevice: Bool)
    }

    /// The block the loop is making: when the device had room for it, and its deadline.
    private struct Block {
        var roomNanos: UInt64
        var deadlineNanos: UInt64
    }

    /// The device and margin in use.
    public let configuration: Configuration
    /// Time from a block's room to its deadline.
    public let slackNanos: UInt64
    private let periodNanos: UInt64
    private var block: Block?
    /// When the device should next have room (nil: unknown until a device wake-up shows it).
    private var predictedRoomNanos: UInt64?
    private var blocksSinceResync = 0
    /// Whether the loop waited on the device just before this decision (room seen now was woken for: exact).
    private var wokenByDevice = false

    /// A schedule for `configuration`.
    public init(configuration: Configuration) {
        self.configuration = configuration
        let rate = Double(configuration.sampleRate)
        periodNanos = UInt64(Double(configuration.periodFrames) * 1e9 / rate)
        let queuedAtRoom = Double(max(0, configuration.bufferFrames - configuration.periodFrames)) * 1e9 / rate
        slackNanos = UInt64(max(0, queuedAtRoom - Double(configuration.marginNanos)))
    }

    /// The decision at `nowNanos`, when the device has room for `roomFrames` frames (`snd_pcm_avail`), the sink has
    /// an input (`hasInput`), and the renderer has the data for the next block (`ready`).
    public mutating func next(nowNanos now: UInt64, roomFrames: Int, hasInput: Bool, ready: Bool) -> Decision {
        let woken = wokenByDevice
        wokenByDevice = false
        if roomFrames >= configuration.periodFrames {
            let current: Block
            if let block {
                current = block
            } else {
                var room = now
                if !woken, let predicted = predictedRoomNanos, predicted <= now { room = predicted }
                if woken { blocksSinceResync = 0 }
                current = Block(roomNanos: room, deadlineNanos: room &+ slackNanos)
                block = current
            }
            guard hasInput else { return .render(asOfNanos: now) }
            if ready || now >= current.deadlineNanos { return .render(asOfNanos: current.deadlineNanos) }
            return .wait(untilNanos: current.deadlineNanos, forDevice: false)
        }
        // No room yet. While the data is still to come and the device is on time, wait for the data alone: it
        // normally arrives after the room, so the loop wakes once. Otherwise wake when the device has room.
        if hasInput, !ready, blocksSinceResync < configuration.resyncBlocks, let predicted = predictedRoomNanos,
           now < predicted &+ slackNanos {
            return .wait(untilNanos: predicted &+ slackNanos, forDevice: false)
        }
        wokenByDevice = true
        return .wait(untilNanos: nil, forDevice: true)
    }

    /// The block decided on was written: the next one is due a period after it.
    public mutating func rendered() {
        guard let block else { return }
        predictedRoomNanos = block.roomNanos &+ periodNanos
        self.block = nil
        blocksSinceResync += 1
    }

    /// The device restarted (an xrun recovered, a start): forget its phase.
    public mutating func restart() {
        block = nil
        predictedRoomNanos = nil
        wokenByDevice = false
    }
}
