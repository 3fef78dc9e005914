import Glibc
import MeshPOSIX
import Synchronization

/// Clip capture on the host, the remote shutter's analogue: keeps the last `prerollSeconds` of the capture and, when
/// asked, writes the pre-roll plus what follows (until `finish`, or `maximumSeconds` after the press) to a Float32
/// WAV file in `directory`, named `<name>-<UTC time>.wav`. The audio is the capture's own, at full quality, never
/// what went over the network.
///
/// The send thread hands every captured chunk to `tap` (a lock-free SPSC ring: it never waits). A thread of the
/// recorder's own (`pm-clip`) keeps the pre-roll and writes the file. `open` creates the file on the caller's
/// thread, so a directory that cannot be written is reported to the caller at once; how a clip ends is reported to
/// `onFinished`, on the clip thread.
///
/// The caller numbers its clips (`open(clip:prerollOnly:)`), and `finish` and `discard` name the clip they are for:
/// the clip thread acts on the clip being recorded only if it is that one, since it may have ended by itself (reached
/// its length) meanwhile. Every clip opened gets exactly one outcome, carrying its number: saved, failed or
/// discarded.
public final class ClipRecorder: Sendable {
    /// What a clip came to; `clip` is the number it was opened with.
    public enum Outcome: Sendable, Equatable {
        /// Saved under this file name (in the directory).
        case saved(clip: UInt64, name: String)
        /// Not saved, for this reason (the partial file is removed).
        case failed(clip: UInt64, reason: String)
        /// Thrown away, as `discard` asked, before it ended by itself (its file is removed).
        case discarded(clip: UInt64)
    }

    /// Where and how long.
    public struct Configuration: Sendable, Equatable {
        /// The directory clips are written to.
        public var directory: String
        /// Seconds of capture kept before the press.
        public var prerollSeconds: Double = 10
        /// Longest part after the press, seconds.
        public var maximumSeconds: Double = 10
        /// The first part of each file name (the host's name; unsafe characters become `_`).
        public var name: String
        /// Space a clip must leave free on the directory's filesystem, beyond its own largest size (default
        /// 256 MiB): players asking for clip after clip cannot fill the disk.
        public var reservedBytes: UInt64 = 256 << 20

        public init(directory: String, name: String, prerollSeconds: Double = 10, maximumSeconds: Double = 10) {
            self.directory = directory
            self.name = name
            self.prerollSeconds = prerollSeconds
            self.maximumSeconds = maximumSeconds
        }
    }

    public let configuration: Configuration
    public let format: AudioFormat
    private let ring: SampleRing
    private let worker: ClipWorker
    private let lifecycle: StageLifecycle

    /// Checks that `directory` is a directory (it need not be writable yet: a clip that cannot be written fails
    /// then, with the reason). Throws `ClipError` otherwise.
    public init(configuration: Configuration, format: AudioFormat,
                onFinished: @escaping @Sendable (Outcome) -> Void) throws {
        try format.validate()
        var st = stat()
        guard stat(configuration.directory, &st) == 0, st.st_mode & S_IFMT == S_IFDIR else {
            throw ClipError("clip directory \(configuration.directory) does not exist (create it, or name another with --clips)")
        }
        self.configuration = configuration
        self.format = format
        // A second of slack beyond what the clip thread drains every 20 ms.
        ring = SampleRing(minimumCapacity: format.sampleRate * format.channels)
        let lifecycle = StageLifecycle(stage: "ClipRecorder(\(configuration.directory))", threadName: "pm-clip",
                                       scheduling: .normal)
        self.lifecycle = lifecycle
        worker = ClipWorker(configuration: configuration, format: format, ring: ring, lifecycle: lifecycle,
                            onFinished: onFinished)
    }

    /// Held by `stop()`: the worker's state is the clip thread's, or, once it has ended, one stopper's at a time.
    private let stopping = Mutex(())

    deinit { stop() }

    /// Starts the clip thread (the pre-roll fills from now on).
    public func start() throws {
        let worker = self.worker
        try lifecycle.start { worker.run() }
    }

    /// Stops the clip thread; a clip being recorded is saved first. Concurrent calls are taken one at a time: the
    /// first saves the clip, the others find nothing left to do.
    public func stop() {
        let worker = self.worker
        // The outcomes are reported after the lock: a callback never runs under it.
        let outcomes = stopping.withLock { _ in
            lifecycle.stop(wake: { worker.wake.signal() })
            return worker.finishOnStop()
        }
        for outcome in outcomes { worker.onFinished(outcome) }
    }

    /// The send thread: one captured chunk (interleaved). Never blocks; what does not fit is dropped and counted.
    public func tap(_ samples: UnsafeBufferPointer<Float>) {
        // Whole frames only: the ring's capacity is a power of two, and a partial frame written into its last
        // places would shift the channels of every frame after it.
        let room = ring.availableToWrite / format.channels * format.channels
        let fits = min(samples.count, room)
        let written = fits > 0 ? ring.write(UnsafeBufferPointer(rebasing: samples[..<fits])) : 0
        if written < samples.count { worker.dropped.add(UInt64(samples.count - written), ordering: .relaxed) }
    }

    /// Samples the clip thread could not take in time.
    public var droppedSamples: UInt64 { worker.dropped.load(ordering: .relaxed) }

    /// Creates the file of clip number `clip` now and has the clip thread write the pre-roll into it, then the live
    /// capture (or, with `prerollOnly`, close it at once). Returns the file's name; throws `ClipError` with the reason
    /// when it cannot be created (then no outcome follows).
    public func open(clip: UInt64, prerollOnly: Bool) throws -> String {
        let (descriptor, path, name) = try reserveName()
        do { try checkFreeSpace() } catch {
            close(descriptor)
            unlink(path)
            throw error
        }
        let file: SoundFile
        do {
            file = try SoundFile.create(descriptor: descriptor, path: path, format: format, encoding: .float32)
        } catch {
            unlink(path)
            throw ClipError("cannot write \(name): \(error.message)")
        }
        worker.command(.open(file, path: path, name: name, clip: clip, prerollOnly: prerollOnly))
        return name
    }

    /// Finishes clip `clip` and saves it, if it is still being recorded (the outcome goes to `onFinished`); a clip
    /// that ended by itself meanwhile was reported already.
    public func finish(clip: UInt64) { worker.command(.finish(clip: clip)) }

    /// Throws clip `clip` away, if it is still being recorded: its file is removed and `.discarded` is reported. A
    /// clip that ended by itself meanwhile (saved at its length, or failed) is not touched: its outcome was reported.
    public func discard(clip: UInt64) { worker.command(.discard(clip: clip)) }

    /// The largest a clip's file can grow: the pre-roll and the part after the press, Float32, and a header.
    var largestClipBytes: UInt64 {
        let seconds = configuration.prerollSeconds + configuration.maximumSeconds
        return UInt64(max(0, seconds) * Double(format.sampleRate)) * UInt64(format.channels) * 4 + 4096
    }

    /// Throws unless the directory's filesystem has room for the largest clip and `reservedBytes` besides.
    private func checkFreeSpace() throws {
        let free: UInt64
        do { free = try FileSystem.availableBytes(at: configuration.directory) } catch {
            throw ClipError("cannot check the free space in \(configuration.directory): \(error.description)")
        }
        let needed = largestClipBytes.addingReportingOverflow(configuration.reservedBytes)
        guard !needed.overflow, free >= needed.partialValue else {
            throw ClipError("not enough free space in \(configuration.directory): \(free >> 20) MiB free; a clip needs up to "
                            + "\(largestClipBytes >> 20) MiB and \(configuration.reservedBytes >> 20) MiB are kept free")
        }
    }

    /// `<name>-<YYYYMMDD-HHMMSS>.wav`, created exclusively (`-2`, `-3`… when taken): a clip never overwrites one, and
    /// never follows a link someone put in its place. Mode 0600: what a microphone heard is for the host's owner. The
    /// file is written through the descriptor returned, never reopened by name.
    private func reserveName() throws -> (descriptor: Int32, path: String, name: String) {
        let stamp = WallClock.iso8601().filter { $0.isNumber }.prefix(14) // YYYYMMDDHHMMSS
        let base = Self.safeName(configuration.name) + "-" + stamp.prefix(8) + "-" + stamp.dropFirst(8)
        for n in 1...100 {
            let name = base + (n == 1 ? "" : "-\(n)") + ".wav"
            let path = configuration.directory + "/" + name
            let fd = Glibc.open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
            if fd >= 0 { return (fd, path, name) }
            let e = errno
            guard e == EEXIST else {
                throw ClipError("cannot write \(name): \(String(cString: strerror(e)).lowercased())")
            }
        }
        throw ClipError("cannot write \(base).wav: 100 clips of that second already exist")
    }

    /// A host name made safe for a file name: letters, digits, `-` and `_` kept, everything else `_` (at most 40).
    static func safeName(_ name: String) -> String {
        let kept = name.unicodeScalars.prefix(40).map { c -> Character in
            c.isASCII && (c.properties.isAlphabetic || (48...57).contains(c.value) || c == "-" || c == "_") ? Character(c) : "_"
        }
        return kept.isEmpty ? "clip" : String(kept)
    }
}

/// A clip that cannot be kept, in words for the player's status line.
public struct ClipError: Error, Sendable, Equatable, CustomStringConvertible {
    public var description: String
    init(_ description: String) { self.description = description }
}

/// What the clip thread owns: the pre-roll ring and the file being written.
final class ClipWorker: @unchecked Sendable { // pre-roll and file: the clip thread's only; commands through the mutex
    enum Command {
        case open(SoundFile, path: String, name: String, clip: UInt64, prerollOnly: Bool)
        case finish(clip: UInt64)
        case discard(clip: UInt64)
    }

    private struct Recording {
        let file: SoundFile
        let path: String
        let name: String
        /// The number the clip was opened with.
        let clip: UInt64
        var framesAfterPress = 0
    }

    let wake = WakeSignal()
    let dropped = Atomic<UInt64>(0)
    private let commands = Mutex<[Command]>([])
    private let ring: SampleRing
    private let lifecycle: StageLifecycle
    private let channels: Int
    private let maximumFramesAfterPress: Int
    let onFinished: @Sendable (ClipRecorder.Outcome) -> Void
    /// The pre-roll: a circular buffer of the latest samples; `prerollFill` of them are valid, the newest just
    /// before `prerollWrite`.
    private var preroll: [Float]
    private var prerollWrite = 0
    private var prerollFill = 0
    private var chunk: [Float]
    private var recording: Recording?

    init(configuration: ClipRecorder.Configuration, format: AudioFormat, ring: SampleRing, lifecycle: StageLifecycle,
         onFinished: @escaping @Sendable (ClipRecorder.Outcome) -> Void) {
        self.ring = ring
        self.lifecycle = lifecycle
        channels = format.channels
        maximumFramesAfterPress = max(0, Int(configuration.maximumSeconds * Double(format.sampleRate)))
        self.onFinished = onFinished
        preroll = [Float](repeating: 0, count: max(1, Int(configuration.prerollSeconds * Double(format.sampleRate))) * format.channels)
        chunk = [Float](repeating: 0, count: ring.capacity)
    }

    func command(_ c: Command) {
        commands.withLock { $0.append(c) }
        wake.signal()
    }

    /// The clip thread: every 20 ms (or when a command comes), commands, then the new capture into the clip and
    /// the pre-roll.
    func run() {
        while lifecycle.isRunning {
            _ = wake.wait(untilNanos: MonotonicClock.nowNanos() &+ 20_000_000)
            step()
        }
    }

    /// After the thread ended (or when it never started): what is left is taken, and a clip being recorded is saved.
    /// Returns the outcomes that brought, for the caller to report (they are not reported here).
    func finishOnStop() -> [ClipRecorder.Outcome] {
        held = []
        defer { held = nil }
        step()
        finishClip()
        return held ?? []
    }

    /// Outcomes held back while `finishOnStop` runs (nil: reported at once, on the clip thread).
    private var held: [ClipRecorder.Outcome]?

    /// Reports `outcome` — or holds it, within `finishOnStop`.
    private func report(_ outcome: ClipRecorder.Outcome) {
        if held != nil { held!.append(outcome) } else { onFinished(outcome) }
    }

    private func step() {
        for c in commands.withLock({ c -> [Command] in defer { c = [] }; return c }) { perform(c) }
        drain()
    }

    private func perform(_ c: Command) {
        switch c {
        case .open(let file, let path, let name, let clip, let prerollOnly):
            finishClip()
            recording = Recording(file: file, path: path, name: name, clip: clip)
            writePreroll()
            if prerollOnly { finishClip() }
        case .finish(let clip):
            guard recording?.clip == clip else { return }
            finishClip()
        case .discard(let clip):
            guard let r = recording, r.clip == clip else { return }
            recording = nil
            try? r.file.close()
            unlink(r.path)
            report(.discarded(clip: clip))
        }
    }

    /// Takes what the send thread captured: into the clip (up to its length), then into the pre-roll.
    private func drain() {
        let n = chunk.withUnsafeMutableBufferPointer { ring.read(into: $0) }
        guard n > 0 else { return }
        let frames = n / channels
        if var r = recording {
            let take = min(frames, maximumFramesAfterPress - r.framesAfterPress)
            if take > 0, !write(chunk, from: 0, frames: take, to: r) { return }
            r.framesAfterPress += take
            recording = r
            if r.framesAfterPress >= maximumFramesAfterPress { finishClip() }
        }
        let capacity = preroll.count
        for i in 0..<(frames * channels) {
            preroll[prerollWrite] = chunk[i]
            prerollWrite = prerollWrite + 1 == capacity ? 0 : prerollWrite + 1
        }
        prerollFill = min(capacity, prerollFill + frames * channels)
    }

    /// The pre-roll, oldest first, into the clip.
    private func writePreroll() {
        guard let r = recording, prerollFill > 0 else { return }
        let capacity = preroll.count
        let oldest = (prerollWrite - prerollFill + capacity) % capacity
        let firstRun = min(prerollFill, capacity - oldest)
        guard write(preroll, from: oldest, frames: firstRun / channels, to: r) else { return }
        let rest = prerollFill - firstRun
        if rest > 0 { _ = write(preroll, from: 0, frames: rest / channels, to: r) }
    }

    /// Writes frames of `buffer` from sample `from`; on a short write the clip fails (and is removed).
    private func write(_ buffer: [Float], from: Int, frames: Int, to r: Recording) -> Bool {
        let written = buffer.withUnsafeBufferPointer { r.file.writeFrames(from: $0.baseAddress! + from, frames: frames) }
        guard written == frames else {
            let reason = r.file.error(operation: "write")?.message ?? "short write (the disk may be full)"
            recording = nil
            try? r.file.close()
            unlink(r.path)
            report(.failed(clip: r.clip, reason: "cannot write \(r.name): \(reason)"))
            return false
        }
        return true
    }

    /// Closes the clip being recorded, if any, and reports it saved (or failed, when closing fails).
    private func finishClip() {
        guard let r = recording else { return }
        recording = nil
        do {
            try r.file.close()
            report(.saved(clip: r.clip, name: r.name))
        } catch {
            unlink(r.path)
            report(.failed(clip: r.clip, reason: "cannot write \(r.name): \(error.message)"))
        }
    }
}
