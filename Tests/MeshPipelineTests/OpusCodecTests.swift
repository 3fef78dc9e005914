import Testing
import Foundation
import MeshAudio
@testable import MeshPipeline
import MeshTestSupport

/// The decoder's sequence tracker: pure, no libopus.
@Suite("Opus sequence tracking (pure)")
struct OpusSequenceTests {
    @Test func theFirstPacketStartsTheDecoderAndTheNextOnesFollow() {
        var s = OpusSequence()
        #expect(s.arrived(10) == .restart)
        #expect(s.arrived(11) == .decode(concealFirst: 0))
        #expect(s.arrived(12) == .decode(concealFirst: 0))
    }

    @Test func aShortGapIsConcealedAndALongOneRestarts() {
        var s = OpusSequence()
        _ = s.arrived(100)
        #expect(s.arrived(102) == .decode(concealFirst: 1))
        #expect(s.arrived(102 + 9) == .decode(concealFirst: OpusSequence.maximumConcealedPackets))
        #expect(s.arrived(111 + 10) == .restart, "9 missing: more than the decoder conceals")
        #expect(s.arrived(122) == .decode(concealFirst: 0))
    }

    @Test func packetsTheDecoderIsPastAreStaleAndAFarJumpBackIsANewStream() {
        var s = OpusSequence()
        _ = s.arrived(500)
        _ = s.arrived(501)
        #expect(s.arrived(501) == .stale, "a duplicate")
        #expect(s.arrived(499) == .stale, "reordered: the decoder moved on")
        #expect(s.arrived(502) == .decode(concealFirst: 0), "stale packets change nothing")
        #expect(s.arrived(3) == .restart, "the host restarted from 0")
        #expect(s.arrived(4) == .decode(concealFirst: 0))
    }

    @Test func sequenceNumbersWrap() {
        var s = OpusSequence()
        _ = s.arrived(UInt32.max - 1)
        #expect(s.arrived(UInt32.max) == .decode(concealFirst: 0))
        #expect(s.arrived(1) == .decode(concealFirst: 1), "0 is missing across the wrap")
        #expect(s.arrived(UInt32.max) == .stale)
    }
}

/// `--codec opus` end to end without a network: packetizer → packets → ingress (libopus) → ring.
@Suite("Opus codec: packets, decoding, concealment, hostile packets")
struct OpusCodecTests {
    static let wire48k = AudioFormat(sampleRate: 48_000, channels: 1)

    /// `seconds` of a 440 Hz tone at 44.1 kHz, in 128-frame chunks, through an Opus packetizer.
    static func tonePackets(seconds: Double = 0.5, bitrate: Int = Packetizer.defaultOpusBitrate) throws -> [[UInt8]] {
        var p = try Packetizer(format: .default, encoding: .opus, opusBitrate: bitrate)
        let total = Int(seconds * 44_100) / 128 * 128
        let tone = (0..<total).map { 0.5 * sinf(2 * .pi * 440 * Float($0) / 44_100) }
        var packets: [[UInt8]] = []
        for c in stride(from: 0, to: total, by: 128) {
            let chunk = ChunkInfo(firstFrameIndex: UInt64(c), frames: 128, timestampNanos: 1_000_000_000 + UInt64(c) * 1_000_000_000 / 44_100)
            packets += p.packets(Array(tone[c..<(c + 128)]), chunk: chunk)
        }
        return packets
    }

    /// Pops everything in `ring`: the packets and their samples.
    static func drain(_ ring: PacketRing) -> [(ReceivedPacket, [Float])] {
        var out: [(ReceivedPacket, [Float])] = []
        while let p = ring.pop({ ($0, Array($1)) }) { out.append(p) }
        return out
    }

    @Test func theHostSends48kHzFramesOf2_5msNumberedAndTimedInOrder() throws {
        let packets = try Self.tonePackets(seconds: 0.5)
        let headers = try packets.map { try $0.withUnsafeBytes { try AudioPacket.decodeHeader($0) } }
        // 0.5 s (22 016 frames at 44.1 kHz) is 23 963 frames at 48 kHz: 199 whole 120-frame packets.
        #expect(headers.count >= 198 && headers.count <= 200)
        #expect(headers.allSatisfy { $0.encoding == .opus && $0.format == Self.wire48k && $0.frameCount == 120 })
        #expect(headers.map(\.sequence) == (0..<UInt32(headers.count)).map { $0 })
        let expected: [UInt64] = (0..<UInt64(headers.count)).map { $0 * 120 }
        #expect(headers.map(\.firstFrameIndex) == expected)
        let gaps = zip(headers, headers.dropFirst()).map { Int64($1.captureTimeNanos) - Int64($0.captureTimeNanos) }
        #expect(gaps.allSatisfy { abs($0 - 2_500_000) < 2_000 }, "2.5 ms apart on the host's clock")
        // The first packet's sound entered the encoder its look-ahead (2.5 ms) before the stream's first frame.
        #expect(abs(Int64(headers[0].captureTimeNanos) - (1_000_000_000 - 2_500_000)) < 50_000)
        // Compact: 96 kbit/s is 30 bytes per 2.5 ms frame, give or take the encoder's rate control.
        let payload = packets.map { $0.count - AudioPacket.headerSize }
        let mean = Double(payload.reduce(0, +)) / Double(payload.count)
        #expect(mean > 20 && mean < 40, "mean Opus payload \(mean) B")
    }

    /// The headers of the Opus packets for 200 chunks of 128 frames of a tone at `rate`, the source losing `lost`
    /// frames before chunk `gapChunk` (a capture overrun).
    static func headersAcrossACaptureGap(lost: UInt64, rate: Int, at gapChunk: Int = 100) throws -> [AudioPacketHeader] {
        var p = try Packetizer(format: AudioFormat(sampleRate: rate, channels: 1), encoding: .opus)
        let tone = (0..<128).map { 0.5 * sinf(2 * .pi * 440 * Float($0) / Float(rate)) }
        var packets: [[UInt8]] = []
        var index: UInt64 = 0
        for c in 0..<200 {
            if c == gapChunk { index += lost }
            let chunk = ChunkInfo(firstFrameIndex: index, frames: 128, timestampNanos: 1_000_000_000 + index * 1_000_000_000 / UInt64(rate))
            packets += p.packets(tone, chunk: chunk)
            index += 128
        }
        let headers = try packets.map { try $0.withUnsafeBytes { try AudioPacket.decodeHeader($0) } }
        #expect(headers.map(\.sequence) == (0..<UInt32(headers.count)).map { $0 }, "no sequence number is skipped")
        // Every packet's capture time is where its frames sit on the host's clock, across the gap too.
        for (a, b) in zip(headers, headers.dropFirst()) {
            let expected = Double(b.firstFrameIndex - a.firstFrameIndex) * 1e9 / 48_000
            #expect(abs(Double(b.captureTimeNanos) - Double(a.captureTimeNanos) - expected) < 30_000, "packet \(b.sequence)")
        }
        return headers
    }

    @Test("A capture gap is a gap on the wire too: at 48 kHz (no resampler: exact), 1792 frames lost drop the 80 frames of the frame begun, and the next packet starts 1792 + 80 frames after the last one's end; a gap that fits in the frame begun is silence inside it; at 44.1 kHz the gap is scaled (1950 frames)")
    func aCaptureGapIsAGapOnTheWire() throws {
        // 100 chunks of 128 frames are 12 800: 106 whole packets (12 720 frames) and 80 in the frame begun.
        let long = try Self.headersAcrossACaptureGap(lost: 1_792, rate: 48_000)
        let steps = zip(long, long.dropFirst()).map { $1.firstFrameIndex - $0.firstFrameIndex }
        let irregular = steps.filter { $0 != 120 }
        #expect(irregular == [120 + 80 + 1_792], "\(irregular)")
        #expect(long[106].firstFrameIndex == 12_800 + 1_792, "the frame begun (12 720…) is not sent")
        // After chunk 1 the frame begun holds 8 frames: a gap of 100 fits in its other 112, as silence. So the wire
        // has 25 700 frames, 214 whole packets, with no jump (ignoring the gap would give 213; dropping the frame, a
        // jump).
        let short = try Self.headersAcrossACaptureGap(lost: 100, rate: 48_000, at: 1)
        #expect(zip(short, short.dropFirst()).allSatisfy { $1.firstFrameIndex - $0.firstFrameIndex == 120 }, "no jump")
        #expect(short.count == 214)
        // Resampled: the gap in 48 kHz frames, the frame begun (0…119 frames) dropped with it.
        let resampled = try Self.headersAcrossACaptureGap(lost: 1_792, rate: 44_100)
        let jumps = zip(resampled, resampled.dropFirst()).map { $1.firstFrameIndex - $0.firstFrameIndex }.filter { $0 != 120 }
        #expect(jumps.count == 1 && (120 + 1_950 ..< 120 + 1_950 + 120).contains(jumps.first ?? 0), "\(jumps)")
    }

    @Test("The decoder is made on the first Opus packet, off the producer's thread: that packet is counted undecoded, the stream then decodes")
    func theDecoderIsMadeWhenTheFirstOpusPacketArrives() throws {
        let packets = try Self.tonePackets(seconds: 0.5)
        let ring = PacketRing(capacity: 256)
        let ingress = PacketIngress(format: Self.wire48k, ring: ring)
        #expect(!ingress.hasOpusDecoder, "nothing is made before an Opus packet arrives")
        #expect(packets[0].withUnsafeBytes { ingress.receive($0, arrivalNanos: 0) } == .undecoded)
        #expect(ingress.counters.undecodedPackets == 1)
        // The I/O loop makes it; the producer only asked.
        #expect(eventually(5) { ingress.hasOpusDecoder })
        for (i, p) in packets.enumerated().dropFirst() {
            #expect(p.withUnsafeBytes { ingress.receive($0, arrivalNanos: UInt64(i)) } == .queued(frames: 120))
        }
        let got = Self.drain(ring)
        #expect(got.count == packets.count - 1 && got.allSatisfy { !$0.0.concealed })
        #expect(got.first?.0.header.sequence == 1, "the stream starts at the first packet decoded")
        var expected = PacketIngress.Counters()
        expected.undecodedPackets = 1
        #expect(ingress.counters == expected)
        #expect(ingress.opusFailure == nil)
    }

    @Test("A PCM stream never makes an Opus decoder")
    func aPCMStreamMakesNoDecoder() throws {
        let ring = PacketRing(capacity: 64)
        let ingress = PacketIngress(format: .default, ring: ring)
        var packetizer = try Packetizer(format: .default)
        let tone = (0..<128).map { Float(sin(Double($0) * 0.06)) * 0.5 }
        for chunk in 0..<20 {
            for p in packetizer.packets(tone, chunk: ChunkInfo(firstFrameIndex: UInt64(chunk * 128), frames: 128, timestampNanos: 0)) {
                #expect(p.withUnsafeBytes { ingress.receive($0, arrivalNanos: 0) } == .queued(frames: 128))
            }
        }
        usleep(50_000)
        #expect(!ingress.hasOpusDecoder)
        #expect(ingress.counters == PacketIngress.Counters())
    }

    @Test("A decoder libopus refuses is tried once: its Opus packets are counted undecoded and the reason is kept")
    func aDecoderThatCannotBeMadeIsReported() throws {
        let slot = try OpusDecoderSlot(channels: 3, outputRate: 48_000)  // libopus decodes one or two channels
        #expect(slot.decoder() == nil)
        #expect(eventually(5) { slot.failure != nil })
        let failure = try #require(slot.failure)
        #expect(failure.contains("opus: invalid argument"), "\(failure)")
        #expect(throws: OpusDecoderUnavailable(reason: failure)) { try slot.prepare() }
        #expect(slot.decoder() == nil && !slot.isMade)
        // What a missing library says.
        let missing = OpusError(code: -3, loadFailure: "dlopen(libopus.so.0): libopus.so.0: cannot open shared object file")
        #expect(missing.description == "opus: libopus is not available (dlopen(libopus.so.0): libopus.so.0: cannot open shared object file); install libopus0")
    }

    @Test func thePlayerDecodesTheToneCleanly() throws {
        let packets = try Self.tonePackets(seconds: 0.5)
        let ring = PacketRing(capacity: 256)
        let ingress = PacketIngress(format: Self.wire48k, ring: ring)
        try ingress.prepareOpusDecoder()
        for (i, p) in packets.enumerated() {
            #expect(p.withUnsafeBytes { ingress.receive($0, arrivalNanos: UInt64(i)) } == .queued(frames: 120))
        }
        let got = Self.drain(ring)
        #expect(got.count == packets.count && got.allSatisfy { !$0.0.concealed })
        let audio = got.flatMap(\.1)
        // Past the codec's start-up (its first frames carry the look-ahead's silence), a clean 440 Hz tone.
        let snr = toneSNR(Array(audio[4_800...]), hertz: 440, rate: 48_000)
        #expect(snr > 30, "SNR \(snr) dB")
        #expect(ingress.counters == PacketIngress.Counters())
        #expect(ingress.wire.encoding == .opus)
        #expect(ingress.wire.queuedBytes == UInt64(packets.map(\.count).reduce(0, +)))
    }

    @Test func aLostPacketIsConcealedByTheDecoderAndStillCountedLost() throws {
        var packets = try Self.tonePackets(seconds: 0.25)
        let lost = packets.remove(at: 40)
        let ring = PacketRing(capacity: 256)
        let ingress = PacketIngress(format: Self.wire48k, ring: ring)
        try ingress.prepareOpusDecoder()
        for (i, p) in packets.enumerated() { _ = p.withUnsafeBytes { ingress.receive($0, arrivalNanos: UInt64(i)) } }
        let got = Self.drain(ring)
        // In its place, in order: the decoder's 120 frames, with the lost packet's number, index and time.
        let lostHeader = try lost.withUnsafeBytes { try AudioPacket.decodeHeader($0) }
        #expect(got.count == packets.count + 1)
        let filler = got[40].0
        #expect(filler.concealed)
        #expect(filler.header.sequence == lostHeader.sequence && filler.header.firstFrameIndex == lostHeader.firstFrameIndex)
        #expect(abs(Int64(filler.header.captureTimeNanos) - Int64(lostHeader.captureTimeNanos)) < 1_000)
        #expect(got.filter(\.0.concealed).count == 1)
        #expect(ingress.counters.decoderConcealedFrames == 120)
        // The concealment continues the tone: no step at either seam, and a level near the tone's.
        let audio = got.flatMap(\.1)
        let seam = 40 * 120
        let jumps = (seam - 2)..<(seam + 122)
        let steepest = jumps.map { abs(audio[$0 + 1] - audio[$0]) }.max() ?? 1
        #expect(steepest < 0.1, "a 440 Hz tone at 0.5 moves at most 0.029 per sample; the seams moved \(steepest)")
        let rms = sqrt(got[40].1.map { $0 * $0 }.reduce(0, +) / 120)
        #expect(rms > 0.15 && rms < 0.5, "concealed level \(rms)")
        // The jitter buffer plays the concealed frames but counts the packet lost, and takes no transit from it.
        var jb = JitterBuffer(format: Self.wire48k, configuration: .init())
        for (packet, samples) in got { samples.withUnsafeBufferPointer { _ = jb.insert(packet, samples: $0) } }
        let c = jb.snapshot
        #expect(c.lostPackets == 1)
        #expect(c.accepted == UInt64(got.count))
        // What the loss is a fraction of: the packets the host sent, not those stored (the concealed one was lost).
        #expect(jb.expectedPackets == UInt64(packets.count + 1))
    }

    /// The player's sink reads its datagrams in batches into a 32-slot ring, and takes the ring in before it reads
    /// again. An Opus datagram after a gap fills a slot for each packet the decoder conceals, so a burst after a
    /// stall with gaps in it overflowed the ring when read 32 at a time; read `datagramsWithRoom` at a time, nothing.
    @Test("A burst of Opus packets with 8 lost before each, read as the sink reads: batches of readBatch overflow nothing, batches of 32 drop packets that arrived")
    func aBurstWithGapsReadAsTheSinkReadsFitsTheRing() throws {
        let all = try Self.tonePackets(seconds: 0.5)
        let burst = stride(from: 0, to: all.count, by: 1 + OpusSequence.maximumConcealedPackets).map { all[$0] }
        func run(batch: (PacketIngress) -> Int) throws -> (overflows: UInt64, stored: Int, concealed: Int) {
            let ring = PacketRing(capacity: 32)
            let ingress = PacketIngress(format: Self.wire48k, ring: ring)
            try ingress.prepareOpusDecoder()
            var next = 0, stored = 0, concealed = 0
            while next < burst.count {
                for p in burst[next..<min(burst.count, next + batch(ingress))] {
                    _ = p.withUnsafeBytes { ingress.receive($0, arrivalNanos: UInt64(next)) }
                    next += 1
                }
                let got = Self.drain(ring)  // the sink's thread takes the ring in (isReady) before it reads again
                stored += got.count
                concealed += got.filter(\.0.concealed).count
            }
            return (ingress.counters.ringOverflows, stored, concealed)
        }
        let paced = try run { $0.readBatch(maximum: 32) }  // what the player's SessionPackets reads
        #expect(paced.overflows == 0)
        #expect(paced.stored == (burst.count - 1) * 9 + 1 && paced.concealed == (burst.count - 1) * 8,
                "every packet that arrived, and the decoder's concealment of each gap")
        let greedy = try run { _ in 32 }
        #expect(greedy.overflows > 0, "the defect this guards against: 32 at once do not fit")

        // A PCM stream takes a slot a datagram: every free slot counts once a PCM packet has been queued.
        let ring = PacketRing(capacity: 32)
        let ingress = PacketIngress(format: .default, ring: ring)
        #expect(ingress.datagramsWithRoom == 32 / 9, "nothing queued yet: room for Opus is assumed")
        let pcm = try AudioPacket.encode(AudioPacketHeader(sequence: 0, firstFrameIndex: 0, frameCount: 2, format: .default),
                                         samples: [0, 0])
        #expect(pcm.withUnsafeBytes { ingress.receive($0, arrivalNanos: 0) } == .queued(frames: 2))
        #expect(ingress.datagramsWithRoom == 31)
        #expect(ingress.readBatch(maximum: 32) == 31 && ingress.readBatch(maximum: 8) == 8)
        for _ in 0..<31 { _ = pcm.withUnsafeBytes { ingress.receive($0, arrivalNanos: 0) } }
        #expect(ingress.datagramsWithRoom == 0 && ingress.readBatch(maximum: 32) == 1, "a readable socket is read from")
    }

    @Test("A packet that does not decode, or not to its header's frame count, costs its own frames only: every later packet keeps its place")
    func aPacketThatDoesNotDecodeCostsItsOwnFramesOnly() throws {
        for corruptBody in [false, true] {
            let packets = try Self.tonePackets(seconds: 0.1)
            for format in [Self.wire48k, AudioFormat.default] {
                let ring = PacketRing(capacity: 256)
                let ingress = PacketIngress(format: format, ring: ring)
                try ingress.prepareOpusDecoder()
                for (i, var p) in packets.enumerated() {
                    if i == 10 {
                        if corruptBody {
                            p = Array(p.prefix(AudioPacket.headerSize)) + [0xFF]  // TOC code 3 without its frame count
                        } else {
                            p.withUnsafeMutableBytes { $0.storeBytes(of: UInt16(240).bigEndian, toByteOffset: 16, as: UInt16.self) }
                        }
                    }
                    _ = p.withUnsafeBytes { ingress.receive($0, arrivalNanos: UInt64(i)) }
                }
                let got = Self.drain(ring)
                #expect(ingress.counters.malformed == 1)
                #expect(!got.contains { $0.0.header.sequence == 10 }, "nothing stands in for the bad packet: the jitter buffer conceals it")
                // Each packet's first frame sits where its own index puts it at the pipeline's rate, less what the
                // resampler holds back after a (re)start: the same few frames before the bad packet and after it,
                // not a whole packet more (±2 frames of rounding; the packets that start the decoder aside).
                let offsets = got.map { packet, _ in
                    (packet.header.sequence, Int(packet.header.firstFrameIndex) - Int(packet.header.sequence) * 120 * format.sampleRate / 48_000)
                }
                let settled = offsets.filter { $0.0 != 0 && $0.0 != 11 }
                let reference = settled.first?.1 ?? 0
                let misplaced = settled.filter { abs($0.1 - reference) > 2 }
                #expect(misplaced.count == 0, "corrupt body \(corruptBody), \(format): \(misplaced.count) of \(got.count) packets misplaced, first \(misplaced.first.map { "seq \($0.0) off by \($0.1 - reference)" } ?? "")")
                #expect(got.last?.0.header.sequence == UInt32(packets.count - 1))
            }
        }
    }

    @Test func anOpusHeaderWithMoreThanTwoChannelsIsMalformedNotAFormatChange() throws {
        var packet = try Self.tonePackets(seconds: 0.02)[0]
        packet[18] = 3
        #expect(throws: AudioPacketError.unsupportedFormat) { try packet.withUnsafeBytes { try AudioPacket.decodeHeader($0) } }
        let ingress = PacketIngress(format: AudioFormat(sampleRate: 48_000, channels: 2), ring: PacketRing(capacity: 4))
        #expect(packet.withUnsafeBytes { ingress.receive($0, arrivalNanos: 1) } == .malformed(.unsupportedFormat))
        #expect(ingress.takePendingFormat() == nil, "the player does not rebuild playback for it")
    }

    @Test func theHostsCaptureDelayReachesA44_1kHzPipelineInItsOwnFrames() throws {
        let ring = PacketRing(capacity: 256)
        let ingress = PacketIngress(format: .default, ring: ring)
        try ingress.prepareOpusDecoder()
        for (i, var p) in try Self.tonePackets(seconds: 0.05).enumerated() {
            // 10 ms, as the host reports it: in 48 kHz frames.
            p.withUnsafeMutableBytes { $0.storeBytes(of: UInt32(480).bigEndian, toByteOffset: 32, as: UInt32.self) }
            _ = p.withUnsafeBytes { ingress.receive($0, arrivalNanos: UInt64(i)) }
        }
        let got = Self.drain(ring)
        #expect(!got.isEmpty && got.allSatisfy { $0.0.header.hostLatencyFrames == 441 }, "10 ms at 44.1 kHz")
    }

    @Test func hostilePacketsAreDroppedAndCountedAndTheStreamGoesOn() throws {
        let packets = try Self.tonePackets(seconds: 0.1)
        let ring = PacketRing(capacity: 256)
        let ingress = PacketIngress(format: Self.wire48k, ring: ring)
        try ingress.prepareOpusDecoder()
        func send(_ bytes: [UInt8]) -> PacketIngress.Outcome { bytes.withUnsafeBytes { ingress.receive($0, arrivalNanos: 1) } }
        #expect(send(packets[0]) == .queued(frames: 120))
        #expect(send(packets[1]) == .queued(frames: 120))
        // A header that lies about the frame count (240 for a 120-frame Opus packet): malformed, nothing stored.
        var liar = packets[2]
        liar.withUnsafeMutableBytes { $0.storeBytes(of: UInt16(240).bigEndian, toByteOffset: 16, as: UInt16.self) }
        // A replayed or duplicated packet: the decoder is past it.
        #expect(send(packets[1]) == .stale)
        guard case .malformed = send(liar) else { Issue.record("a lying frame count was taken"); return }
        // Garbage codec bytes under a valid header: libopus refuses them or decodes them; nothing out of range.
        var garbage = Array(packets[3].prefix(AudioPacket.headerSize))
        var rng = SystemRandomNumberGenerator()
        garbage += (0..<200).map { _ in UInt8.random(in: 0...255, using: &rng) }
        _ = send(garbage)
        // Not 48 kHz, or not one of Opus's frame sizes: refused by the header rules.
        var at44 = packets[4]
        at44.withUnsafeMutableBytes { $0.storeBytes(of: UInt32(44_100).bigEndian, toByteOffset: 20, as: UInt32.self) }
        #expect(throws: AudioPacketError.unsupportedFormat) { try at44.withUnsafeBytes { try AudioPacket.decodeHeader($0) } }
        var odd = packets[4]
        odd.withUnsafeMutableBytes { $0.storeBytes(of: UInt16(128).bigEndian, toByteOffset: 16, as: UInt16.self) }
        #expect(throws: AudioPacketError.badFrameCount(128)) { try odd.withUnsafeBytes { try AudioPacket.decodeHeader($0) } }
        let empty = Array(packets[4].prefix(AudioPacket.headerSize))
        #expect(throws: AudioPacketError.truncated(36)) { try empty.withUnsafeBytes { try AudioPacket.decodeHeader($0) } }
        // A stereo pipeline is told the host sends mono (at its own rate: Opus is decoded to the pipeline's rate).
        let other = PacketIngress(format: AudioFormat(sampleRate: 44_100, channels: 2), ring: PacketRing(capacity: 4))
        #expect(packets[5].withUnsafeBytes { other.receive($0, arrivalNanos: 1) } == .formatChanged(.default))
        // The stream goes on.
        for p in packets[5...] { #expect(send(p) == .queued(frames: 120)) }
        let c = ingress.counters
        #expect(c.malformed >= 1 && c.stalePackets == 1)
        let got = Self.drain(ring)
        #expect(got.allSatisfy { $0.1.allSatisfy { $0.isFinite && abs($0) <= 1 } })
        #expect(got.last?.0.header.sequence == UInt32(packets.count - 1))
    }

    @Test func a44_1kHzPlayerGetsTheToneBackAtItsOwnRateContinuousAcrossPacketsAndGaps() throws {
        var packets = try Self.tonePackets(seconds: 0.5)
        packets.remove(at: 100)  // one loss, concealed by the decoder before the resampler
        let ring = PacketRing(capacity: 512)
        let ingress = PacketIngress(format: .default, ring: ring)
        try ingress.prepareOpusDecoder()
        var queued = 0
        for (i, p) in packets.enumerated() {
            let outcome = p.withUnsafeBytes { ingress.receive($0, arrivalNanos: UInt64(i)) }
            guard case .queued(let n) = outcome else { Issue.record("packet \(i): \(outcome)"); return }
            queued += n
        }
        let got = Self.drain(ring)
        #expect(got.allSatisfy { $0.0.header.format == .default })
        // One stream at 44.1 kHz: each packet starts where the one before ended, 110 or 111 frames each.
        #expect(got.first?.0.header.firstFrameIndex == 0)
        #expect(zip(got, got.dropFirst()).allSatisfy { $0.0.header.firstFrameIndex + UInt64($0.0.header.frameCount) == $1.0.header.firstFrameIndex })
        #expect(got.dropFirst().allSatisfy { (109...112).contains($0.0.header.frameCount) })
        let frames = got.map(\.0.header.frameCount).reduce(0, +)
        #expect(queued + 120 * 44_100 / 48_000 >= frames - 1 && queued <= frames, "queued \(queued) of \(frames): the concealed ones count apart")
        #expect(abs(frames - (packets.count + 1) * 120 * 44_100 / 48_000) < 40, "\(frames) frames: the resampler holds a few back")
        #expect(got.filter(\.0.concealed).count == 1)
        // Capture times advance with the frames (2.5 ms a packet) and the tone is clean at 44.1 kHz.
        let times = got.map { Double($0.0.header.captureTimeNanos) }, index = got.map { Double($0.0.header.firstFrameIndex) }
        for k in 1..<got.count {
            let expected = (index[k] - index[k - 1]) * 1e9 / 44_100
            #expect(abs(times[k] - times[k - 1] - expected) < 25_000, "packet \(k)")
        }
        let audio = got.flatMap(\.1)
        let snr = toneSNR(Array(audio[4_410..<(audio.count - 100)]), hertz: 440, rate: 44_100)
        #expect(snr > 24, "SNR \(snr) dB at 44.1 kHz, a concealed packet included (30+ without loss)")
    }

    /// Found by the audio fuzz target: a peer's frame index and capture time at the top of their range must not trap
    /// the resampling ingress (they did, in the scaling of the index). Nor may its capture delay, scaled to a
    /// pipeline above 48 kHz (a host that sent one PCM packet at 96 kHz has the player rebuild at that rate).
    @Test func extremeIndicesAndTimesFromAPeerDoNotTrap() throws {
        let packets = try Self.tonePackets(seconds: 0.05)
        for format in [AudioFormat.default, Self.wire48k, AudioFormat(sampleRate: 96_000, channels: 1)] {
            let ring = PacketRing(capacity: 64)
            let ingress = PacketIngress(format: format, ring: ring)
            try ingress.prepareOpusDecoder()
            for (i, value) in [UInt64.max, UInt64.max - 1, 1 << 63, 0].enumerated() {
                var p = packets[i]
                p.withUnsafeMutableBytes {
                    $0.storeBytes(of: value.bigEndian, toByteOffset: 8, as: UInt64.self)   // first frame index
                    $0.storeBytes(of: value.bigEndian, toByteOffset: 24, as: UInt64.self)  // capture time
                    $0.storeBytes(of: UInt32(truncatingIfNeeded: value).bigEndian, toByteOffset: 32, as: UInt32.self)  // capture delay
                }
                if case .malformed = p.withUnsafeBytes({ ingress.receive($0, arrivalNanos: 1) }) { Issue.record("packet \(i) refused") }
            }
            let got = Self.drain(ring)
            #expect(!got.isEmpty, "\(format)")
            #expect(got.allSatisfy { $0.1.allSatisfy { $0.isFinite && abs($0) <= 1 } })
            if format.sampleRate > 48_000 {
                #expect(got.first?.0.header.hostLatencyFrames == .max, "a delay past the field's range is its largest")
            }
        }
    }

    @Test func aFlacOr48kHzSourceNeedsNoResamplingAndStereoWorks() throws {
        var p = try Packetizer(format: AudioFormat(sampleRate: 48_000, channels: 2), encoding: .opus)
        #expect(p.wireFormat == AudioFormat(sampleRate: 48_000, channels: 2))
        #expect(p.codecDelayFrames == 120, "no resampler: only Opus's 2.5 ms look-ahead")
        let chunk = ChunkInfo(firstFrameIndex: 0, frames: 240, timestampNanos: 0)
        let packets = p.packets([Float](repeating: 0.1, count: 480), chunk: chunk)
        #expect(packets.count == 2)
        #expect(throws: AudioPacketError.unsupportedFormat) {
            try Packetizer(format: AudioFormat(sampleRate: 44_100, channels: 3), encoding: .opus)
        }
        let p44 = try Packetizer(format: .default, encoding: .opus)
        #expect(p44.codecDelayFrames > 120 && p44.codecDelayFrames < 240, "look-ahead plus the resampler's \(p44.codecDelayFrames - 120) frames")
    }
}
