import Testing
import Foundation
import MeshAudio
@testable import MeshPipeline

@Suite("Int16 wire encoding (--codec s16) and its TPDF dither")
struct SampleEncodingTests {
    @Test func int16PacketLayoutAndRoundTrip() throws {
        let n = 128
        let samples: [Float] = (0..<n).map { 0.5 * sinf(2 * .pi * Float($0) * 440 / 44_100) }
        let h = AudioPacketHeader(sequence: 9, firstFrameIndex: 1_000, frameCount: n, format: .default,
                                  captureTimeNanos: 5, hostLatencyFrames: 64, encoding: .int16)
        let bytes = try AudioPacket.encode(h, samples: samples)
        #expect(bytes.count == 36 + 2 * n)
        #expect(bytes[19] == 2)
        let (h2, s2) = try AudioPacket.decode(bytes)
        #expect(h2 == h)
        #expect(h2.format == .default)   // the decoded format is the pipeline's Float32, whatever the wire carries
        // Rounding plus TPDF dither: each sample within 1.5 LSB of what was sent.
        let worst = zip(samples, s2).map { abs($0 - $1) }.max() ?? 1
        #expect(worst <= 1.5 / 32768)
    }

    @Test func int16PacketsCarryTwiceTheFrames() throws {
        #expect(AudioPacket.maximumFrames(for: .default, encoding: .int16) == 574)
        #expect(AudioPacket.maximumFrames(for: AudioFormat(sampleRate: 48_000, channels: 2), encoding: .int16) == 287)
        #expect(AudioPacket.maximumSamples == 574)
        var p = try Packetizer(format: .default, encoding: .int16)
        #expect(p.maximumFramesPerPacket == 574)
        let chunk = ChunkInfo(firstFrameIndex: 0, frames: 1_000, timestampNanos: 0)
        let packets = p.packets([Float](repeating: 0.1, count: 1_000), chunk: chunk)
        #expect(packets.map(\.count) == [36 + 1_000, 36 + 1_000])
        let headers = try packets.map { try AudioPacket.decode($0).header }
        #expect(headers.map(\.frameCount) == [500, 500])
        #expect(headers.map(\.encoding) == [.int16, .int16])
        #expect(headers.map(\.firstFrameIndex) == [0, 500])
    }

    @Test func int16DecodingRejectsWrongLengthsAndUnknownEncodings() throws {
        let good = try AudioPacket.encode(
            AudioPacketHeader(sequence: 1, firstFrameIndex: 0, frameCount: 4, format: .default, encoding: .int16),
            samples: [0, 0.5, -0.5, 1])
        #expect(good.count == 44)
        func err(_ b: [UInt8]) -> AudioPacketError? {
            do { _ = try AudioPacket.decode(b); return nil } catch { return error }
        }
        #expect(err(good) == nil)
        #expect(err(Array(good.dropLast())) == .lengthMismatch(expected: 44, actual: 43))
        // The same header read as Float32 needs 16 bytes of samples, not 8.
        var b = good; b[19] = 1
        #expect(err(b) == .lengthMismatch(expected: 52, actual: 44))
        b = good; b[19] = 3
        #expect(err(b) == .unsupportedFormat)
        b = good; b[19] = 0
        #expect(err(b) == .unsupportedFormat)
    }

    @Test func fullScaleAndNonFiniteSamplesQuantizeSafely() {
        var d = TPDFDither(seed: 1)
        for _ in 0..<1_000 {
            #expect(d.quantize(1) == 32767)
            #expect(d.quantize(4) == 32767)
            // −1 is −32768 LSB: the dither may lift it by one, never beyond the range.
            #expect((-32768 ... -32767).contains(d.quantize(-1)))
            #expect((-32768 ... -32767).contains(d.quantize(-.infinity)))
            #expect(abs(Int(d.quantize(.nan))) <= 1)
            #expect(abs(Int(d.quantize(0))) <= 1)
        }
        // −32768 is exactly −1 after decoding; nothing decodes beyond full scale.
        let lowest: Float = Float(Int16.min) * (1 / 32768)
        #expect(lowest == -1)
    }

    @Test func ditherIsTriangularAndLeavesNoDeadZone() {
        var d = TPDFDither(seed: 42)
        let count = 200_000
        // A constant a quarter of an LSB: plain rounding would give 0 every time (a dead zone); TPDF dither keeps
        // the mean at the input.
        var sum = 0, histogram = [Int: Int]()
        for _ in 0..<count {
            let q = Int(d.quantize(0.25 / 32768))
            sum += q
            histogram[q, default: 0] += 1
        }
        let mean = Double(sum) / Double(count)
        #expect(abs(mean - 0.25) < 0.01)
        #expect(Set(histogram.keys).isSubset(of: [-1, 0, 1]))
        // The error of TPDF dither at 2 LSB peak-to-peak has variance 1/4 (dither 1/6 + rounding 1/12) LSB².
        var error2 = 0.0
        var e = TPDFDither(seed: 7)
        for i in 0..<count {
            let x = Float(i % 1_000) / 1_000 * 0.9 - 0.45
            let err = Double(e.quantize(x)) - Double(x) * 32768
            error2 += err * err
        }
        let variance = error2 / Double(count)
        #expect(abs(variance - 0.25) < 0.02)
    }

    @Test func ingressFollowsTheEncodingPacketByPacketAndCountsWireBytes() throws {
        let ring = PacketRing(capacity: 8)
        let ingress = PacketIngress(format: .default, ring: ring)
        #expect(ingress.wire.encoding == nil)
        let f32 = try AudioPacket.encode(
            AudioPacketHeader(sequence: 0, firstFrameIndex: 0, frameCount: 128, format: .default),
            samples: [Float](repeating: 0.25, count: 128))
        let s16 = try AudioPacket.encode(
            AudioPacketHeader(sequence: 1, firstFrameIndex: 128, frameCount: 128, format: .default, encoding: .int16),
            samples: [Float](repeating: 0.25, count: 128))
        #expect(f32.withUnsafeBytes { ingress.receive($0, arrivalNanos: 1) } == .queued(frames: 128))
        #expect(ingress.wire.encoding == .float32)
        #expect(s16.withUnsafeBytes { ingress.receive($0, arrivalNanos: 2) } == .queued(frames: 128))
        let w = ingress.wire
        #expect(w.encoding == .int16)
        #expect(w.queuedBytes == UInt64(f32.count + s16.count))
        #expect(w.queuedBytes == UInt64(36 + 512 + 36 + 256))
        #expect(ingress.counters == PacketIngress.Counters())
        // Both arrive as Float32 in the ring, the Int16 one within an LSB.
        var got: [[Float]] = []
        while let s = ring.pop({ Array($1) }) { got.append(s) }
        #expect(got.count == 2)
        #expect(got[0].allSatisfy { $0 == 0.25 })
        #expect(got[1].allSatisfy { abs($0 - 0.25) <= 1 / 32768 })
    }

    @Test func codecNames() {
        #expect(SampleEncoding(name: "f32") == .float32)
        #expect(SampleEncoding(name: "s16") == .int16)
        #expect(SampleEncoding(name: "opus") == .opus)
        #expect(SampleEncoding(name: "mp3") == nil)
        #expect(SampleEncoding.allCases.map(\.description) == ["f32", "s16", "opus"])
    }
}
