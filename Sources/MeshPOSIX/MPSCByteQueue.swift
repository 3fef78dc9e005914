import Synchronization

/// A bounded first-in first-out queue of short byte messages, each with a 64-bit tag, from any number of producer
/// threads to one consumer thread. Its slots are allocated once in `init`: a producer copies its bytes into a slot
/// without allocating, locking or blocking (a real-time thread may push; lock-free, not wait-free: its
/// compare-and-exchange is retried while other producers win the race), and a full queue refuses the message.
///
/// Dmitry Vyukov's bounded queue: each slot carries a sequence number that says whose turn it is — the producer
/// that claimed position `p` (by moving `tail` from `p` to `p + 1`) when it equals `p`, the consumer when it equals
/// `p + 1`, the producer of the next lap when it equals `p + capacity`. Producers race only on `tail`, with a
/// compare-and-exchange; a producer between its claim and its publication holds up the consumer at that slot, never
/// another producer.
package final class MPSCByteQueue: @unchecked Sendable {  // slots are handed over through their sequence numbers (acquire/release); `head` is the consumer's alone
    /// Slots in the queue (a power of two).
    package let capacity: Int
    /// The longest message a slot holds.
    package let slotBytes: Int
    private let mask: Int
    private let sequences: UnsafeMutablePointer<Atomic<Int>>
    private let lengths: UnsafeMutablePointer<Int>
    private let tags: UnsafeMutablePointer<UInt64>
    private let storage: UnsafeMutableRawPointer
    /// Next position a producer claims.
    private let tail = Atomic<Int>(0)
    /// Next position the consumer reads (consumer only).
    private var head = 0

    /// A queue of `capacity` slots (a power of two, at least 2) of `slotBytes` bytes each.
    package init(capacity: Int, slotBytes: Int) {
        precondition(capacity >= 2 && capacity & (capacity - 1) == 0, "MPSCByteQueue: capacity must be a power of two ≥ 2")
        precondition(slotBytes > 0, "MPSCByteQueue: slots must hold at least a byte")
        self.capacity = capacity
        self.slotBytes = slotBytes
        mask = capacity - 1
        sequences = .allocate(capacity: capacity)
        for i in 0..<capacity { (sequences + i).initialize(to: Atomic(i)) }
        lengths = .allocate(capacity: capacity)
        lengths.initialize(repeating: 0, count: capacity)
        tags = .allocate(capacity: capacity)
        tags.initialize(repeating: 0, count: capacity)
        storage = .allocate(byteCount: capacity * slotBytes, alignment: 16)
    }

    deinit {
        sequences.deinitialize(count: capacity)
        sequences.deallocate()
        lengths.deallocate()
        tags.deallocate()
        storage.deallocate()
    }

    /// Any producer thread: copies `bytes` into the queue under `tag`. Returns false, having copied nothing, when the
    /// queue is full or `bytes` is longer than a slot.
    @discardableResult
    package func push(tag: UInt64, _ bytes: UnsafeRawBufferPointer) -> Bool {
        guard bytes.count <= slotBytes else { return false }
        var position = tail.load(ordering: .relaxed)
        while true {
            let turn = sequences[position & mask].load(ordering: .acquiring) &- position
            if turn == 0 {
                let (claimed, current) = tail.weakCompareExchange(expected: position, desired: position &+ 1,
                                                                  successOrdering: .relaxed, failureOrdering: .relaxed)
                if claimed { break }
                position = current
            } else if turn < 0 {
                return false  // the slot still holds the message of a lap ago: full
            } else {
                position = tail.load(ordering: .relaxed)  // another producer claimed it: try the next
            }
        }
        let slot = position & mask
        if let base = bytes.baseAddress { (storage + slot * slotBytes).copyMemory(from: base, byteCount: bytes.count) }
        lengths[slot] = bytes.count
        tags[slot] = tag
        sequences[slot].store(position &+ 1, ordering: .releasing)
        return true
    }

    /// The consumer thread only: hands the oldest message to `body` (its bytes are valid during the call) and frees
    /// its slot; nil when the queue is empty (or its oldest message is still being written). Not re-entrant: `body`
    /// must not pop. A `body` that throws has consumed its message all the same.
    package func pop<R>(_ body: (_ tag: UInt64, _ bytes: UnsafeRawBufferPointer) throws -> R) rethrows -> R? {
        let slot = head & mask
        guard sequences[slot].load(ordering: .acquiring) == head &+ 1 else { return nil }
        defer {
            sequences[slot].store(head &+ capacity, ordering: .releasing)
            head &+= 1
        }
        return try body(tags[slot], UnsafeRawBufferPointer(start: storage + slot * slotBytes, count: lengths[slot]))
    }
}
