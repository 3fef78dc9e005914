import Testing
import Foundation
@testable import MeshAudio
import MeshPOSIX

@Suite("SampleRing and ChunkRing")
struct RingTests {
    @Test func capacityRoundsUpToPowerOfTwo() {
        #expect(SampleRing(minimumCapacity: 1).capacity == 1)
        #expect(SampleRing(minimumCapacity: 100).capacity == 128)
        #expect(SampleRing(minimumCapacity: 128).capacity == 128)
    }

    @Test func writesWhatFitsAndReadsInOrderAcrossTheWrap() {
        let ring = SampleRing(minimumCapacity: 8)
        var out = [Float](repeating: -1, count: 8)
        // Advance the indices so the next write wraps.
        #expect([Float](repeating: 0, count: 6).withUnsafeBufferPointer { ring.write($0) } == 6)
        #expect(out.withUnsafeMutableBufferPointer { ring.read(into: $0) } == 6)

        let input: [Float] = (1...10).map(Float.init)
        #expect(input.withUnsafeBufferPointer { ring.write($0) } == 8, "only the capacity fits")
        #expect(ring.availableToRead == 8)
        #expect(ring.availableToWrite == 0)
        #expect(input.withUnsafeBufferPointer { ring.write($0) } == 0, "a full ring takes nothing")

        var first = [Float](repeating: 0, count: 3)
        #expect(first.withUnsafeMutableBufferPointer { ring.read(into: $0) } == 3)
        #expect(first == [1, 2, 3])
        #expect(out.withUnsafeMutableBufferPointer { ring.read(into: $0) } == 5)
        #expect(Array(out[0..<5]) == [4, 5, 6, 7, 8])
        #expect(out.withUnsafeMutableBufferPointer { ring.read(into: $0) } == 0, "an empty ring gives nothing")
    }

    @Test func twoThreadStressDeliversEverySampleInOrder() async {
        let ring = SampleRing(minimumCapacity: 1024)
        let total = 2_000_000
        let producer = Thread {
            var next = 0
            var block = [Float](repeating: 0, count: 333)
            while next < total {
                let count = min(block.count, total - next)
                for i in 0..<count { block[i] = Float(next + i) }  // exact: all values < 2^24
                let written = block.withUnsafeBufferPointer { ring.write(UnsafeBufferPointer(rebasing: $0[0..<count])) }
                next += written
                if written == 0 { sched_yield() }
            }
        }
        producer.start()
        var expected = 0
        var mismatches = 0
        var block = [Float](repeating: 0, count: 257)
        let deadline = Date().addingTimeInterval(30)
        while expected < total && Date() < deadline {
            let got = block.withUnsafeMutableBufferPointer { ring.read(into: $0) }
            for i in 0..<got where block[i] != Float(expected + i) { mismatches += 1 }
            expected += got
            if got == 0 { sched_yield() }
        }
        #expect(expected == total)
        #expect(mismatches == 0)
    }

    @Test func chunkRingCarriesInfoAndRefusesWhenFull() {
        let ring = ChunkRing(channels: 2, maxChunkFrames: 4, minimumChunks: 2)
        #expect(ring.chunkCapacity == 2)
        let chunk: [Float] = [1, 2, 3, 4, 5, 6, 7, 8]
        let a = ChunkInfo(firstFrameIndex: 0, frames: 4, timestampNanos: 10)
        let b = ChunkInfo(firstFrameIndex: 4, frames: 3, timestampNanos: 20)
        #expect(chunk.withUnsafeBufferPointer { ring.push($0, info: a) })
        #expect(chunk.withUnsafeBufferPointer { ring.push($0, info: b) })
        #expect(!chunk.withUnsafeBufferPointer { ring.push($0, info: a) }, "third chunk does not fit")

        var out = [Float](repeating: 0, count: 8)
        #expect(out.withUnsafeMutableBufferPointer { ring.read(into: $0, timeoutNanos: 0) } == a)
        #expect(out == chunk)
        out = [Float](repeating: 0, count: 8)
        #expect(out.withUnsafeMutableBufferPointer { ring.read(into: $0, timeoutNanos: 0) } == b)
        #expect(out == [1, 2, 3, 4, 5, 6, 0, 0], "a 3-frame stereo chunk is 6 samples")
    }

    @Test func chunkRingReadTimesOutThenDrainsAfterFinish() {
        let ring = ChunkRing(channels: 1, maxChunkFrames: 2, minimumChunks: 4)
        var out = [Float](repeating: 0, count: 2)
        let start = MonotonicClock.nowNanos()
        #expect(out.withUnsafeMutableBufferPointer { ring.read(into: $0, timeoutNanos: 50_000_000) } == nil)
        let waited = MonotonicClock.nowNanos() - start
        #expect(waited >= 45_000_000 && waited < 2_000_000_000)

        let info = ChunkInfo(firstFrameIndex: 0, frames: 2, timestampNanos: 1)
        #expect([Float](arrayLiteral: 7, 8).withUnsafeBufferPointer { ring.push($0, info: info) })
        ring.finish()
        #expect(!ring.isDrained)
        #expect(out.withUnsafeMutableBufferPointer { ring.read(into: $0, timeoutNanos: 0) } == info)
        #expect(out == [7, 8])
        #expect(out.withUnsafeMutableBufferPointer { ring.read(into: $0, timeoutNanos: 1_000_000_000) } == nil)
        #expect(ring.isDrained)
    }

    @Test func aReadWithTheLongestTimeoutWaitsForAChunk() {
        let ring = ChunkRing(channels: 1, maxChunkFrames: 4, minimumChunks: 2)
        DispatchQueue.global().asyncAfter(deadline: .now() + 0.2) {
            _ = [Float](repeating: 1, count: 4).withUnsafeBufferPointer {
                ring.push($0, info: ChunkInfo(firstFrameIndex: 0, frames: 4, timestampNanos: 1))
            }
        }
        var out = [Float](repeating: 0, count: 4)
        let info = out.withUnsafeMutableBufferPointer { ring.read(into: $0, timeoutNanos: .max) }
        #expect(info?.frames == 4, "read(timeoutNanos: .max) returned without the chunk")
    }

    @Test func blockedReaderWakesWhenAChunkArrives() async {
        let ring = ChunkRing(channels: 1, maxChunkFrames: 1, minimumChunks: 2)
        let pusher = Thread {
            usleep(50_000)
            _ = [Float](arrayLiteral: 42).withUnsafeBufferPointer {
                ring.push($0, info: ChunkInfo(firstFrameIndex: 9, frames: 1, timestampNanos: 0))
            }
        }
        pusher.start()
        var out: [Float] = [0]
        let info = out.withUnsafeMutableBufferPointer { ring.read(into: $0, timeoutNanos: 5_000_000_000) }
        #expect(info?.firstFrameIndex == 9)
        #expect(out == [42])
    }
}
