import Testing
import MeshAudio
@testable import MeshPipeline

@Suite("Relay codec and packetizer")
struct RelayCodecTests {
    @Test func roundTripAndLayout() throws {
        let fmt = AudioFormat(sampleRate: 48_000, channels: 2)
        let samples: [Float] = (0..<20).map { Float($0) * 0.25 - 2 }
        let h = AudioPacketHeader(sequence: 0xDEAD_BEEF, firstFrameIndex: 0x0102_0304_0506_0708, frameCount: 10,
                                  format: fmt, captureTimeNanos: 42, hostLatencyFrames: 256)
        let bytes = try AudioPacket.encode(h, samples: samples)
        #expect(bytes.count == 36 + 80)
        #expect(Array(bytes[0..<8]) == [0x4D, 0x41, 1, 1, 0xDE, 0xAD, 0xBE, 0xEF])
        #expect(Array(bytes[8..<16]) == [1, 2, 3, 4, 5, 6, 7, 8])
        #expect(Array(bytes[16..<24]) == [0, 10, 2, 1, 0, 0, 0xBB, 0x80])
        #expect(Array(bytes[32..<36]) == [0, 0, 1, 0])
        // Sample 0 = -2.0 = 0xC0000000, little-endian.
        #expect(Array(bytes[36..<40]) == [0, 0, 0, 0xC0])
        let (h2, s2) = try AudioPacket.decode(bytes)
        #expect(h2 == h)
        // The wire carries what was sent; the decoder hands on only full-scale samples.
        #expect(s2 == samples.map { min(max($0, -1), 1) })
    }

    @Test func sizeLimits() throws {
        #expect(AudioPacket.maximumFrames(for: .default) == 287)
        #expect(AudioPacket.maximumFrames(for: AudioFormat(sampleRate: 48_000, channels: 2)) == 143)
        let fmt = AudioFormat(sampleRate: 48_000, channels: 2)
        let tooMany = AudioPacketHeader(sequence: 0, firstFrameIndex: 0, frameCount: 146, format: fmt)
        #expect(throws: AudioPacketError.tooLarge(36 + 146 * 8)) {
            _ = try AudioPacket.encode(tooMany, samples: [Float](repeating: 0, count: 292))
        }
    }

    @Test func typedErrors() throws {
        let good = try AudioPacket.encode(
            AudioPacketHeader(sequence: 1, firstFrameIndex: 0, frameCount: 4, format: .default), samples: [0, 1, 2, 3])
        func err(_ b: [UInt8]) -> AudioPacketError? {
            do { _ = try AudioPacket.decode(b); return nil } catch { return error }
        }
        #expect(err([]) == .truncated(0))
        #expect(err(Array(good.prefix(20))) == .truncated(20))
        #expect(err(Array(good.dropLast())) == .lengthMismatch(expected: 52, actual: 51))
        var b = good; b[0] = 0x00
        #expect(err(b) == .badMagic)
        b = good; b[2] = 2
        #expect(err(b) == .unsupportedVersion(2))
        b = good; b[3] = 7
        #expect(err(b) == .unknownKind(7))
        b = good; b[18] = 9
        #expect(err(b) == .unsupportedFormat)
        b = good; b[16] = 0; b[17] = 0
        #expect(err(b) == .badFrameCount(0))
    }

    @Test func samplesFromTheNetworkAreClampedAndNonFiniteOnesZeroed() throws {
        let h = AudioPacketHeader(sequence: 1, firstFrameIndex: 0, frameCount: 5, format: .default)
        var b = try AudioPacket.encode(h, samples: [0.5, 0.25, -0.25, 0, 0])
        b[36...39] = [0, 0, 0xC0, 0x7F]                                   // NaN
        b[40...43] = [0, 0, 0x80, 0x7F]                                   // +∞
        b[44...47] = [0xFF, 0xFF, 0x7F, 0xFF]                             // −FLT_MAX
        b[48...51] = [0xFF, 0xFF, 0x7F, 0x7F]                             // +FLT_MAX
        var out = [Float](repeating: 9, count: 5)
        let changed = try b.withUnsafeBytes { raw in
            try out.withUnsafeMutableBufferPointer { try AudioPacket.decodeSamples(raw, header: h, into: $0) }
        }
        #expect(out == [0, 0, -1, 1, 0] && changed == 4)
    }

    @Test func fuzzNeverTrapsAndEverythingIsCounted() throws {
        var rng = RelayRNG(seed: 7)
        let pipeline = try PlayoutPipeline(format: .default, configuration: .init(mode: .low), sink: VirtualTimeSink())
        var p = try Packetizer(format: .default)
        let valid = p.packets(relaySine(start: 0, count: 200), chunk: ChunkInfo(firstFrameIndex: 0, frames: 200, timestampNanos: 0))[0]
        var failures = 0, successes = 0, queued = 0, otherFormat = 0
        for i in 0..<20_000 {
            var bytes: [UInt8]
            switch i % 4 {
            case 0: bytes = (0..<Int.random(in: 0...1300, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            case 1:
                bytes = valid
                for _ in 0..<Int.random(in: 1...6, using: &rng) {
                    bytes[Int.random(in: 0..<bytes.count, using: &rng)] = UInt8.random(in: 0...255, using: &rng)
                }
            case 2: bytes = Array(valid.prefix(Int.random(in: 0..<valid.count, using: &rng)))
            default:
                bytes = valid + (0..<Int.random(in: 1...400, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            }
            let decodes = (try? AudioPacket.decode(bytes)) != nil
            // The ingress stage decodes once: a packet that decodes is taken (queued, or reported as another
            // format), anything else is malformed.
            let outcome = bytes.withUnsafeBytes { pipeline.receive($0, arrivalNanos: UInt64(i)) }
            let ok: Bool
            switch outcome {
            case .queued: ok = true; queued += 1
            case .formatChanged: ok = true; otherFormat += 1
            case .malformed, .ringFull, .stale, .undecoded: ok = false
            }
            #expect(ok == decodes)
            if decodes { successes += 1 } else { failures += 1 }
            if i % 256 == 0 {  // keep the ring drained
                var out = [Float](repeating: 0, count: 128)
                out.withUnsafeMutableBufferPointer { pipeline.renderer.render(into: $0, context: RenderContext(frames: 128, deviceDelayFrames: 0, nowNanos: UInt64(i))) }
            }
        }
        #expect(pipeline.stats.malformed == UInt64(failures))
        #expect(pipeline.stats.formatMismatches == UInt64(otherFormat) && queued + otherFormat == successes)
        #expect(failures > 15_000)
        #expect(failures + successes == 20_000)
    }

    @Test func packetizerOnePeriodOnePacket() throws {
        var p = try Packetizer(format: .default, firstSequence: 5)
        let pk = p.packets(relaySine(start: 0, count: 128), chunk: ChunkInfo(firstFrameIndex: 1000, frames: 128, timestampNanos: 9))
        #expect(pk.count == 1)
        let (h, s) = try AudioPacket.decode(pk[0])
        #expect(h.sequence == 5 && h.firstFrameIndex == 1000 && h.frameCount == 128 && h.captureTimeNanos == 9)
        #expect(s == relaySine(start: 0, count: 128))
        #expect(p.nextSequence == 6)
    }

    @Test(arguments: [(256, [128, 128]), (1000, [143, 143, 143, 143, 143, 143, 142]), (143, [143]), (145, [73, 72]), (146, [73, 73])])
    func packetizerSplits48kStereo(frames: Int, sizes: [Int]) throws {
        let fmt = AudioFormat(sampleRate: 48_000, channels: 2)
        var p = try Packetizer(format: fmt, firstSequence: UInt32.max)
        let input = relaySine(start: 0, count: frames, channels: 2, rate: 48_000)
        let pk = p.packets(input, chunk: ChunkInfo(firstFrameIndex: UInt64.max - 100, frames: frames, timestampNanos: 0))
        #expect(pk.map { (try? AudioPacket.decode($0))?.header.frameCount ?? -1 } == sizes)
        var next = UInt64.max - 100, seq = UInt32.max, joined: [Float] = []
        for b in pk {
            #expect(b.count <= AudioPacket.maximumSize && AudioPacket.maximumSize == 1184)
            let (h, s) = try AudioPacket.decode(b)
            #expect(h.firstFrameIndex == next && h.sequence == seq && h.format == fmt)
            next &+= UInt64(h.frameCount); seq &+= 1
            joined += s
        }
        #expect(joined == input)
    }

    @Test func packetRingSPSCOrderAndFull() throws {
        let ring = PacketRing(capacity: 4)
        var p = try Packetizer(format: .default)
        var pushed: [[UInt8]] = []
        for k in 0..<5 {
            let b = p.packets(relaySine(start: k * 64, count: 64), chunk: ChunkInfo(firstFrameIndex: UInt64(k * 64), frames: 64, timestampNanos: 0))[0]
            let h = try AudioPacket.decode(b).header
            let r = b.withUnsafeBytes { ring.push(header: h, payload: $0, arrivalNanos: UInt64(k)) }
            #expect(r == (k < 4 ? .pushed(sanitized: 0) : .full))
            pushed.append(b)
        }
        for k in 0..<4 {
            let got = ring.pop { pkt, s in (pkt.header.firstFrameIndex, pkt.arrivalNanos, Array(s)) }
            #expect(got?.0 == UInt64(k * 64) && got?.1 == UInt64(k) && got?.2 == relaySine(start: k * 64, count: 64))
        }
        #expect(ring.pop { _, _ in 0 } == nil)
        #expect(ring.count == 0)
    }
}
