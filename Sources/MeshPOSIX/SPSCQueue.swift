import Synchronization

/// A bounded first-in first-out queue between exactly one producer thread and one consumer thread, with its slots
/// allocated once in `init`: neither side allocates, locks or waits. For notes a real-time thread leaves for a
/// control thread (a session's datagram reader telling the event loop that a peer's address moved).
///
/// `push` fails (returns false) when the queue is full; `pop` returns nil when it is empty. Each side may migrate
/// between threads only through a synchronization of its own (the owner's turn-taking).
package final class SPSCQueue<Element>: @unchecked Sendable {  // slots are handed over through `head`/`tail` (acquire/release)
    private let slots: UnsafeMutablePointer<Element>
    private let capacity: Int
    /// Next slot to read (consumer's).
    private let head = Atomic<Int>(0)
    /// Next slot to write (producer's).
    private let tail = Atomic<Int>(0)

    /// A queue of `capacity` slots (at least 1).
    package init(capacity: Int) {
        precondition(capacity >= 1, "SPSCQueue needs at least one slot")
        self.capacity = capacity
        slots = .allocate(capacity: capacity)
    }

    deinit {
        while pop() != nil {}
        slots.deallocate()
    }

    /// Producer: appends `element`, or returns false when the queue is full.
    @discardableResult
    package func push(_ element: Element) -> Bool {
        let t = tail.load(ordering: .relaxed)
        guard t &- head.load(ordering: .acquiring) < capacity else { return false }
        (slots + t % capacity).initialize(to: element)
        tail.store(t &+ 1, ordering: .releasing)
        return true
    }

    /// Consumer: the oldest element, or nil when the queue is empty.
    package func pop() -> Element? {
        let h = head.load(ordering: .relaxed)
        guard h != tail.load(ordering: .acquiring) else { return nil }
        let element = (slots + h % capacity).move()
        head.store(h &+ 1, ordering: .releasing)
        return element
    }
}
