import MeshPOSIX
import Synchronization

/// The one-shot life of a stage that runs a thread of its own — idle → running → stopped — shared by the devices
/// (`Recorder`, `Player`), their file siblings (`PacedSource`, `WAVFileSink`) and the relay's send loop.
///
/// The thread's loop runs while `isRunning`. `start` creates the thread while holding the lock, so a concurrent
/// `stop` can never miss it; that (and the caller's `prepare`) is all that happens under the lock. `stop` decides
/// under the lock, then clears `isRunning`, wakes the thread and joins it after. The stopped stage keeps its
/// thread, so that every `stop`, however many run at once, joins it and returns only once it has ended.
public final class StageLifecycle: Sendable {
    /// The stage as errors name it, e.g. `Recorder(default)`.
    public let stage: String
    /// The OS name of the stage's thread, e.g. `pm-capture` (at most 15 bytes).
    public let threadName: String
    private let scheduling: OSThread.Scheduling
    private let running = Atomic<Bool>(false)
    private let state = Mutex<State>(.idle)

    private enum State {
        case idle
        case running(OSThread)
        /// The thread it ran, if any: every `stop` joins it.
        case stopped(OSThread?)
    }

    /// A stage not started yet.
    package init(stage: String, threadName: String, scheduling: OSThread.Scheduling = .realtime) {
        self.stage = stage
        self.threadName = threadName
        self.scheduling = scheduling
    }

    /// Whether the thread's loop should go on: set by `start`, cleared by `stop`. Real-time safe.
    @inline(__always)
    public var isRunning: Bool { running.load(ordering: .acquiring) }

    /// Runs `prepare` (starting a device, say), then starts the thread running `body`. Does nothing while running;
    /// throws `AudioStageError.restartNotSupported` once stopped (stages run once).
    public func start(prepare: () throws -> Void = {}, body: @escaping @Sendable () -> Void) throws {
        try state.withLock { state throws in
            switch state {
            case .running: return
            case .stopped: throw AudioStageError.restartNotSupported(stage: stage)
            case .idle:
                try prepare()
                running.store(true, ordering: .releasing)
                do {
                    state = .running(try OSThread(name: threadName, scheduling: scheduling, body: body))
                } catch {
                    running.store(false, ordering: .releasing)
                    throw error
                }
            }
        }
    }

    /// Stops the stage for good: clears `isRunning`, calls `wake` (to unblock a thread waiting on something other
    /// than the flag), then joins the thread. Safe to call more than once, from several threads at once, and
    /// before `start`: every call returns only once the thread has ended (but a call on the stage's own thread,
    /// which cannot wait for itself). Returns whether this call stopped a running thread.
    @discardableResult
    public func stop(wake: () -> Void = {}) -> Bool {
        let (thread, wasRunning) = state.withLock { state -> (OSThread?, Bool) in
            switch state {
            case .idle:
                state = .stopped(nil)
                return (nil, false)
            case .running(let thread):
                state = .stopped(thread)
                return (thread, true)
            case .stopped(let thread):
                return (thread, false)
            }
        }
        running.store(false, ordering: .releasing)
        wake()
        thread?.join()
        return wasRunning
    }

    /// Whether the thread got `SCHED_FIFO` (false unless running).
    public var isRealtime: Bool {
        state.withLock { if case .running(let thread) = $0 { thread.isRealtime } else { false } }
    }

    /// What to tell the user when the running thread asked for `SCHED_FIFO` and was refused; nil otherwise.
    public var schedulingNote: String? {
        let refusal: Int32 = state.withLock { state in
            if case .running(let thread) = state { return thread.realtimeRefusal }
            return 0
        }
        guard refusal != 0 else { return nil }
        return "\(threadName) runs without real-time priority (SCHED_FIFO: \(Sys.errorText(refusal))): audio may break up "
            + "when the machine is busy; allow it with an rtprio limit (e.g. `@audio - rtprio 95` in "
            + "/etc/security/limits.d/ and the user in group audio) or CAP_SYS_NICE"
    }
}
