#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import CLinux
import Synchronization

/// One I/O thread that waits on many descriptors and timers with `epoll`, and runs work handed to it.
///
/// Every PeerMesh session and advertiser of a process shares `EventLoop.shared` (thread `pm-io`), so a process
/// has one network thread however many sessions it holds. Handlers run on the loop thread, one at a time, in
/// order; they must not block. Registration, timers and handler state are confined to the loop thread
/// (`precondition(inLoop)` guards them): other threads reach the loop through `execute`.
package final class EventLoop: @unchecked Sendable { // loop-confined state is only touched on the loop thread (checked); `inbox` is a Mutex
    /// What a descriptor is ready for.
    package struct Readiness: OptionSet, Sendable {
        package let rawValue: UInt32
        package init(rawValue: UInt32) { self.rawValue = rawValue }
        package static let readable = Readiness(rawValue: 1)
        package static let writable = Readiness(rawValue: 2)
        /// Error or hang-up: read to learn which (EOF or an error), or check `SO_ERROR`.
        package static let failed = Readiness(rawValue: 4)
    }

    /// A descriptor's registration.
    package struct Registration: Hashable, Sendable { let id: UInt64 }
    /// A scheduled timer.
    package struct Timer: Hashable, Sendable { let id: UInt64 }

    private struct Watch {
        let fd: Int32
        var interest: Readiness
        let handler: (Readiness) -> Void
    }

    private let epoll: FileDescriptor
    private let waker: Waker
    private let name: String
    private let inbox = Mutex<[@Sendable () -> Void]>([])
    private let woken = Atomic<Bool>(false)
    private let loopThread = Atomic<UInt>(0)
    private let running = Atomic<Bool>(true)
    private let exited = Atomic<Bool>(false)
    // Loop-confined.
    private var watches: [UInt64: Watch] = [:]
    private var timers: [UInt64: () -> Void] = [:]
    /// Registrations epoll refused, with the timer that reports them failed: `deregister` cancels that timer, so a
    /// handler is never called after its owner stopped watching (its owner may be gone by then).
    private var refused: [UInt64: Timer] = [:]
    private var timerHeap = TimerHeap()
    private var nextID: UInt64 = 1
    /// 64 KiB of scratch for reads, for handlers on this loop (one runs at a time). Loop thread only.
    package let readBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 65_536, alignment: 16)

    /// Starts a loop on a new thread called `name`.
    package init(name: String) throws(SyscallError) {
        self.name = name
        epoll = FileDescriptor(try Sys.call("epoll_create1") { epoll_create1(Int32(EPOLL_CLOEXEC)) })
        waker = try Waker()
        var ev = epoll_event()
        ev.events = EPOLLIN.rawValue
        ev.data.u64 = 0
        try Sys.call("epoll_ctl(ADD waker)") { epoll_ctl(epoll.fd, EPOLL_CTL_ADD, waker.fd, &ev) }
        let box = Unmanaged.passRetained(self).toOpaque()
        var tid = pthread_t()
        let rc = pthread_create(&tid, nil, eventLoopEntry, box)
        guard rc == 0 else {
            Unmanaged<EventLoop>.fromOpaque(box).release()
            throw SyscallError(call: "pthread_create(\(name))", code: rc)
        }
        pthread_detach(tid)
    }

    private static let sharedLoop = Mutex<EventLoop?>(nil)

    /// The process's I/O loop (`pm-io`), started on first use and kept for the life of the process.
    package static func shared() throws(SyscallError) -> EventLoop {
        try sharedLoop.withLock { (s) throws(SyscallError) -> EventLoop in
            if let s { return s }
            let loop = try EventLoop(name: "pm-io")
            s = loop
            return loop
        }
    }

    /// Whether the caller is on the loop thread.
    package var inLoop: Bool { loopThread.load(ordering: .acquiring) == UInt(pthread_self()) }

    /// Runs `work` on the loop thread, after the work queued before it. Safe from any thread, the loop's included.
    package func execute(_ work: @escaping @Sendable () -> Void) {
        inbox.withLock { $0.append(work) }
        if !woken.exchange(true, ordering: .acquiringAndReleasing) { waker.wake() }
    }

    /// Runs `work` on the loop thread and waits for its result; runs it directly when called on the loop.
    package func submitAndWait<T: Sendable>(_ work: @escaping @Sendable () -> T) -> T {
        if inLoop { return work() }
        let result = Mutex<T?>(nil)
        let done = WakeSignal()
        execute {
            let r = work()
            result.withLock { $0 = r }
            done.signal()
        }
        done.wait()
        return result.withLock { $0! }
    }

    // MARK: Loop thread only

    /// Watches `fd` for `interest`; `handler` runs on the loop with what is ready. Loop thread only.
    package func register(fd: Int32, interest: Readiness, handler: @escaping (Readiness) -> Void) -> Registration {
        precondition(inLoop, "EventLoop.register off the loop thread")
        let id = nextID
        nextID += 1
        var ev = epoll_event()
        ev.events = Self.epollEvents(interest)
        ev.data.u64 = id
        if epoll_ctl(epoll.fd, EPOLL_CTL_ADD, fd, &ev) == 0 {
            watches[id] = Watch(fd: fd, interest: interest, handler: handler)
        } else {
            // Cannot watch (closed descriptor…): report it as failed on the next turn, as a hang-up would be.
            refused[id] = schedule(at: 0) { [unowned self] in
                refused[id] = nil
                handler(.failed)
            }
        }
        return Registration(id: id)
    }

    /// Changes what a registration waits for. Loop thread only.
    package func update(_ r: Registration, interest: Readiness) {
        precondition(inLoop, "EventLoop.update off the loop thread")
        guard var w = watches[r.id], w.interest != interest else { return }
        w.interest = interest
        watches[r.id] = w
        var ev = epoll_event()
        ev.events = Self.epollEvents(interest)
        ev.data.u64 = r.id
        _ = epoll_ctl(epoll.fd, EPOLL_CTL_MOD, w.fd, &ev)
    }

    /// Stops watching (call before closing the descriptor). Loop thread only.
    package func deregister(_ r: Registration) {
        precondition(inLoop, "EventLoop.deregister off the loop thread")
        if let t = refused.removeValue(forKey: r.id) { cancel(t) }
        guard let w = watches.removeValue(forKey: r.id) else { return }
        _ = epoll_ctl(epoll.fd, EPOLL_CTL_DEL, w.fd, nil)
    }

    /// Runs `work` on the loop at monotonic time `deadline` (or soon after). Loop thread only.
    @discardableResult
    package func schedule(at deadline: Nanos, _ work: @escaping () -> Void) -> Timer {
        precondition(inLoop, "EventLoop.schedule off the loop thread")
        let id = nextID
        nextID += 1
        timers[id] = work
        timerHeap.push(deadline, id)
        return Timer(id: id)
    }

    /// Cancels a timer that has not run. Loop thread only.
    package func cancel(_ t: Timer) {
        precondition(inLoop, "EventLoop.cancel off the loop thread")
        timers[t.id] = nil
    }

    /// Ends the loop thread after the work queued so far (for private loops; the shared one runs for the process).
    package func stop() {
        execute { [self] in running.store(false, ordering: .releasing) }
    }

    // MARK: The thread

    private static func epollEvents(_ r: Readiness) -> UInt32 {
        var e = EPOLLRDHUP.rawValue
        if r.contains(.readable) { e |= EPOLLIN.rawValue }
        if r.contains(.writable) { e |= EPOLLOUT.rawValue }
        return e
    }

    fileprivate func run() {
        loopThread.store(UInt(pthread_self()), ordering: .releasing)
        ThreadName.setCurrent(name)
        let capacity = 64
        let events = UnsafeMutablePointer<epoll_event>.allocate(capacity: capacity)
        defer { events.deallocate() }
        while running.load(ordering: .acquiring) {
            let now = MonotonicClock.nowNanos()
            var timeout: Int32 = -1
            if let next = timerHeap.peekDeadline {
                timeout = next <= now ? 0 : Int32(clamping: (next - now + 999_999) / 1_000_000)
            }
            let n = epoll_wait(epoll.fd, events, Int32(capacity), timeout)
            if n > 0 {
                for i in 0..<Int(n) {
                    let id = events[i].data.u64
                    if id == 0 { continue }
                    guard let w = watches[id] else { continue }
                    let e = events[i].events
                    var r: Readiness = []
                    if e & EPOLLIN.rawValue != 0 { r.insert(.readable) }
                    if e & EPOLLOUT.rawValue != 0 { r.insert(.writable) }
                    if e & (EPOLLERR.rawValue | EPOLLHUP.rawValue | EPOLLRDHUP.rawValue) != 0 { r.insert(.failed) }
                    w.handler(r)
                }
            }
            runTimers()
            runInbox()
        }
        exited.store(true, ordering: .releasing)
    }

    private func runInbox() {
        guard woken.load(ordering: .acquiring) else { return }
        waker.drain()
        woken.store(false, ordering: .releasing)
        let work = inbox.withLock { q -> [@Sendable () -> Void] in
            let w = q
            q.removeAll(keepingCapacity: true)
            return w
        }
        for w in work { w() }
    }

    private func runTimers() {
        let now = MonotonicClock.nowNanos()
        while let (deadline, id) = timerHeap.peek, deadline <= now {
            timerHeap.pop()
            if let work = timers.removeValue(forKey: id) { work() }
        }
    }
}

private func eventLoopEntry(_ context: UnsafeMutableRawPointer?) -> UnsafeMutableRawPointer? {
    let loop = Unmanaged<EventLoop>.fromOpaque(context!).takeRetainedValue()
    loop.run()
    return nil
}

/// A binary min-heap of (deadline, id).
/// A driver's one wake-up on an `EventLoop`: armed for the earliest deadline its state machine names, re-armed only
/// when that moves earlier (or after it fired). Loop thread only, like the loop's own timers.
package struct DeadlineTimer {
    private var timer: EventLoop.Timer?
    private var deadline: Nanos = .max

    package init() {}

    /// Makes sure `fire` runs by `next` (`.max`: no deadline). An armed earlier deadline is kept.
    package mutating func arm(_ next: Nanos, on loop: EventLoop, _ fire: @escaping () -> Void) {
        guard next < deadline || timer == nil else { return }
        if let t = timer { loop.cancel(t) }
        deadline = next
        timer = next == .max ? nil : loop.schedule(at: next, fire)
    }

    /// Call first thing when it fired: nothing is armed any more.
    package mutating func fired() {
        timer = nil
        deadline = .max
    }

    /// Cancels what is armed.
    package mutating func cancel(on loop: EventLoop) {
        if let t = timer { loop.cancel(t) }
        fired()
    }
}

private struct TimerHeap {
    private var items: [(Nanos, UInt64)] = []

    var peek: (Nanos, UInt64)? { items.first }
    var peekDeadline: Nanos? { items.first?.0 }

    mutating func push(_ deadline: Nanos, _ id: UInt64) {
        items.append((deadline, id))
        var i = items.count - 1
        while i > 0 {
            let parent = (i - 1) / 2
            guard items[i].0 < items[parent].0 else { break }
            items.swapAt(i, parent)
            i = parent
        }
    }

    mutating func pop() {
        guard !items.isEmpty else { return }
        items.swapAt(0, items.count - 1)
        items.removeLast()
        var i = 0
        while true {
            let l = 2 * i + 1, r = l + 1
            var m = i
            if l < items.count, items[l].0 < items[m].0 { m = l }
            if r < items.count, items[r].0 < items[m].0 { m = r }
            guard m != i else { break }
            items.swapAt(i, m)
            i = m
        }
    }
}

/// A value that only the loop thread may touch, inside a `Sendable` owner.
///
/// Like swift-nio's `NIOLoopBound`: the owner is shared across threads, the value is not; every access checks
/// that it runs on the loop.
package final class LoopBound<Value>: @unchecked Sendable { // every access is checked to be on `loop`'s thread
    private let loop: EventLoop
    private var storage: Value

    package init(_ value: Value, loop: EventLoop) {
        self.loop = loop
        storage = value
    }

    /// The value. Loop thread only.
    package var value: Value {
        _read {
            precondition(loop.inLoop, "loop-bound value touched off its loop")
            yield storage
        }
        _modify {
            precondition(loop.inLoop, "loop-bound value touched off its loop")
            yield &storage
        }
    }
}
