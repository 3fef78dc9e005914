import Foundation
import MeshAudio
import MeshPipeline
import Synchronization
import MeshPOSIX
import Testing

/// The lock-free hand-over (`SnapshotCell`) of the player's pipeline between the control queue and the datagram path.
@Suite("Snapshot cell: the current pipeline's hand-over")
struct SnapshotCellTests {
    /// A sink that plays nowhere.
    final class NullSink: AudioSink, Sendable {
        let format: AudioFormat
        let periodFrames = 128
        init(format: AudioFormat) { self.format = format }
        func start(renderer: any AudioRenderer) throws {}
        func stop() {}
        var stats: AudioStats { AudioStats() }
    }

    static func pipeline(_ format: AudioFormat = .default) throws -> PlayoutPipeline {
        try PlayoutPipeline(format: format, sink: NullSink(format: format))
    }

    @Test func replaceHandsBackThePipelineItReplaces() throws {
        let slot = SnapshotCell<PlayoutPipeline>()
        #expect(slot.withCurrent { $0 == nil })
        let first = try Self.pipeline()
        #expect(slot.replace(with: first) == nil)
        #expect(slot.withCurrent { $0 === first })
        let second = try Self.pipeline(AudioFormat(sampleRate: 48_000, channels: 2))
        #expect(slot.replace(with: second) === first)
        #expect(slot.withCurrent { $0?.format } == second.format)
        #expect(slot.replace(with: nil) === second)
    }

    @Test func publishNeverWaitsAndReleasesTheOldOneOnceNoReaderHoldsIt() throws {
        let slot = SnapshotCell<PlayoutPipeline>()
        #expect(slot.publish(try Self.pipeline()), "no reader: released at once")
        weak var first: PlayoutPipeline?
        first = slot.withCurrent { $0 }
        #expect(first != nil)
        let inside = WakeSignal(), leave = WakeSignal(), left = WakeSignal()
        Thread {
            slot.withCurrent { _ in
                inside.signal()
                leave.wait()
            }
            left.signal()
        }.start()
        inside.wait()
        // A writer whose reader is waiting for it: `replace` would wait for ever here; `publish` returns at once.
        #expect(!slot.publish(try Self.pipeline()), "a reader is inside: the old one is kept")
        #expect(!slot.publish(try Self.pipeline()))
        #expect(first != nil, "still alive while the reader may hold it")
        #expect(!slot.reclaim())
        leave.signal()
        left.wait()
        #expect(slot.reclaim(), "no reader now: both replaced pipelines released")
        #expect(first == nil)
        #expect(slot.withCurrent { $0 != nil })
    }

    @Test func readersNeverSeeAReleasedPipeline() throws {
        let slot = SnapshotCell<PlayoutPipeline>()
        let stop = Atomic<Bool>(false)
        let reads = Atomic<Int>(0)
        let datagram = try AudioPacket.encode(AudioPacketHeader(sequence: 0, firstFrameIndex: 0, frameCount: 4, format: .default),
                                              samples: [0, 0, 0, 0])
        let reader = Thread {
            datagram.withUnsafeBytes { bytes in
                while !stop.load(ordering: .acquiring) {
                    _ = slot.withCurrent { $0?.receive(bytes, arrivalNanos: 1) }
                    reads.wrappingAdd(1, ordering: .relaxed)
                }
            }
        }
        reader.start()
        var replaced = 0, released = 0
        for _ in 0..<100 {
            weak var old: PlayoutPipeline?
            do {
                let previous = slot.replace(with: try Self.pipeline())
                if previous != nil { replaced += 1 }
                old = previous
            }
            if old == nil { released += 1 }
        }
        stop.store(true, ordering: .releasing)
        _ = slot.replace(with: nil)
        while reader.isExecuting { usleep(1_000) }
        #expect(reads.load(ordering: .relaxed) > 100)
        #expect(replaced == 99 && released == 100, "every replaced pipeline was released once the readers left it")
    }
}
