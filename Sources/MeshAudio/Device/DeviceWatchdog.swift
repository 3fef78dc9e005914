/// Notices a device that stopped moving, and keeps a device loop's waits short enough to see its stop flag.
///
/// A device whose server died (a killed `jackd`, a restarted PipeWire) or that hangs in its driver never wakes its
/// poll descriptors and never reports an error: a loop that waits on it alone would wait forever, and so would
/// whoever joins its thread. The loop reports each period the device moved (`progressed`), waits no longer than
/// `waitDeadline` says, and gives up with a "stalled" error once `isStalled`.
///
/// Pure: every reading of the clock is the caller's (testable in virtual time). Real-time safe.
struct DeviceWatchdog: Sendable {
    /// A device silent for this long has stalled.
    let limitNanos: UInt64
    /// The longest single wait: a stop request is seen within this time even on a silent device.
    let recheckNanos: UInt64
    private var lastProgressNanos: UInt64

    /// The watch starts as if the device had just moved at `nowNanos`.
    init(limitNanos: UInt64, recheckNanos: UInt64 = 100_000_000, nowNanos: UInt64) {
        precondition(limitNanos > 0 && recheckNanos > 0, "DeviceWatchdog: limits must be positive")
        self.limitNanos = limitNanos
        self.recheckNanos = recheckNanos
        lastProgressNanos = nowNanos
    }

    /// The stall limit for a device whose buffer lasts `bufferNanos`: eight buffers, and never under `floorNanos`
    /// (scheduling hiccups and a sound server's own start-up are far shorter; a dead server never comes back).
    static func limit(bufferNanos: UInt64, floorNanos: UInt64 = 4_000_000_000) -> UInt64 {
        max(floorNanos, bufferNanos &* 8)
    }

    /// The device moved (a period was read or written) at `nowNanos`.
    mutating func progressed(nowNanos: UInt64) {
        lastProgressNanos = max(lastProgressNanos, nowNanos)
    }

    /// Whether the device has not moved for longer than the limit as of `nowNanos`.
    func isStalled(nowNanos: UInt64) -> Bool {
        nowNanos > lastProgressNanos && nowNanos - lastProgressNanos > limitNanos
    }

    /// The latest a wait that starts at `nowNanos` may end: `wanted` (nil: whenever the device wakes) capped at one
    /// recheck and at the moment the device would count as stalled.
    func waitDeadline(nowNanos: UInt64, wanted: UInt64?) -> UInt64 {
        let stallAt = lastProgressNanos &+ limitNanos &+ 1
        return min(wanted ?? .max, nowNanos &+ recheckNanos, max(stallAt, nowNanos))
    }

    /// The time a wait that starts at `nowNanos` may take, in whole milliseconds (at least 1), for calls that take
    /// milliseconds (`snd_pcm_wait`).
    func waitMilliseconds(nowNanos: UInt64) -> Int32 {
        let span = waitDeadline(nowNanos: nowNanos, wanted: nil) - nowNanos
        return Int32(clamping: max(1, (span + 999_999) / 1_000_000))
    }
}
