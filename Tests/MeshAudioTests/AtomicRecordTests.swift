import Testing
import Foundation
import MeshPOSIX

/// Counters of a made-up stage: the shape `AtomicRecord` serves (session, ingress and playout statistics).
private struct Tally: Sendable, Equatable, BitwiseCopyable {
    var first: UInt64 = 0
    var second: UInt64 = 0
    var third: UInt64 = 0
}

/// Levels of a made-up pipeline: mixed field sizes, an optional enum and padding.
private struct Levels: Sendable, Equatable, BitwiseCopyable {
    enum Mode: UInt8, BitwiseCopyable { case idle = 1, playing = 2 }
    var milliseconds: Double = 0
    var flag = false
    var peak: Float = 0
    var count: UInt64 = 0
    var mode: Mode?
}

@Suite("AtomicRecord")
struct AtomicRecordTests {
    @Test func startsAtItsInitialValueAndAddsToOneFieldOnly() {
        let record = AtomicRecord(Tally(first: 5, second: 6, third: 7))
        #expect(record.load() == Tally(first: 5, second: 6, third: 7))
        record.add { $0.second += 1 }
        record.add { $0.third += 10 }
        #expect(record.load() == Tally(first: 5, second: 7, third: 17))
        record.add { $0.first += UInt64.max }  // wraps, as a counter does
        #expect(record.load().first == 4)
    }

    @Test func oneAddMayCountSeveralFields() {
        let record = AtomicRecord(Tally(first: 1, second: 2, third: 3))
        let frames: UInt64 = 128
        record.add {
            $0.first += 1
            $0.third += frames
        }
        #expect(record.load() == Tally(first: 2, second: 2, third: 131))
    }

    @Test func storeAndLoadRoundTripMixedFields() {
        let record = AtomicRecord(Levels())
        #expect(record.load() == Levels())
        let value = Levels(milliseconds: 12.5, flag: true, peak: 0.25, count: 1 << 40, mode: .playing)
        record.store(value)
        #expect(record.load() == value)
        var none = value
        none.mode = nil
        record.store(none)
        #expect(record.load() == none)
    }

    @Test func concurrentAddsAreExact() async {
        let record = AtomicRecord(Tally())
        let perThread = 200_000
        await withTaskGroup(of: Void.self) { group in
            for t in 0..<4 {
                group.addTask {
                    for _ in 0..<perThread {
                        if t % 2 == 0 { record.add { $0.first += 1 } } else { record.add { $0.second += 1 } }
                        record.add { $0.third += 2 }
                    }
                }
            }
        }
        #expect(record.load() == Tally(first: UInt64(2 * perThread), second: UInt64(2 * perThread),
                                       third: UInt64(8 * perThread)))
    }

    @Test func aReaderSeesOnlyFieldsAWriterStored() async {
        // One writer stores values whose fields all follow from a round number n; every field a reader loads must be
        // one the writer stored (fields may come from consecutive stores, a field is never a mix of two).
        let record = AtomicRecord(Levels(milliseconds: 1, flag: false, peak: 1, count: 1 << 32 | 1, mode: .idle))
        let rounds: UInt64 = 20_000
        let writer = Task.detached {
            for n in 1...rounds {
                record.store(Levels(milliseconds: Double(n), flag: n % 2 == 0, peak: Float(n % 1000),
                                    count: n << 32 | n, mode: n % 3 == 0 ? nil : .idle))
            }
        }
        var foreign = 0
        for _ in 0..<20_000 {
            let v = record.load()
            let valid = v.count >> 32 == v.count & 0xFFFF_FFFF && (1...rounds).contains(v.count & 0xFFFF_FFFF)
                && v.milliseconds.rounded() == v.milliseconds && (1...Double(rounds)).contains(v.milliseconds)
                && v.peak.rounded() == v.peak && v.peak < 1000
            if !valid { foreign += 1 }
        }
        await writer.value
        #expect(foreign == 0)
        #expect(record.load() == Levels(milliseconds: Double(rounds), flag: true, peak: Float(rounds % 1000),
                                        count: rounds << 32 | rounds, mode: .idle))
    }
}
