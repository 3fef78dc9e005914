import Foundation
import MeshPOSIX
import Synchronization
import Testing

/// The preallocated many-producers, one-consumer queue real-time senders hand relayed datagrams to the loop through.
@Suite("MPSC byte queue")
struct MPSCByteQueueTests {
    static func push(_ q: MPSCByteQueue, _ tag: UInt64, _ text: String) -> Bool {
        Array(text.utf8).withUnsafeBytes { q.push(tag: tag, $0) }
    }

    static func pop(_ q: MPSCByteQueue) -> (UInt64, String)? {
        q.pop { tag, bytes in (tag, String(decoding: bytes, as: UTF8.self)) }
    }

    @Test("First in, first out with tags, across the wrap; full refuses and copies nothing; too long refuses; empty is a message")
    func orderWrapAndLimits() {
        let q = MPSCByteQueue(capacity: 4, slotBytes: 8)
        #expect(Self.pop(q) == nil)
        for i in 0..<4 { #expect(Self.push(q, UInt64(i), "m\(i)")) }
        #expect(!Self.push(q, 9, "full"), "four slots")
        #expect(!Self.push(q, 9, "123456789"), "longer than a slot")
        #expect(Self.pop(q)! == (0, "m0") && Self.pop(q)! == (1, "m1"))
        #expect(Self.push(q, 4, "12345678") && Self.push(q, 5, ""))
        #expect(!Self.push(q, 9, "x"))
        for expected in [(2, "m2"), (3, "m3"), (4, "12345678"), (5, "")] as [(UInt64, String)] {
            #expect(Self.pop(q)! == expected)
        }
        #expect(Self.pop(q) == nil)
        for lap in 0..<10 {
            #expect(Self.push(q, UInt64(lap), "lap \(lap)"))
            #expect(Self.pop(q)! == (UInt64(lap), "lap \(lap)"))
        }
    }

    @Test("Three producers and a consumer at once: every message arrives whole, once, in its producer's order")
    func producersRaceTheConsumer() {
        let q = MPSCByteQueue(capacity: 16, slotBytes: 32)
        let producers = 3, each = 20_000
        let done = Atomic<Int>(0)
        let consumer = Thread {
            var next = [Int](repeating: 0, count: producers)
            var received = 0, bad = 0
            while received < producers * each {
                let ok = q.pop { tag, bytes -> Bool in
                    // "P:N" padded to a length that depends on N: a torn copy shows.
                    let text = String(decoding: bytes, as: UTF8.self).trimmingCharacters(in: .whitespaces)
                    let parts = text.split(separator: ":")
                    guard parts.count == 2, let p = Int(parts[0]), let n = Int(parts[1]), UInt64(p) == tag, p < producers,
                          n == next[p], bytes.count == 8 + n % 17 else { return false }
                    next[p] += 1
                    return true
                }
                switch ok {
                case nil: continue
                case true?: received += 1
                case false?: bad += 1; received += 1
                }
            }
            done.store(bad == 0 && next.allSatisfy { $0 == each } ? 1 : -1, ordering: .releasing)
        }
        consumer.start()
        DispatchQueue.concurrentPerform(iterations: producers) { p in
            for n in 0..<each {
                let text = "\(p):\(n)"
                let padded = text + String(repeating: " ", count: 8 + n % 17 - text.utf8.count)
                while !Self.push(q, UInt64(p), padded) {}  // full: the consumer frees a slot soon
            }
        }
        let deadline = Date().addingTimeInterval(30)
        while done.load(ordering: .acquiring) == 0 && Date() < deadline { Thread.sleep(forTimeInterval: 0.01) }
        #expect(done.load(ordering: .acquiring) == 1, "every message whole, once, in order")
    }
}
