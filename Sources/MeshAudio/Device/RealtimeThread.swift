#if canImport(Glibc)
import Glibc
#endif
import Synchronization

/// A dedicated POSIX thread for an audio loop, scheduled `SCHED_FIFO` when the system allows it.
///
/// If the process may not use real-time scheduling (`EPERM`), the thread is started with normal scheduling,
/// quietly; `isRealtime` tells which happened. The body runs once; `join()` waits for it to return.
public final class RealtimeThread: Sendable {
    /// Whether the thread got `SCHED_FIFO`.
    public let isRealtime: Bool
    private let thread: pthread_t
    private let joined = Atomic<Bool>(false)

    /// Boxes the body so it can cross the C thread-start boundary.
    private final class Body {
        let run: @Sendable () -> Void
        init(_ run: @escaping @Sendable () -> Void) { self.run = run }
    }

    /// Error starting a thread (`pthread_create` failed even without real-time scheduling).
    public struct StartError: Error, CustomStringConvertible {
        public let name: String
        public let code: Int32
        public var description: String { "cannot start thread \(name): \(String(cString: strerror(code)))" }
    }

    /// Starts `body` on a new thread (`name` labels errors), at `SCHED_FIFO` priority `priority` if allowed.
    public init(name: String, priority: Int32 = 5, body: @escaping @Sendable () -> Void) throws {
        let context = Unmanaged.passRetained(Body(body)).toOpaque()
        var tid = pthread_t()
        var realtime = false

        var attr = pthread_attr_t()
        pthread_attr_init(&attr)
        defer { pthread_attr_destroy(&attr) }
        pthread_attr_setinheritsched(&attr, Int32(PTHREAD_EXPLICIT_SCHED))
        pthread_attr_setschedpolicy(&attr, SCHED_FIFO)
        let maxPriority = sched_get_priority_max(SCHED_FIFO)
        var param = sched_param(sched_priority: min(max(priority, 1), maxPriority))
        pthread_attr_setschedparam(&attr, &param)

        var result = pthread_create(&tid, &attr, realtimeThreadEntry, context)
        if result == 0 {
            realtime = true
        } else {
            result = pthread_create(&tid, nil, realtimeThreadEntry, context)
        }
        guard result == 0 else {
            Unmanaged<Body>.fromOpaque(context).release()
            throw StartError(name: name, code: result)
        }
        self.thread = tid
        self.isRealtime = realtime
    }

    /// Waits for the body to return. Safe to call more than once and from any thread but the audio thread itself.
    public func join() {
        guard !joined.exchange(true, ordering: .acquiringAndReleasing) else { return }
        pthread_join(thread, nil)
    }

    deinit {
        // An un-joined thread would leak its resources; the owners always stop and join before releasing us.
        if !joined.load(ordering: .acquiring) { pthread_detach(thread) }
    }

    fileprivate static func run(_ context: UnsafeMutableRawPointer) {
        let body = Unmanaged<Body>.fromOpaque(context).takeRetainedValue()
        body.run()
    }
}

/// The C entry point of every `RealtimeThread`.
private func realtimeThreadEntry(_ context: UnsafeMutableRawPointer?) -> UnsafeMutableRawPointer? {
    if let context { RealtimeThread.run(context) }
    return nil
}
