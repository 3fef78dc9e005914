/// The minimum of a value over a sliding time window, kept in fixed time buckets (preallocated: `add` and
/// `minimum` never allocate).
///
/// The window covers the current bucket and the `buckets − 1` before it, so it spans between
/// `(buckets − 1)·bucketNanos` and `buckets·bucketNanos`.
public struct SlidingMinimum: Sendable {
    /// Bucket length, nanoseconds.
    public let bucketNanos: UInt64
    private var ids: [Int64]
    private var mins: [Double]

    /// A window of `buckets` buckets of `bucketNanos` each.
    public init(bucketNanos: UInt64, buckets: Int) {
        precondition(bucketNanos > 0 && buckets > 0, "SlidingMinimum needs a positive bucket length and count")
        self.bucketNanos = bucketNanos
        ids = [Int64](repeating: Int64.min, count: buckets)
        mins = [Double](repeating: 0, count: buckets)
    }

    /// Forgets every sample.
    public mutating func reset() {
        for i in ids.indices { ids[i] = Int64.min }
    }

    /// Records `value` observed at `nanos`.
    public mutating func add(_ value: Double, atNanos nanos: UInt64) {
        let id = Int64(nanos / bucketNanos)
        let b = Int(id % Int64(ids.count))
        if ids[b] != id {
            ids[b] = id
            mins[b] = value
        } else if value < mins[b] {
            mins[b] = value
        }
    }

    /// The minimum over the window ending at `nanos`, or nil when the window holds no sample.
    public func minimum(atNanos nanos: UInt64) -> Double? {
        let id = Int64(nanos / bucketNanos)
        let oldest = id - Int64(ids.count) + 1
        var m = Double.infinity
        for i in ids.indices where ids[i] >= oldest && ids[i] <= id { m = min(m, mins[i]) }
        return m.isFinite ? m : nil
    }
}
