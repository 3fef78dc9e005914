import MeshPOSIX
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

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

    /// Handles the negative `code` that `call` returned: an xrun is recovered with `snd_pcm_recover` and counted in
    /// `counters.xruns`; a suspend is resumed a try at a time (`resumeStep`), and counted there once it runs again;
    /// anything else, or a recovery that fails, is recorded. Returns whether the loop may go on. Real-time safe: the
    /// longest wait is one `suspendNapNanos` nap, after which the loop sees `stop()` and its watchdog as usual.
    func recover(_ handle: PCMHandle, from code: Int, returnedBy call: Call, counters: AudioCounters) -> Bool {
        guard PCMHandle.isXrun(code) else { record(code, from: call); return false }
        guard PCMHandle.isSuspend(code) else {
            let recovered = handle.recover(from: code)
            guard recovered >= 0 else { record(Int(recovered), from: .recover); return false }
            counters.xruns.wrappingAdd(1, ordering: .relaxed)
            return true
        }
        let now = MonotonicClock.nowNanos()
        let since = suspendedSince.load(ordering: .relaxed)
        switch Self.resumeStep(handle.resume(), suspendedSince: since == 0 ? now : since, nowNanos: now,
                               limitNanos: stallLimitNanos) {
        case .resumed:
            suspendedSince.store(0, ordering: .relaxed)
            counters.xruns.wrappingAdd(1, ordering: .relaxed)
            return true
        case .napAndRetry:
            if since == 0 { suspendedSince.store(now, ordering: .relaxed) }
            MonotonicClock.sleep(untilNanos: now &+ Self.suspendNapNanos)
            return true
        case .prepare:
            suspendedSince.store(0, ordering: .relaxed)
            let prepared = handle.prepare()
            guard prepared >= 0 else { record(Int(prepared), from: .recover); return false }
            counters.xruns.wrappingAdd(1, ordering: .relaxed)
            return true
        case .stalled:
            suspendedSince.store(0, ordering: .relaxed)
            recordStall(in: .recover)
            return false
        }
    }

    /// When the current suspend began (0: not suspended).
    private let suspendedSince = Atomic<UInt64>(0)

    /// How long the loop naps between tries at resuming a suspended device.
    static let suspendNapNanos: UInt64 = 10_000_000

    /// What a suspended device's loop does after one `snd_pcm_resume` that returned `code`.
    enum ResumeStep: Equatable {
        /// It runs again.
        case resumed
        /// Still waking: nap `suspendNapNanos`, then go round the loop (which sees `stop()`) and try again.
        case napAndRetry
        /// It cannot resume (the driver has no resume): start it afresh with `snd_pcm_prepare`.
        case prepare
        /// Still waking after the stall limit: the loop ends with a stall, as for a device that stopped moving.
        case stalled
    }

    /// The decision after a resume, pure: `suspendedSince` is when the suspend was first seen.
    static func resumeStep(_ code: Int32, suspendedSince: UInt64, nowNanos: UInt64, limitNanos: UInt64) -> ResumeStep {
        if code >= 0 { return .resumed }
        guard code == -EAGAIN else { return .prepare }
        return nowNanos > suspendedSince && nowNanos - suspendedSince > limitNanos ? .stalled : .napAndRetry
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
