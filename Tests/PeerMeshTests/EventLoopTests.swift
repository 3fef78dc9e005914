import Testing
import MeshPOSIX
import Synchronization

@Suite("Event loop")
struct EventLoopTests {
    @Test("A descriptor epoll refuses is reported failed on the next turn, unless its owner stopped watching first")
    func refusedRegistration() throws {
        let loop = try EventLoop(name: "pm-test-loop")
        defer { loop.stop() }
        let calls = Mutex<[String]>([])
        let done = WakeSignal()
        loop.execute {
            // -1 is no descriptor: EPOLL_CTL_ADD fails with EBADF.
            _ = loop.register(fd: -1, interest: .readable) { ready in
                calls.withLock { $0.append(ready.contains(.failed) ? "kept: failed" : "kept: \(ready.rawValue)") }
            }
            let dropped = loop.register(fd: -1, interest: .readable) { _ in calls.withLock { $0.append("dropped") } }
            // Its owner goes away before the next turn (a connection closed at once): nothing may reach it.
            loop.deregister(dropped)
            loop.schedule(at: MonotonicClock.nowNanos() + 50_000_000) { done.signal() }
        }
        #expect(done.wait(untilNanos: MonotonicClock.nowNanos() + 5_000_000_000))
        #expect(calls.withLock { $0 } == ["kept: failed"])
    }

    @Test("Work handed to the loop runs on it, in order; submitAndWait returns its result")
    func executeRunsInOrderOnTheLoop() throws {
        let loop = try EventLoop(name: "pm-test-loop")
        defer { loop.stop() }
        let seen = Mutex<[Int]>([])
        for i in 0..<100 { loop.execute { seen.withLock { $0.append(loop.inLoop ? i : -1) } } }
        let count = loop.submitAndWait { seen.withLock { $0.count } }
        #expect(count == 100)
        #expect(seen.withLock { $0 } == Array(0..<100))
        #expect(!loop.inLoop)
    }
}
