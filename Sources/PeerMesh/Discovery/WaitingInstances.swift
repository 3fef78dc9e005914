/// The instances a browse saw while all its resolvers were busy, oldest first, and bounded: each is resolved when a
/// resolver frees, unless it went meanwhile. A flood of instances on the LAN then delays the real ones, never hides
/// them for good (before, an instance seen past the bound was skipped until it was announced afresh). Pure.
struct WaitingInstances<Key: Hashable> {
    /// Most instances waiting at once; more are skipped (and counted).
    let capacity: Int
    /// Instances skipped because `capacity` were waiting.
    private(set) var skipped = 0
    /// Arrival order; may hold keys removed since (skipped by `next`), compacted as it grows.
    private var order: [Key] = []
    private var head = 0
    private var members: Set<Key> = []

    init(capacity: Int) {
        precondition(capacity > 0, "WaitingInstances: capacity must be positive")
        self.capacity = capacity
    }

    /// How many wait.
    var count: Int { members.count }

    /// Entries held in the arrival order, removed ones included (at most about twice `capacity`).
    var stored: Int { order.count - head }

    /// Adds `key` at the end. Returns false, and counts it in `skipped`, when `capacity` already wait; a key already
    /// waiting keeps its place (true).
    @discardableResult
    mutating func append(_ key: Key) -> Bool {
        guard !members.contains(key) else { return true }
        guard members.count < capacity else {
            skipped += 1
            return false
        }
        members.insert(key)
        order.append(key)
        // Keys removed while waiting leave their entries behind: keep those within bounds too.
        if order.count - head > 2 * capacity { compact() }
        return true
    }

    /// `key` went before its turn: it no longer waits.
    mutating func remove(_ key: Key) {
        members.remove(key)
    }

    /// The oldest waiting key, taken out; nil when none waits.
    mutating func next() -> Key? {
        while head < order.count {
            let key = order[head]
            head += 1
            if members.remove(key) != nil {
                if head > 64, head * 2 > order.count { compact() }
                return key
            }
        }
        order.removeAll(keepingCapacity: true)
        head = 0
        return nil
    }

    /// Forgets every waiting key (the browser starts over).
    mutating func removeAll() {
        members.removeAll()
        order.removeAll()
        head = 0
    }

    private mutating func compact() {
        var seen: Set<Key> = []
        order = order[head...].filter { members.contains($0) && seen.insert($0).inserted }
        head = 0
    }
}
