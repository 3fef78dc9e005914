import Synchronization

/// How a device loop ended on its own: recorded on the real-time thread (atomics only), read from any other thread as
/// the `ALSAError` that names the call and says what happened — an ALSA failure, or a stall (`DeviceWatchdog`).
/// It also holds the loops' xrun recovery, where most failures are decided.
final class DeviceFault: Sendable {
    /// The calls a device loop makes, as errors name them.
    enum Call: Int, Sendable {
        case readi, writei, recover, avail, wait, poll, start

        var name: String {
            switch self {
            case .readi: "snd_pcm_readi"
            case .writei: "snd_pcm_writei"
            case .recover: "snd_pcm_recover"
            case .avail: "snd_pcm_avail"
            case .wait: "snd_pcm_wait"
            case .poll: "ppoll"
            case .start: "snd_pcm_start"
            }
        }
    }

    /// How long the device may not move before the loop ends with a stall.
    let stallLimitNanos: UInt64
    /// The negative code that ended the loop (0: none; `stalledCode`: the device stopped moving).
    private let code = Atomic<Int>(0)
    /// The `Call` that returned it.
    private let call = Atomic<Int>(0)
    /// The code that stands for a stall (no call returns it).
    private static let stalledCode = Int.min

    /// The fault record of a loop on `handle`, whose stall limit follows from the device's buffer
    /// (`DeviceWatchdog.limit`).
    init(handle: PCMHandle) {
        stallLimitNanos = DeviceWatchdog.limit(bufferNanos: handle.bufferNanos)
    }

    /// Records the fatal `code` that `call` returned. Real-time safe.
    func record(_ code: Int, from call: Call) {
        self.call.store(call.rawValue, ordering: .relaxed)
        self.code.store(code, ordering: .releasing)
    }

    /// Records that the device did not move for `stallLimitNanos` while the loop waited in `call`. Real-time safe.
    func recordStall(in call: Call) {
        record(Self.stalledCode, from: call)
    }

    /// Handles the negative `code` that `call` returned: an xrun (or suspend) is recovered with `snd_pcm_recover` and
    /// counted in `counters.xruns`; anything else, or a recovery that fails, is recorded. Returns whether the loop may
    /// go on. Real-time safe.
    func recover(_ handle: PCMHandle, from code: Int, returnedBy call: Call, counters: AudioCounters) -> Bool {
        guard PCMHandle.isXrun(code) else { record(code, from: call); return false }
        let recovered = handle.recover(from: code)
        guard recovered >= 0 else { record(Int(recovered), from: .recover); return false }
        counters.xruns.wrappingAdd(1, ordering: .relaxed)
        return true
    }

    /// The error that ended the loop, if one did.
    func error(for handle: PCMHandle) -> ALSAError? {
        let code = code.load(ordering: .acquiring)
        guard code != 0 else { return nil }
        // Only `record` stores it, always from a `Call`.
        guard let call = Call(rawValue: call.load(ordering: .relaxed))?.name else { preconditionFailure("DeviceFault: unknown call") }
        if code == Self.stalledCode { return handle.stallError(call: call, limitNanos: stallLimitNanos) }
        return handle.error(call: call, code: Int32(truncatingIfNeeded: code))
    }
}
