import Synchronization

/// A plain `BitwiseCopyable` struct — a stage's counters, a pipeline's levels — kept in atomic machine words, so
/// that its writer threads update it and any thread reads it, with no lock and no hand-written atomic per field.
///
/// Two ways to write, not to be mixed on one record:
/// - `add(_:)`: counters. Each `UInt64` field is one word, incremented atomically: exact with any number of
///   writers.
/// - `store(_:)`: one writer publishes the whole value (levels computed on the render thread, say).
///
/// Every word is an independent relaxed atomic: `load()` returns each field as some write left it, never a torn
/// field, but two fields need not come from the same `store`. Real-time safe: no allocation, no lock, no syscall
/// (the words sit inline in the object; the copies use stack scratch space). `Value` must fit in `capacity` words.
public final class AtomicRecord<Value: BitwiseCopyable>: Sendable {
    /// The largest record, in 8-byte words.
    public static var capacity: Int { 64 }

    private let words: InlineArray<64, Atomic<UInt64>>
    private let count: Int

    /// A record holding `initial`.
    public init(_ initial: Value) {
        let count = (MemoryLayout<Value>.size + 7) / 8
        precondition(count <= Self.capacity, "AtomicRecord: \(Value.self) needs \(count) words, more than \(Self.capacity)")
        precondition(MemoryLayout<Value>.alignment <= 8, "AtomicRecord: \(Value.self) is aligned beyond a word")
        self.count = count
        words = InlineArray { _ in Atomic<UInt64>(0) }
        store(initial)
    }

    /// Adds the counts `counts` makes to a record of zeros, each `UInt64` field to its word (wrapping): for
    /// counters, from any thread. `record.add { $0.late += 1 }`, `record.add { $0.sent += n; $0.bytes += size }`.
    ///
    /// For records made of `UInt64` fields only (no padding): each field is one word, and `counts` may only add to
    /// them; a smaller field would carry into its neighbour, and padding bytes would be added too. Real-time safe: the
    /// zeros are stack scratch space, and the closure is not escaping. A key path would not be: a key-path literal
    /// is made on the heap the first time it is evaluated, which for a rare counter (the first stale Opus packet)
    /// was on the playback thread in the middle of a stream.
    @inline(__always)
    public func add(_ counts: (inout Value) -> Void) {
        withUnsafeTemporaryAllocation(of: UInt64.self, capacity: count) { scratch in
            scratch.initialize(repeating: 0)
            let raw = UnsafeMutableRawPointer(scratch.baseAddress!)
            var delta = raw.load(as: Value.self)
            counts(&delta)
            raw.storeBytes(of: delta, as: Value.self)
            for index in 0..<count where scratch[index] != 0 {
                words[index].wrappingAdd(scratch[index], ordering: .relaxed)
            }
        }
    }

    /// Publishes `value` word by word. For a record with one writer.
    public func store(_ value: Value) {
        withUnsafeTemporaryAllocation(of: UInt64.self, capacity: count) { scratch in
            scratch.initialize(repeating: 0)
            UnsafeMutableRawPointer(scratch.baseAddress!).storeBytes(of: value, as: Value.self)
            for index in 0..<count { words[index].store(scratch[index], ordering: .relaxed) }
        }
    }

    /// The value, word by word (any thread).
    public func load() -> Value {
        withUnsafeTemporaryAllocation(of: UInt64.self, capacity: count) { scratch in
            for index in 0..<count { scratch.initializeElement(at: index, to: words[index].load(ordering: .relaxed)) }
            return UnsafeRawPointer(scratch.baseAddress!).load(as: Value.self)
        }
    }
}
