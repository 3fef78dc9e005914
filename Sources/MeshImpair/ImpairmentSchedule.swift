import MeshPOSIX
/// Decides each datagram's fate in one direction. Pure: no I/O and no clock (the caller passes the arrival time).
/// Always takes exactly four draws per datagram (loss, duplicate, reorder, jitter), so the outcome for datagram n
/// depends only on the seed and n.
struct ImpairmentPlanner: Sendable {
    enum Fate: Equatable, Sendable {
        case drop
        case forward(due: UInt64, copies: Int, holdBack: Bool)
    }

    private var random: ImpairmentRandom
    private let impaired: Bool
    private let loss: Double, duplicate: Double, reorder: Double
    private let delayNanos: Double, jitterNanos: Double

    init(configuration c: ImpairmentProxy.Configuration, way: Way) {
        var sm = SplitMix64(seed: c.seed)
        let streams = [sm.next(), sm.next()]
        random = ImpairmentRandom(seed: streams[way.rawValue])
        impaired = c.impairs(way)
        loss = c.loss; duplicate = c.duplicate; reorder = c.reorder
        delayNanos = c.delayMilliseconds * 1e6
        jitterNanos = c.jitterMilliseconds * 1e6
    }

    mutating func decide(arrival: UInt64) -> Fate {
        guard impaired else { return .forward(due: arrival, copies: 1, holdBack: false) }
        let l = random.nextUnit(), d = random.nextUnit(), r = random.nextUnit(), j = random.nextUnit()
        if l < loss { return .drop }
        let added = max(0, delayNanos + (2 * j - 1) * jitterNanos)
        return .forward(due: arrival &+ UInt64(added), copies: d < duplicate ? 2 : 1, holdBack: r < reorder)
    }
}

/// The proxy's UDP timing state: the planners, the delay queue (a binary heap by due time, FIFO among equals), the
/// datagrams held back for reordering, and the counters. A pure state machine: the I/O thread `admit`s what it
/// read and sends the `immediate` entries itself; the scheduler thread `takeDue`s and sends; both report with
/// `finish`. `Outlet` says where an entry goes (generic so tests need no sockets).
struct ImpairmentSchedule<Outlet: Sendable>: Sendable {
    struct Incoming: Sendable {
        var way: Way
        /// The client session the datagram belongs to (reordering is per session and direction).
        var flow: Int
        var bytes: [UInt8]
        var outlet: Outlet
    }

    struct Entry: Sendable {
        var due: UInt64
        var order: UInt64
        var way: Way
        var bytes: [UInt8]
        var copies: Int
        var outlet: Outlet

        func precedes(_ o: Entry) -> Bool { due != o.due ? due < o.due : order < o.order }
    }

    /// How one entry's sends went.
    struct Outcome: Sendable {
        var way: Way
        var delivered: Bool
        var extraCopiesDelivered: Int
    }

    struct Admission: Sendable {
        /// Entries due now with nothing ahead of them: the caller sends them, in this order, then calls `finish`.
        var immediate: [Entry] = []
        /// Whether the scheduler must wake earlier than it planned.
        var wakeScheduler = false
    }

    private struct FlowKey: Hashable { var flow: Int; var way: Way }
    private struct Held { var entry: Entry; var deadline: UInt64 }

    private var planners: [ImpairmentPlanner]
    private var heap: [Entry] = []
    private var holds: [FlowKey: Held] = [:]
    private var nextOrder: UInt64 = 0
    private var queued = [0, 0]
    private var sending = [0, 0]
    private let holdNanos: UInt64
    private let capacity: Int
    private(set) var stats = ImpairmentProxy.Statistics()
    /// When the scheduler plans to wake: 0 while awake (it re-checks before sleeping), `.max` when idle.
    private(set) var schedulerWake: UInt64 = 0

    init(configuration: ImpairmentProxy.Configuration, capacity: Int = 200_000) {
        planners = [ImpairmentPlanner(configuration: configuration, way: .toTarget),
                    ImpairmentPlanner(configuration: configuration, way: .fromTarget)]
        holdNanos = UInt64(configuration.reorderHoldMilliseconds * 1e6)
        self.capacity = capacity
    }

    var isEmpty: Bool { heap.isEmpty && holds.isEmpty }

    /// A PeerMesh data datagram: magic `PM`, protocol version 2, 3 or 4, kind 1, a payload after the 20-byte header.
    /// The proxy does not link PeerMesh, so it names the versions whose header has this layout (a later version
    /// that keeps it is added here); the header is clear even when the payload is sealed.
    static func isPeerMeshData(_ b: [UInt8]) -> Bool {
        b.count > 20 && b[0] == 0x50 && b[1] == 0x4d && (2...4).contains(b[2]) && b[3] == 1
    }

    mutating func admit(_ batch: [Incoming], now: UInt64) -> Admission {
        var adm = Admission()
        var earliest = UInt64.max
        var batchImmediate = [0, 0]
        func place(_ e: Entry, _ s: inout ImpairmentSchedule) {
            let w = e.way.rawValue
            if e.due <= now, s.queued[w] == 0, s.sending[w] == batchImmediate[w] {
                adm.immediate.append(e)
                s.sending[w] += 1
                batchImmediate[w] += 1
            } else {
                s.push(e)
                s.queued[w] += 1
                earliest = min(earliest, e.due)
            }
        }
        for d in batch {
            stats[d.way].received += 1
            switch planners[d.way.rawValue].decide(arrival: now) {
            case .drop:
                stats[d.way].dropped += 1
                if Self.isPeerMeshData(d.bytes) {
                    stats[d.way].droppedPeerMeshData += 1
                    stats[d.way].trailingDroppedPeerMeshData += 1
                }
            case .forward(let due, let copies, let holdBack):
                if Self.isPeerMeshData(d.bytes) { stats[d.way].trailingDroppedPeerMeshData = 0 }
                if due > now { stats[d.way].delayed += 1 }
                guard heap.count + holds.count < capacity else {
                    stats[d.way].failed += 1
                    continue
                }
                stats[d.way].pending += 1
                nextOrder += 1
                let entry = Entry(due: due, order: nextOrder, way: d.way, bytes: d.bytes, copies: copies, outlet: d.outlet)
                let key = FlowKey(flow: d.flow, way: d.way)
                if var held = holds.removeValue(forKey: key) {
                    place(entry, &self)
                    nextOrder += 1
                    held.entry.due = max(held.entry.due, due)
                    held.entry.order = nextOrder
                    stats[d.way].reordered += 1
                    place(held.entry, &self)
                } else if holdBack {
                    let deadline = due &+ holdNanos
                    holds[key] = Held(entry: entry, deadline: deadline)
                    earliest = min(earliest, deadline)
                } else {
                    place(entry, &self)
                }
            }
        }
        adm.wakeScheduler = earliest < schedulerWake
        return adm
    }

    /// Takes every entry due at `now` (and held entries whose wait expired), in send order, and returns when to
    /// look again (`nil`: nothing waiting). Called by the scheduler only.
    mutating func takeDue(now: UInt64) -> (entries: [Entry], next: UInt64?) {
        // The I/O thread is sending immediates; let it finish first so nothing overtakes them.
        if sending[0] + sending[1] > 0 {
            schedulerWake = now &+ 100_000
            return ([], schedulerWake)
        }
        var out: [Entry] = []
        while let top = heap.first, top.due <= now {
            let e = pop()
            queued[e.way.rawValue] -= 1
            sending[e.way.rawValue] += 1
            out.append(e)
        }
        var expired = false
        for (k, h) in holds where h.deadline <= now {
            holds[k] = nil
            sending[h.entry.way.rawValue] += 1
            out.append(h.entry)
            expired = true
        }
        if expired { out.sort { $0.precedes($1) } }
        var next = heap.first?.due
        for h in holds.values { next = min(next ?? .max, h.deadline) }
        schedulerWake = out.isEmpty ? (next ?? .max) : 0
        return (out, next)
    }

    /// Accounts entries handed out by `admit` or `takeDue` once their sends are done.
    mutating func finish(_ outcomes: [Outcome]) {
        for o in outcomes {
            sending[o.way.rawValue] -= 1
            stats[o.way].pending -= 1
            if o.delivered { stats[o.way].forwarded += 1 } else { stats[o.way].failed += 1 }
            stats[o.way].duplicated += UInt64(o.extraCopiesDelivered)
        }
    }

    /// Drops everything still waiting (at stop), counting it as failed. Returns the entries so their outlets are
    /// released outside the lock.
    mutating func discardAll() -> [Entry] {
        var all = heap
        all.append(contentsOf: holds.values.map(\.entry))
        for e in all { stats[e.way].pending -= 1; stats[e.way].failed += 1 }
        heap = []; holds = [:]; queued = [0, 0]
        return all
    }

    // MARK: Binary heap

    private mutating func push(_ e: Entry) {
        heap.append(e)
        var i = heap.count - 1
        while i > 0 {
            let p = (i - 1) / 2
            guard heap[i].precedes(heap[p]) else { break }
            heap.swapAt(i, p)
            i = p
        }
    }

    private mutating func pop() -> Entry {
        let top = heap[0]
        let last = heap.removeLast()
        if !heap.isEmpty {
            heap[0] = last
            var i = 0
            while true {
                let l = 2 * i + 1, r = l + 1
                var m = i
                if l < heap.count, heap[l].precedes(heap[m]) { m = l }
                if r < heap.count, heap[r].precedes(heap[m]) { m = r }
                if m == i { break }
                heap.swapAt(i, m)
                i = m
            }
        }
        return top
    }
}

extension ImpairmentSchedule {
    /// Counts datagrams received but refused before planning (for example: the session table is full).
    mutating func reject(way: Way, count: Int) {
        stats[way].received += UInt64(count)
        stats[way].failed += UInt64(count)
    }
}
