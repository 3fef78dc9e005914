// The one file in MeshAudio that talks to ALSA (CALSA). Everything else uses `PCMHandle` and `ALSAError`.
import CALSA
#if canImport(Glibc)
import Glibc
#endif
import MeshPOSIX

/// A failed ALSA call: which call, on which device, and ALSA's own words for it (`snd_strerror`).
public struct ALSAError: Error, Equatable, Sendable, CustomStringConvertible {
    /// What went wrong, coarsely, so callers can react without parsing text.
    public enum Kind: Sendable, Equatable {
        /// The device name does not resolve to a PCM (or the device is absent).
        case deviceNotFound
        /// The device refuses the access mode, sample format, rate or channel count asked for.
        case formatRefused
        /// The device stopped moving: no period for seconds, and no error either (its sound server died or hangs).
        case stalled
        /// Another client holds the device, which takes one at a time (`snd_pcm_open`: EBUSY).
        case busy
        /// Any other failure.
        case failed
    }

    /// What went wrong, for the caller to act on (the message says it in words).
    public var kind: Kind
    /// The device name as the caller gave it (or the `plug:` name it was re-opened as).
    public var device: String
    /// The ALSA function that failed, e.g. `snd_pcm_open`.
    public var call: String
    /// The negative errno ALSA returned.
    public var code: Int32
    /// `snd_strerror(code)`.
    public var message: String
    /// What the user can do about it, when we know.
    public var hint: String?
    /// What alsa-lib itself said meanwhile ("Unknown PCM nosuch"): captured, never printed raw.
    public var libraryMessages: [String] = []

    public var description: String {
        var text = kind == .stalled ? "ALSA device '\(device)' \(message)" : "ALSA device '\(device)': \(call) failed: \(message)"
        if !libraryMessages.isEmpty { text += " (alsa-lib: \(libraryMessages.joined(separator: "; ")))" }
        if let hint { text += " — \(hint)" }
        return text
    }
}

/// alsa-lib's own messages: routed (once, for the process) away from stderr into CALSA's ring, and read back into
/// the `ALSAError` of the call that caused them.
enum ALSALibraryMessages {
    private static let installed: Bool = {
        pm_alsa_capture_messages()
        return true
    }()

    /// A mark to read messages from: everything alsa-lib says after this.
    static func mark() -> UInt32 {
        _ = installed
        return pm_alsa_message_total()
    }

    /// The messages since `mark` (at most the ring's size, oldest first), each trimmed.
    static func since(_ mark: UInt32) -> [String] {
        let total = pm_alsa_message_total()
        let count = min(total &- mark, UInt32(PM_ALSA_MESSAGE_SLOTS))
        return (0..<count).compactMap { i in
            guard let text = pm_alsa_message(total &- count &+ i) else { return nil }
            let line = String(cString: text)
            let trimmed = line.drop { $0.isWhitespace }.reversed().drop { $0.isWhitespace }.reversed()
            return trimmed.isEmpty ? nil : String(trimmed)
        }
    }
}

/// Direction of a PCM.
enum PCMStream: Sendable {
    case capture, playback

    var alsaValue: snd_pcm_stream_t { self == .capture ? SND_PCM_STREAM_CAPTURE : SND_PCM_STREAM_PLAYBACK }
    var noun: String { self == .capture ? "capture" : "playback" }
    /// The command that lists devices for this direction.
    var listCommand: String { self == .capture ? "arecord -L" : "aplay -L" }
}

/// The hardware and software parameters to open a PCM with.
struct PCMConfiguration: Sendable {
    var format: AudioFormat
    var periodFrames: Int
    var bufferFrames: Int
    /// Playback: frames queued before the device starts. Capture ignores it (the loop starts the device).
    var startThresholdFrames: Int?
}

/// An open, configured ALSA PCM (interleaved Float32LE), closed when released.
///
/// Configuration methods throw `ALSAError`. The I/O methods used by real-time loops (`readFrames`,
/// `writeFrames`, `recover`, `delayFrames`) return raw ALSA codes instead, so they never allocate.
final class PCMHandle: @unchecked Sendable {  // Used by one thread at a time: the owner to configure, then the audio loop.
    private let pcm: OpaquePointer
    /// The name actually opened: the caller's, or `plug:…` when ALSA conversion was needed.
    let deviceName: String
    /// The name the caller asked for.
    let requestedName: String
    let stream: PCMStream
    let format: AudioFormat
    /// Frames per period, as granted by the device.
    let periodFrames: Int
    /// Frames in the device buffer, as granted by the device.
    let bufferFrames: Int
    /// Start threshold in frames, as set.
    let startThresholdFrames: Int
    /// True when the device was re-opened through `plug:` because it refused the format natively.
    var usesPlugConversion: Bool { deviceName != requestedName }

    private init(pcm: OpaquePointer, deviceName: String, requestedName: String, stream: PCMStream,
                 format: AudioFormat, periodFrames: Int, bufferFrames: Int, startThresholdFrames: Int) {
        self.pcm = pcm
        self.deviceName = deviceName
        self.requestedName = requestedName
        self.stream = stream
        self.format = format
        self.periodFrames = periodFrames
        self.bufferFrames = bufferFrames
        self.startThresholdFrames = startThresholdFrames
    }

    deinit {
        snd_pcm_close(pcm)
    }

    // MARK: Opening

    /// Opens `device` for `stream` with `configuration`. If the device refuses Float32LE, the rate or the channel
    /// count, it is re-opened once as `plug:<device>` (`usesPlugConversion`; the owner's app can say so — a library
    /// writes nothing to stderr itself).
    static func open(device: String, stream: PCMStream, configuration: PCMConfiguration) throws(ALSAError) -> PCMHandle {
        let mark = ALSALibraryMessages.mark()
        do throws(ALSAError) {
            do throws(ALSAError) {
                return try openConfigured(name: device, requestedName: device, stream: stream, configuration: configuration)
            } catch where error.kind == .formatRefused {
                guard let plugName = plugName(for: device) else { throw error }
                return try openConfigured(name: plugName, requestedName: device, stream: stream, configuration: configuration)
            }
        } catch {
            var e = error
            e.libraryMessages = ALSALibraryMessages.since(mark)
            throw e
        }
    }

    /// The `plug:` wrapper of `device`, or `nil` when it already is a plug device.
    static func plugName(for device: String) -> String? {
        if device.hasPrefix("plug:") || device.hasPrefix("plughw:") || device == "plug" { return nil }
        if device.contains(":") || device.contains(",") {
            // Quote so ALSA hands the whole name, arguments included, to plug's SLAVE argument.
            return device.contains("'") ? "plug:\"\(device)\"" : "plug:'\(device)'"
        }
        return "plug:\(device)"
    }

    private static func openConfigured(name: String, requestedName: String, stream: PCMStream,
                                       configuration: PCMConfiguration) throws(ALSAError) -> PCMHandle {
        var opened: OpaquePointer?
        // Non-blocking open: a busy or absent device fails at once instead of hanging.
        var result = snd_pcm_open(&opened, name, stream.alsaValue, SND_PCM_NONBLOCK)
        while result == -EINTR { result = snd_pcm_open(&opened, name, stream.alsaValue, SND_PCM_NONBLOCK) }
        guard result >= 0, let pcm = opened else {
            if result == -EBUSY {
                throw makeError(.busy, device: name, call: "snd_pcm_open", code: result,
                                hint: "another program holds it (a device such as hw:0 takes one client at a time; `default`, "
                                    + "dmix or a sound server share one)")
            }
            let missing = result == -ENOENT || result == -ENODEV || result == -ENXIO
            throw makeError(missing ? .deviceNotFound : .failed, device: name, call: "snd_pcm_open", code: result,
                            hint: "cannot open it for \(stream.noun); list the available devices with `\(stream.listCommand)` "
                                + "(a JACK or network PCM also needs its server running)")
        }
        do {
            try check(snd_pcm_nonblock(pcm, 0), .failed, device: name, call: "snd_pcm_nonblock")
            let (period, buffer) = try configureHardware(pcm, name: name, configuration: configuration)
            let threshold: Int
            if stream == .playback {
                // By default the device starts once its buffer is full of whole periods: a loop that writes a period
                // at a time (the `Player`'s) can always reach that (a `plug:` rate conversion can grant a buffer that is
                // no multiple of the period).
                let wholePeriods = max(period, buffer / period * period)
                threshold = min(max(configuration.startThresholdFrames ?? wholePeriods, 1), buffer)
            } else {
                threshold = 1
            }
            try configureSoftware(pcm, name: name, periodFrames: period, startThreshold: threshold)
            return PCMHandle(pcm: pcm, deviceName: name, requestedName: requestedName, stream: stream,
                             format: configuration.format, periodFrames: period, bufferFrames: buffer,
                             startThresholdFrames: threshold)
        } catch {
            snd_pcm_close(pcm)
            throw error
        }
    }

    private static func configureHardware(_ pcm: OpaquePointer, name: String,
                                          configuration: PCMConfiguration) throws(ALSAError) -> (period: Int, buffer: Int) {
        var params: OpaquePointer?
        try check(snd_pcm_hw_params_malloc(&params), .failed, device: name, call: "snd_pcm_hw_params_malloc")
        guard let params else { throw makeError(.failed, device: name, call: "snd_pcm_hw_params_malloc", code: -ENOMEM) }
        defer { snd_pcm_hw_params_free(params) }

        let format = configuration.format
        try check(snd_pcm_hw_params_any(pcm, params), .failed, device: name, call: "snd_pcm_hw_params_any")
        try check(snd_pcm_hw_params_set_access(pcm, params, SND_PCM_ACCESS_RW_INTERLEAVED), .formatRefused,
                  device: name, call: "snd_pcm_hw_params_set_access(RW_INTERLEAVED)")
        try check(snd_pcm_hw_params_set_format(pcm, params, SND_PCM_FORMAT_FLOAT_LE), .formatRefused,
                  device: name, call: "snd_pcm_hw_params_set_format(FLOAT_LE)")
        try check(snd_pcm_hw_params_set_channels(pcm, params, UInt32(format.channels)), .formatRefused,
                  device: name, call: "snd_pcm_hw_params_set_channels(\(format.channels))")
        try check(snd_pcm_hw_params_set_rate(pcm, params, UInt32(format.sampleRate), 0), .formatRefused,
                  device: name, call: "snd_pcm_hw_params_set_rate(\(format.sampleRate))")

        var period = snd_pcm_uframes_t(configuration.periodFrames)
        var direction: Int32 = 0
        try check(snd_pcm_hw_params_set_period_size_near(pcm, params, &period, &direction), .failed,
                  device: name, call: "snd_pcm_hw_params_set_period_size_near(\(configuration.periodFrames))")
        var buffer = snd_pcm_uframes_t(max(configuration.bufferFrames, Int(period) * 2))
        try check(snd_pcm_hw_params_set_buffer_size_near(pcm, params, &buffer), .failed,
                  device: name, call: "snd_pcm_hw_params_set_buffer_size_near(\(configuration.bufferFrames))")
        try check(snd_pcm_hw_params(pcm, params), .failed, device: name, call: "snd_pcm_hw_params")

        try check(snd_pcm_hw_params_get_period_size(params, &period, &direction), .failed,
                  device: name, call: "snd_pcm_hw_params_get_period_size")
        try check(snd_pcm_hw_params_get_buffer_size(params, &buffer), .failed,
                  device: name, call: "snd_pcm_hw_params_get_buffer_size")
        return (Int(period), Int(buffer))
    }

    private static func configureSoftware(_ pcm: OpaquePointer, name: String, periodFrames: Int,
                                          startThreshold: Int) throws(ALSAError) {
        var params: OpaquePointer?
        try check(snd_pcm_sw_params_malloc(&params), .failed, device: name, call: "snd_pcm_sw_params_malloc")
        guard let params else { throw makeError(.failed, device: name, call: "snd_pcm_sw_params_malloc", code: -ENOMEM) }
        defer { snd_pcm_sw_params_free(params) }
        try check(snd_pcm_sw_params_current(pcm, params), .failed, device: name, call: "snd_pcm_sw_params_current")
        try check(snd_pcm_sw_params_set_avail_min(pcm, params, snd_pcm_uframes_t(periodFrames)), .failed,
                  device: name, call: "snd_pcm_sw_params_set_avail_min")
        try check(snd_pcm_sw_params_set_start_threshold(pcm, params, snd_pcm_uframes_t(startThreshold)), .failed,
                  device: name, call: "snd_pcm_sw_params_set_start_threshold")
        try check(snd_pcm_sw_params(pcm, params), .failed, device: name, call: "snd_pcm_sw_params")
    }

    // MARK: The error funnel

    /// Every configuration call goes through here: negative → `ALSAError`, `-EINTR` is not expected from these
    /// calls (they do not sleep) and is reported like any other failure.
    private static func check(_ result: Int32, _ kind: ALSAError.Kind, device: String, call: String) throws(ALSAError) {
        if result < 0 { throw makeError(kind, device: device, call: call, code: result) }
    }

    static func makeError(_ kind: ALSAError.Kind, device: String, call: String, code: Int32, hint: String? = nil) -> ALSAError {
        ALSAError(kind: kind, device: device, call: call, code: code, message: String(cString: snd_strerror(code)), hint: hint)
    }

    /// Builds the error for a failure code the audio loop recorded (called off the audio thread).
    func error(call: String, code: Int32) -> ALSAError {
        Self.makeError(.failed, device: deviceName, call: call, code: code)
    }

    /// The error of a device that did not move for `limitNanos` while `call` waited on it.
    func stallError(call: String, limitNanos: UInt64) -> ALSAError {
        let tenths = (limitNanos + 50_000_000) / 100_000_000
        return ALSAError(kind: .stalled, device: deviceName, call: call, code: -ETIMEDOUT,
                         message: "stopped moving: no audio for \(tenths / 10).\(tenths % 10) s",
                         hint: "is its sound server (JACK, PipeWire, PulseAudio) still running? Restart it, then this program")
    }

    /// The time the device's buffer lasts, in nanoseconds.
    var bufferNanos: UInt64 { MonotonicClock.nanos(frames: bufferFrames, sampleRate: format.sampleRate) }

    // MARK: Control (non-real-time)

    /// Starts the device explicitly (capture).
    func start() throws(ALSAError) {
        try Self.check(snd_pcm_start(pcm), .failed, device: deviceName, call: "snd_pcm_start")
    }

    /// Plays out what is queued (playback, if running) and stops; otherwise discards and stops.
    ///
    /// Not `snd_pcm_drain`: that waits for the device to play the queue out, and a device that stopped moving would
    /// hold the caller forever. The queue's own length is waited instead (at most one buffer), then it is dropped.
    func finish() {
        if stream == .playback && snd_pcm_state(pcm) == SND_PCM_STATE_RUNNING, let queued = delayFrames(), queued > 0 {
            let queue = MonotonicClock.nanos(frames: min(queued, bufferFrames), sampleRate: format.sampleRate)
            MonotonicClock.sleep(untilNanos: MonotonicClock.nowNanos() &+ queue)
        }
        snd_pcm_drop(pcm)
    }

    // MARK: Real-time I/O: raw codes, no allocation

    /// `snd_pcm_readi`, retried on `-EINTR`/`-EAGAIN`: frames read (may be short), or a negative error code.
    @inline(__always)
    func readFrames(into buffer: UnsafeMutablePointer<Float>, frames: Int) -> Int {
        while true {
            let result = snd_pcm_readi(pcm, buffer, snd_pcm_uframes_t(frames))
            if result == -Int(EINTR) || result == -Int(EAGAIN) { continue }
            return result
        }
    }

    /// `snd_pcm_writei`, retried on `-EINTR`/`-EAGAIN`: frames written (may be short), or a negative error code.
    @inline(__always)
    func writeFrames(from buffer: UnsafePointer<Float>, frames: Int) -> Int {
        while true {
            let result = snd_pcm_writei(pcm, buffer, snd_pcm_uframes_t(frames))
            if result == -Int(EINTR) || result == -Int(EAGAIN) { continue }
            return result
        }
    }

    /// `snd_pcm_recover` (silent) after an xrun: 0 when the stream is usable again, or the original negative code.
    /// Not for a suspend: there it would wait for the resume in steps of a second, on the real-time thread
    /// (`resume()`).
    @inline(__always)
    func recover(from code: Int) -> Int32 {
        snd_pcm_recover(pcm, Int32(truncatingIfNeeded: code), 1)
    }

    /// One try at resuming a suspended stream (`snd_pcm_resume`, which never waits): 0 when it runs again, `-EAGAIN`
    /// while the device is still waking, another negative code when it cannot resume (then `prepare()`).
    @inline(__always)
    func resume() -> Int32 {
        snd_pcm_resume(pcm)
    }

    /// `snd_pcm_prepare`: the stream starts afresh (a device that cannot resume). 0, or a negative code.
    @inline(__always)
    func prepare() -> Int32 {
        snd_pcm_prepare(pcm)
    }

    /// Whether `code` is a suspend (the system slept, or the device was powered down): `DeviceFault.recover`.
    @inline(__always)
    static func isSuspend(_ code: Int) -> Bool {
        code == -Int(ESTRPIPE)
    }

    /// Whether `code` is an under/overrun or suspend that `recover` handles (and that counts as an xrun).
    @inline(__always)
    static func isXrun(_ code: Int) -> Bool {
        code == -Int(EPIPE) || code == -Int(ESTRPIPE)
    }

    /// `snd_pcm_avail` (synchronized with the device): frames that can be written (playback) or read (capture) now,
    /// or a negative error code (`-EPIPE` after an xrun).
    @inline(__always)
    func availableFrames() -> Int {
        snd_pcm_avail(pcm)
    }

    /// Starts a device that would otherwise never start (`snd_pcm_start`). Returns the negative error code, or 0.
    /// - A playback device that is not started yet but has less room than `periodFrames` can never reach its start
    ///   threshold by whole periods.
    /// - A capture device that is prepared but not started (after `recover`) never fills, and its caller waits
    ///   before it reads.
    @inline(__always)
    func startIfStuck(periodFrames: Int) -> Int32 {
        guard snd_pcm_state(pcm) == SND_PCM_STATE_PREPARED else { return 0 }
        if stream == .playback && snd_pcm_avail_update(pcm) >= periodFrames { return 0 }
        return snd_pcm_start(pcm)
    }

    /// `snd_pcm_wait`: waits until a period can be read (capture) or written (playback), at most `milliseconds`.
    /// Returns 1 when ready, 0 on timeout, or a negative error code (`-EPIPE` after an xrun). `-EINTR` is retried.
    @inline(__always)
    func waitForPeriod(milliseconds: Int32) -> Int32 {
        while true {
            let result = snd_pcm_wait(pcm, milliseconds)
            if result != -EINTR { return result }
        }
    }

    /// How many poll descriptors the PCM has.
    var pollDescriptorCount: Int { max(0, Int(snd_pcm_poll_descriptors_count(pcm))) }

    /// Fills `slots` (at most `space`) with the PCM's poll descriptors; returns how many.
    @inline(__always)
    func fillPollDescriptors(_ slots: UnsafeMutablePointer<pollfd>, space: Int) -> Int {
        max(0, Int(snd_pcm_poll_descriptors(pcm, slots, UInt32(space))))
    }

    /// Translates what `poll` returned on the PCM's descriptors (`count` of them at `slots`) into the PCM's own events
    /// (`POLLOUT` for playback room, `POLLERR` for a device in error). A plugin may consume its wake-up here.
    @inline(__always)
    func pollEvents(_ slots: UnsafeMutablePointer<pollfd>, count: Int) -> UInt16 {
        var events: UInt16 = 0
        return snd_pcm_poll_descriptors_revents(pcm, slots, UInt32(count), &events) < 0 ? UInt16(POLLERR) : events
    }

    /// `snd_pcm_delay`: frames between the application pointer and the device's converter, or `nil` on error.
    @inline(__always)
    func delayFrames() -> Int? {
        var delay: snd_pcm_sframes_t = 0
        return snd_pcm_delay(pcm, &delay) < 0 ? nil : delay
    }
}
