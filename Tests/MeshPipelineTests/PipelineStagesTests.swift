import MeshTestSupport
import Testing
import Foundation
import Synchronization
import MeshAudio
@testable import MeshPipeline
import MeshPOSIX

/// A value a stage's thread writes and the test reads.
final class Shared<Value: Sendable>: Sendable {
    private let value: Mutex<Value>
    init(_ value: Value) { self.value = Mutex(value) }
    var current: Value { value.withLock { $0 } }
    func update(_ body: @Sendable (inout Value) -> Void) { value.withLock { body(&$0) } }
}

/// Waits until `condition` holds or `seconds` pass.
func waitUntil(_ seconds: Double = 5, _ condition: () -> Bool) -> Bool { eventually(seconds, condition) }

/// The ingress stage and both assemblies.
@Suite("Ingress and pipeline assemblies")
struct PipelineStagesTests {
    // MARK: PacketIngress

    @Test func ingressQueuesDecodedPacketsOfItsFormat() throws {
        let ring = PacketRing(capacity: 2)
        let ingress = PacketIngress(format: .default, ring: ring)
        let header = AudioPacketHeader(sequence: 7, firstFrameIndex: 100, frameCount: 4, format: .default,
                                       captureTimeNanos: 5, hostLatencyFrames: 64)
        let bytes = try AudioPacket.encode(header, samples: [0.1, 0.2, 0.3, 0.4])
        #expect(bytes.withUnsafeBytes { ingress.receive($0, arrivalNanos: 42) } == .queued(frames: 4))
        let popped = ring.pop { packet, samples in (packet, Array(samples)) }
        #expect(popped?.0 == ReceivedPacket(header: header, arrivalNanos: 42))
        #expect(popped?.1 == [0.1, 0.2, 0.3, 0.4])
        #expect(ingress.counters == PacketIngress.Counters())
        #expect(ingress.wire.queuedBytes == 36 + 16 && ingress.wire.encoding == .float32, "one Float32 packet of 52 bytes")
        #expect(ingress.takePendingFormat() == nil)
    }

    @Test func ingressCountsWhatItDropsAndReportsAFormatChangeOnce() throws {
        let ring = PacketRing(capacity: 1)
        let ingress = PacketIngress(format: .default, ring: ring)
        let good = try AudioPacket.encode(AudioPacketHeader(sequence: 0, firstFrameIndex: 0, frameCount: 2, format: .default),
                                          samples: [0, 0])
        var nan = good
        nan[36...39] = [0, 0, 0xC0, 0x7F]
        let stereo = AudioFormat(sampleRate: 48_000, channels: 2)
        let other = try AudioPacket.encode(AudioPacketHeader(sequence: 0, firstFrameIndex: 0, frameCount: 1, format: stereo),
                                           samples: [0, 0])
        func receive(_ bytes: [UInt8]) -> PacketIngress.Outcome { bytes.withUnsafeBytes { ingress.receive($0, arrivalNanos: 1) } }
        #expect(receive([1, 2, 3]) == .malformed(.truncated(3)))
        #expect(receive(other) == .formatChanged(stereo))
        #expect(receive(nan) == .queued(frames: 2), "a NaN is zeroed and counted, not a reason to drop the packet")
        #expect(receive(good) == .ringFull)
        var expected = PacketIngress.Counters()
        expected.malformed = 1
        expected.sanitizedSamples = 1
        expected.formatMismatches = 1
        expected.ringOverflows = 1
        #expect(ingress.counters == expected)
        #expect(ingress.wire.queuedBytes == UInt64(nan.count), "only the queued packet counts on the wire")
        #expect(ingress.takePendingFormat() == stereo)
        #expect(ingress.takePendingFormat() == nil, "each report is taken once")
    }

    @Test(arguments: [AudioFormat.default, AudioFormat(sampleRate: 192_000, channels: 8), AudioFormat(sampleRate: 8_000, channels: 2)])
    func formatsFitOneAtomicWord(format: AudioFormat) {
        #expect(PackedFormat.pack(format) != 0)
        #expect(PackedFormat.unpack(PackedFormat.pack(format)) == format)
        #expect(PackedFormat.unpack(0) == nil)
    }

    // MARK: Assemblies

    @Test func thePlayoutPipelineStartsAndStopsItsSink() throws {
        final class RecordingSink: AudioSink, Sendable {
            let format = AudioFormat.default
            let periodFrames = 128
            let started = Shared(false), stopped = Shared(false)
            func start(renderer: any AudioRenderer) throws { started.update { $0 = true } }
            func stop() { stopped.update { $0 = true } }
            var stats: AudioStats { AudioStats() }
        }
        let sink = RecordingSink()
        let pipeline = try PlayoutPipeline(format: .default, sink: sink)
        try pipeline.start()
        #expect(sink.started.current && !sink.stopped.current)
        pipeline.stop()
        #expect(sink.stopped.current)
    }

    @Test("A pipeline another thread feeds (the host's talkback) takes a burst of 256 packets, on a sink that could read its own input too; one its sink reads keeps the small ring")
    func aPushedPipelineTakesABurst() throws {
        final class ServingSink: AudioSink, Sendable {
            let format = AudioFormat.default
            let periodFrames = 128
            var servesInput: Bool { true }
            func start(renderer: any AudioRenderer) throws {}
            func stop() {}
            var stats: AudioStats { AudioStats() }
        }
        func burst(into pipeline: PlayoutPipeline) throws -> Int {
            var queued = 0
            for i in 0..<256 {
                let header = AudioPacketHeader(sequence: UInt32(i), firstFrameIndex: UInt64(i) * 128, frameCount: 128, format: .default)
                let bytes = try AudioPacket.encode(header, samples: [Float](repeating: 0.1, count: 128))
                if case .queued = bytes.withUnsafeBytes({ pipeline.receive($0, arrivalNanos: UInt64(i)) }) { queued += 1 }
            }
            return queued
        }
        let pushed = try PlayoutPipeline(format: .default, sink: ServingSink())
        try pushed.start()
        #expect(try burst(into: pushed) == 256, "nothing of a burst dropped before the render end could take it out")
        let reading = try PlayoutPipeline(format: .default, sink: ServingSink(), readingInput: true)
        #expect(try burst(into: reading) == 32, "the sink's thread takes each batch in before it reads the next")
    }

    @Test func droppingARunningPlayoutPipelineStopsItsSink() throws {
        final class RecordingSink: AudioSink, Sendable {
            let format = AudioFormat.default
            let periodFrames = 128
            let stopped = Shared(false)
            func start(renderer: any AudioRenderer) throws {}
            func stop() { stopped.update { $0 = true } }
            var stats: AudioStats { AudioStats() }
        }
        let sink = RecordingSink()
        do {
            let pipeline = try PlayoutPipeline(format: .default, sink: sink)
            try pipeline.start()
        }
        #expect(sink.stopped.current, "the pipeline went without stopping its sink")
    }

    @Test func droppingARunningPipelineWhoseSinkReadsItsSourceEndsTheSinksThread() throws {
        /// Always readable (a pipe holding a byte never read), and reads nothing.
        final class AlwaysReadable: PacketSource, @unchecked Sendable {
            let fds: [Int32]
            let reads = Atomic<Int>(0)
            init() {
                var f: [Int32] = [-1, -1]
                _ = pipe(&f)
                var b: UInt8 = 1
                _ = write(f[1], &b, 1)
                fds = f
            }
            deinit { fds.forEach { close($0) } }
            var descriptor: Int32 { fds[0] }
            func read(into ingress: PacketIngress) { reads.add(1, ordering: .relaxed) }
        }
        let path = NSTemporaryDirectory() + "pm-dropped-\(getpid()).wav"
        defer { unlink(path) }
        let source = AlwaysReadable()
        do {
            let sink = try WAVFileSink(path: path, format: .default, periodFrames: 128, realtime: true)
            let pipeline = try PlayoutPipeline(format: .default, sink: sink, readingInput: true)
            try pipeline.start(reading: source)
            let reading = waitUntil { source.reads.load(ordering: .relaxed) >= 1000 }
            #expect(reading)
        }
        let readsWhenDropped = source.reads.load(ordering: .relaxed)
        usleep(50_000)
        let readsLater = source.reads.load(ordering: .relaxed)
        #expect(readsLater == readsWhenDropped, "the sink's thread still reads the dropped pipeline's source")
    }

    @Test(arguments: [CapturePipeline<String>.SendThread.own, .source])
    func theCapturePipelinePacketizesOnlyWhatSomeoneHears(on thread: CapturePipeline<String>.SendThread) throws {
        let tone = try ToneSource(frequency: 440, format: .default, periodFrames: 128, realtime: false)
        let listening = Shared(false)
        let sent = Shared<[[UInt8]]>([])
        let sendThread = Shared("")
        let capture = try CapturePipeline<String>(source: tone, sendThread: thread, withAudience: { use in if listening.current { use("player") } }) { bytes, who in
            let packet = Array(bytes)
            let name = (try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)) ?? ""
            sendThread.update { $0 = name.trimmingCharacters(in: .newlines) }
            sent.update { $0.append(packet) }
            return who == "player" ? 1 : 0
        }
        try capture.start()
        #expect(waitUntil { capture.statistics.framesCaptured >= 128 * 20 })
        #expect(sent.current.isEmpty && capture.statistics.packetsSent == 0)
        listening.update { $0 = true }
        #expect(waitUntil { sent.current.count >= 10 })
        capture.stop()
        let stats = capture.statistics
        let packets = sent.current
        #expect(stats.packetsSent == UInt64(packets.count))
        let sequences = try packets.map { try AudioPacket.decode($0).header.sequence }
        #expect(sequences == (0..<UInt32(packets.count)).map { $0 }, "numbered from 0: the unheard chunks took none")
        #expect(stats.framesCaptured >= 128 * 30)
        #expect(abs(stats.peakLevel - 0.5) < 0.01 && stats.rmsLevel > 0.3)
        #expect(sendThread.current == (thread == .own ? "pm-send" : "pm-source"))
    }
}
