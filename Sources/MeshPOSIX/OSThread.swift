#if canImport(Glibc)
import Glibc
#endif

import Synchronization

/// A dedicated POSIX thread (an audio loop, an I/O loop, a helper), named for `top -H` and debuggers, scheduled
/// `SCHED_FIFO` when asked and when the system allows it.
///
/// If the process may not use real-time scheduling (`EPERM`), the thread is started with normal scheduling;
/// `isRealtime` tells which happened and `realtimeRefusal` why (its owner says so to the user). The body runs once;
/// `join()` waits for it to return.
package final class OSThread: Sendable {
    /// How the thread is scheduled.
    package enum Scheduling: Sendable, Equatable {
        /// `SCHED_FIFO` at `priority` (clamped to the system's range), or normal scheduling where that is refused.
        case fifo(priority: Int32)
        /// The default time-sharing scheduler (a loop that feeds the network, not a device).
        case normal

        /// `SCHED_FIFO` at the audio loops' priority.
        package static let realtime = Scheduling.fifo(priority: 5)
    }

    /// Longest OS thread name Linux keeps, in bytes (16 with the terminating NUL).
    package static let maximumNameBytes = 15

    /// The OS name of the thread (`name` cut to `maximumNameBytes` bytes of UTF-8).
    package let name: String
    /// Whether the thread got `SCHED_FIFO`.
    package let isRealtime: Bool
    /// The error `pthread_create` gave for `SCHED_FIFO` (then the thread runs with normal scheduling), or 0 when it
    /// got it or did not ask.
    package let realtimeRefusal: Int32
    private let thread: pthread_t
    /// Set by the first `join`, the one that calls `pthread_join`.
    private let joined = Atomic<Bool>(false)
    /// Set once `pthread_join` has returned: the thread has ended.
    private let ended = Atomic<Bool>(false)
    /// Wakes the other joiners once the thread has ended (each passes it on to the next).
    private let endedSignal = WakeSignal()

    /// Boxes the body and the thread's name so they can cross the C thread-start boundary.
    private final class Body {
        let run: @Sendable () -> Void
        let name: String
        init(_ run: @escaping @Sendable () -> Void, name: String) {
            self.run = run
            self.name = name
        }
    }

    /// Error starting a thread (`pthread_create` failed even without real-time scheduling).
    package struct StartError: Error, CustomStringConvertible {
        package let name: String
        package let code: Int32
        package var description: String { "cannot start thread \(name): \(String(cString: strerror(code)))" }
    }

    /// Starts `body` on a new thread named `name` (cut to 15 bytes), scheduled as `scheduling` asks.
    package init(name: String, scheduling: Scheduling = .realtime, body: @escaping @Sendable () -> Void) throws {
        let osName = Self.osName(name)
        self.name = osName
        let context = Unmanaged.passRetained(Body(body, name: osName)).toOpaque()
        var tid = pthread_t()
        var realtime = false
        var refusal: Int32 = 0
        var result: Int32 = -1

        if case .fifo(let priority) = scheduling {
            var attr = pthread_attr_t()
            pthread_attr_init(&attr)
            defer { pthread_attr_destroy(&attr) }
            pthread_attr_setinheritsched(&attr, Int32(PTHREAD_EXPLICIT_SCHED))
            pthread_attr_setschedpolicy(&attr, SCHED_FIFO)
            let maxPriority = sched_get_priority_max(SCHED_FIFO)
            var param = sched_param(sched_priority: min(max(priority, 1), maxPriority))
            pthread_attr_setschedparam(&attr, &param)
            result = pthread_create(&tid, &attr, osThreadEntry, context)
            realtime = result == 0
            refusal = result
        }
        if result != 0 {
            result = pthread_create(&tid, nil, osThreadEntry, context)
        }
        guard result == 0 else {
            Unmanaged<Body>.fromOpaque(context).release()
            throw StartError(name: name, code: result)
        }
        // Named twice: by the thread before its body runs, and here, so the name is also in place for everyone
        // else when `init` returns (the new thread may not have been scheduled yet).
        ThreadName.set(tid, osName)
        self.thread = tid
        self.isRealtime = realtime
        self.realtimeRefusal = refusal
    }

    /// Starts `body` on a detached thread with normal scheduling (a reader that lives as long as the process).
    /// Traps when the system cannot create a thread: the process is out of resources.
    package static func detach(name: String, body: @escaping @Sendable () -> Void) {
        do {
            _ = try OSThread(name: name, scheduling: .normal, body: body) // released at once: deinit detaches it
        } catch {
            fatalError("\(error)")
        }
    }

    /// `name` cut to at most `maximumNameBytes` bytes, on a character boundary.
    package static func osName(_ name: String) -> String {
        var cut = Substring(name)
        while cut.utf8.count > maximumNameBytes { cut = cut.dropLast() }
        return String(cut)
    }

    /// Waits for the body to return. Safe to call more than once and from several threads at once: every caller
    /// returns only after the thread has ended. On the thread itself, which cannot wait for its own end, it returns
    /// at once.
    package func join() {
        guard !isCurrent else { return }
        if !joined.exchange(true, ordering: .acquiringAndReleasing) {
            pthread_join(thread, nil)
            ended.store(true, ordering: .releasing)
            endedSignal.signal()
        } else {
            // Another caller is joining: wait for it, then wake the next waiter.
            while !ended.load(ordering: .acquiring) { endedSignal.wait() }
            endedSignal.signal()
        }
    }

    /// Whether the caller is this thread.
    private var isCurrent: Bool { pthread_equal(pthread_self(), thread) != 0 }

    deinit {
        // An un-joined thread would leak its resources; the owners always stop and join before releasing us.
        if !joined.load(ordering: .acquiring) { pthread_detach(thread) }
    }

    fileprivate static func run(_ context: UnsafeMutableRawPointer) {
        let body = Unmanaged<Body>.fromOpaque(context).takeRetainedValue()
        ThreadName.setCurrent(body.name)
        body.run()
    }
}

/// The C entry point of every `OSThread`.
private func osThreadEntry(_ context: UnsafeMutableRawPointer?) -> UnsafeMutableRawPointer? {
    if let context { OSThread.run(context) }
    return nil
}
