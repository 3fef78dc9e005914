import Testing
import MeshAudio
@testable import MeshPipeline

/// A virtual-time driver: packets of `n` frames captured at 44.1 kHz from frame `start`, renders of `block`
/// frames; `arrival(k)` gives packet k's arrival (nil = lost); each render inserts every packet arrived by then.
struct RelayJBSim {
    var jb: JitterBuffer
    var n = 128, block = 128, start: UInt64 = 1000
    var rate = 44_100.0
    var played: [Float] = []   // samples of frames marked present/discontinuity during .playing
    var marks: [UInt8] = []
    /// Every real frame played (present or discontinuity), whatever the read's result (a `.stretched` read plays
    /// real frames after the ones it holds for).
    var realFrames: [Float] = []
    var results: [JitterBuffer.ReadResult] = []

    init(mode: JitterBuffer.Mode) { jb = JitterBuffer(format: .default, configuration: .init(mode: mode)) }

    /// Capture-end time of packet k (no network delay), ns.
    func nominal(_ k: Int) -> UInt64 { relayNanos(Double((k + 1) * n), rate: rate) }

    mutating func run(packets: Int, renders: Int, renderOffsetNanos: UInt64 = 1_000_000, sequenceBase: UInt32 = 0,
                      indexBase: UInt64? = nil, arrival: (Int) -> [UInt64]) {
        var queue: [(UInt64, Int)] = []
        for k in 0..<packets { for a in arrival(k) { queue.append((a, k)) } }
        queue.sort { $0.0 < $1.0 }
        var qi = 0
        let base = indexBase ?? start
        for j in 0..<renders {
            let now = UInt64(Double(j * block) * 1e9 / rate) + renderOffsetNanos
            while qi < queue.count && queue[qi].0 <= now {
                let k = queue[qi].1
                let (_, h, s) = relayIndexPacket(first: base &+ UInt64(k * n), frames: n, sequence: sequenceBase &+ UInt32(k))
                jb.insert(h, s, arrival: queue[qi].0)
                qi += 1
            }
            let r = jb.read(frames: block, now: now)
            results.append(r.result)
            for (i, m) in r.marks.enumerated() where m == FrameMark.present || m == FrameMark.discontinuity {
                realFrames.append(r.samples[i])
            }
            if r.result == .playing {
                var from = 0
                if played.isEmpty { from = r.marks.firstIndex { $0 == FrameMark.discontinuity } ?? 0 }
                played += r.samples[from...]
                marks += r.marks[from...]
            }
        }
    }
}

@Suite("Relay jitter buffer")
struct RelayJitterBufferTests {
    @Test func inOrderStreamPlaysExactlyAfterTarget() {
        var sim = RelayJBSim(mode: .fixed(milliseconds: 10))
        sim.run(packets: 200, renders: 201) { [sim] k in [sim.nominal(k)] }
        let c = sim.jb.snapshot
        #expect(c.received == 200 && c.accepted == 200)
        #expect(c.late == 0 && c.duplicates == 0 && c.lostPackets == 0 && c.lostFrames == 0 && c.underruns == 0)
        #expect(sim.played.first == 1000)
        #expect(sim.marks.first == FrameMark.discontinuity)
        let expected: [Float] = (0..<sim.played.count).map { Float(1000 + $0) }
        #expect(sim.played == expected)
        #expect(sim.marks.dropFirst().allSatisfy { $0 == FrameMark.present })
        #expect(abs(sim.jb.targetFrames - 441) < 0.01)
        // Priming lasted until the 10 ms target was buffered.
        #expect(sim.results.prefix { $0 != .playing } == [.idle, .priming, .priming])
    }

    @Test func reorderedPacketsComeOutInOrder() {
        var sim = RelayJBSim(mode: .fixed(milliseconds: 10))
        // Every even packet is overtaken by its successor (delayed 1.5 periods).
        sim.run(packets: 200, renders: 203) { [sim] k in [sim.nominal(k) + (k % 2 == 0 ? relayNanos(192) : 0)] }
        let c = sim.jb.snapshot
        #expect(c.accepted == 200 && c.late == 0 && c.lostFrames == 0 && c.lostPackets == 0)
        let expected: [Float] = (0..<sim.played.count).map { Float(1000 + $0) }
        #expect(sim.played == expected)
    }

    @Test func duplicatesLateAndLossAreCountedExactly() {
        var sim = RelayJBSim(mode: .fixed(milliseconds: 10))
        sim.run(packets: 300, renders: 301) { [sim] k in
            switch k {
            case 10, 11, 50: return []                                     // lost
            case 20: return [sim.nominal(k), sim.nominal(k) + 1000]          // duplicated
            case 30: return [sim.nominal(k) + 30_000_000]                    // 30 ms late (> 10 ms target)
            case 40: return [sim.nominal(k), sim.nominal(k) + 100_000_000]   // duplicate arriving after playout: late
            default: return [sim.nominal(k)]
            }
        }
        let c = sim.jb.snapshot
        #expect(c.received == 299)
        #expect(c.accepted == 296)
        #expect(c.duplicates == 1)
        #expect(c.late == 2)
        #expect(c.lostPackets == 3)
        #expect(c.lostFrames == 4 * 128)      // packets 10, 11, 30 (late), 50
        #expect(c.underruns == 0)
        // Missing frames are marked, everything else is in order.
        for (i, v) in sim.played.enumerated() where sim.marks[i] != FrameMark.missing {
            #expect(v == Float(1000 + i))
        }
        #expect(sim.marks.filter { $0 == FrameMark.missing }.count == 4 * 128)
    }

    @Test(arguments: [3_500_000, 5_000_000] as [UInt64])
    func aStreamThatMovesLaterResumesAtTheLatePacketInsteadOfDroppingItAndItsSuccessors(shift: UInt64) {
        // From packet 100 on, every packet arrives `shift` later than before (more than a packet: 2.9 ms): the sender
        // stalled once and its timeline moved. The render that needs packet 100 comes first and conceals what it
        // lacks; packet 100 then continues the stream exactly where it had run dry, so the playout point moves back to
        // it (a late resume) and every packet after it plays. Dropping it instead would leave each later packet late
        // in turn until the target or a resync caught up.
        var sim = RelayJBSim(mode: .low)
        sim.run(packets: 300, renders: 320) { [sim] k in [sim.nominal(k) + (k >= 100 ? shift : 0)] }
        let c = sim.jb.snapshot
        print("late resume (shift \(shift / 1000) us): resumes \(c.lateResumes), late \(c.late), lostFrames \(c.lostFrames), stretched \(c.stretchedFrames), skipped \(c.skippedFrames), underruns \(c.underruns)")
        #expect(c.lateResumes == 1)
        #expect(c.late == 0 && c.lostPackets == 0 && c.resyncs == 0 && c.skippedFrames == 0)
        #expect(c.stretchedFrames > 0 && c.stretchedFrames < UInt64(relayFrames(shift)) + 128,
                "the concealment that preceded the late packet turned into a stretch of about the shift")
        // Every frame the sender sent was played exactly once and in order (none dropped as late): the concealed
        // frames only delayed the rest.
        let played = sim.realFrames
        #expect(played.count == 300 * 128 && played.elementsEqual((0..<played.count).lazy.map { Float(1000 + $0) }),
                "every frame played once, in order")
    }

    @Test func wraparoundOfSequenceAndFrameIndex() {
        var sim = RelayJBSim(mode: .fixed(milliseconds: 10))
        let base = UInt64.max - 128 * 50
        sim.run(packets: 120, renders: 121, sequenceBase: UInt32.max - 40, indexBase: base) { [sim] k in
            k == 70 ? [] : [sim.nominal(k)]
        }
        let c = sim.jb.snapshot
        #expect(c.accepted == 119 && c.late == 0 && c.duplicates == 0 && c.resyncs == 0)
        #expect(c.lostPackets == 1 && c.lostFrames == 128)
        for (i, v) in sim.played.enumerated() where sim.marks[i] != FrameMark.missing {
            #expect(v == Float((base &+ UInt64(i)) % (1 << 20)))
        }
    }

    @Test func aNewStreamsPacketsSetItsStructuralLatencyNotTheOldStreams() {
        var jb = JitterBuffer(format: .default, configuration: .init(mode: .low))
        var now: UInt64 = 0
        func step(_ first: UInt64, _ frames: Int, _ seq: UInt32) {
            now += relayNanos(Double(frames))
            let (_, h, s) = relayIndexPacket(first: first, frames: frames, sequence: seq)
            jb.insert(h, s, arrival: now)
            _ = jb.read(frames: 64, now: now)
        }
        for k in 0..<50 { step(UInt64(k * 64), 64, UInt32(k)) }
        // One outsized packet (a host's bug, or a lie) raises the floor for its stream...
        step(50 * 64, 574, 50)
        #expect(jb.packetFrames == 574)
        // ...and a new stream (the host restarted, with 64-frame packets again) starts from its own.
        for k in 0..<20 { step(1 << 40 + UInt64(k * 64), 64, UInt32(1000 + k)) }
        #expect(jb.snapshot.resyncs == 1)
        #expect(jb.packetFrames == 64)
    }

    @Test func hostRestartResyncs() {
        var jb = JitterBuffer(format: .default, configuration: .init(mode: .fixed(milliseconds: 10)))
        var now: UInt64 = 0
        func step(_ first: UInt64, _ seq: UInt32) {
            now += relayNanos(128)
            let (_, h, s) = relayIndexPacket(first: first, frames: 128, sequence: seq)
            jb.insert(h, s, arrival: now)
            _ = jb.read(frames: 128, now: now)
        }
        for k in 0..<100 { step(1_000_000 + UInt64(k * 128), UInt32(k)) }
        // Restart with the sequence moving on: immediate resync.
        step(0, 100)
        #expect(jb.snapshot.resyncs == 1 && jb.snapshot.late == 0)
        for k in 1..<50 { step(UInt64(k * 128), UInt32(100 + k)) }
        // Restart with the sequence starting over: 7 late packets, the 8th resyncs.
        for k in 0..<8 { step(UInt64(k * 128), UInt32(k)) }
        #expect(jb.snapshot.resyncs == 2)
        #expect(jb.snapshot.late == 7)
        // A big jump forward resyncs at once.
        step(1 << 40, 8)
        #expect(jb.snapshot.resyncs == 3)
        let r = jb.read(frames: 128, now: now + 20_000_000)
        #expect(r.result == .playing)
    }

    @Test("Frame indexes half the index space away (where the wrapping difference flips sign): no hang, no aliasing")
    func indexesHalfTheIndexSpaceAway() {
        var jb = JitterBuffer(format: .default, configuration: .init(mode: .fixed(milliseconds: 10)))
        let start: UInt64 = 1_000_000
        var now: UInt64 = 0
        func packet(_ first: UInt64, _ seq: UInt32) -> JitterBuffer.InsertResult {
            let (_, h, s) = relayIndexPacket(first: first, frames: 128, sequence: seq)
            return jb.insert(h, s, arrival: now)
        }
        #expect(packet(start, 0) == .accepted)
        // While priming: a packet 2⁶³ − 1 frames before the stream's start, with the current sequence number. Before
        // the fix the buffer "moved the start back" over 2⁶³ frames, a loop that never ended on the render thread.
        #expect(packet(start &- (1 << 63) &+ 1, 0) == .late)
        // Exactly 2⁶³ frames ahead: both "ahead" and "behind" come out negative in wrapping arithmetic. It is a jump
        // (a resync), not a packet stored into slots that alias the stream's own frames.
        for k in 1..<8 { #expect(packet(start + UInt64(k * 128), UInt32(k)) == .accepted) }
        #expect(jb.read(frames: 128, now: now).result != .idle)
        #expect(packet(start &+ (1 << 63), 8) == .resync)
        #expect(jb.snapshot.resyncs == 1 && jb.snapshot.late == 1)
        // The stream carries on from there (the real host's next packets are a restart of their own).
        now += relayNanos(128)
        #expect(packet(start + 8 * 128, 9) == .resync)
        for k in 9..<40 {
            now += relayNanos(128)
            #expect(packet(start + UInt64(k * 128), UInt32(k + 1)) == .accepted)
            _ = jb.read(frames: 128, now: now)
        }
        #expect(jb.read(frames: 128, now: now + relayNanos(128)).result == .playing)
    }

    @Test func formatMismatchIsDroppedAndCounted() throws {
        // The format is checked once, at the ingress stage in front of the buffer's packet ring.
        var jb = JitterBuffer(format: .default)
        let ring = PacketRing(capacity: 4)
        let ingress = PacketIngress(format: .default, ring: ring)
        let other = AudioFormat(sampleRate: 48_000, channels: 2)
        let (_, h, s) = relayIndexPacket(first: 0, frames: 64, sequence: 0, format: other)
        let bytes = try AudioPacket.encode(h, samples: s)
        #expect(bytes.withUnsafeBytes { ingress.receive($0, arrivalNanos: 1) } == .formatChanged(other))
        while let _ = ring.pop({ jb.insert($0, samples: $1) }) {}
        #expect(ingress.counters.formatMismatches == 1 && !jb.isActive)
    }

    @Test func autoTargetAdaptsFastUpSlowDown() {
        var sim = RelayJBSim(mode: .auto)
        var rng = RelayRNG(seed: 3)
        let periodsPerSecond = 44_100 / 128
        let clean = 5 * periodsPerSecond, jittery = 5 * periodsPerSecond, calm = 90 * periodsPerSecond
        let delays: [UInt64] = (0..<(clean + jittery + calm + 10)).map { k in
            (k >= clean && k < clean + jittery) ? UInt64.random(in: 0...8_000_000, using: &rng) : 0
        }
        var targets: [Double] = []
        // Drive by hand so the target can be sampled every render.
        var queue: [(UInt64, Int)] = (0..<delays.count).map { (sim.nominal($0) + delays[$0], $0) }
        queue.sort { $0.0 < $1.0 }
        var qi = 0
        for j in 0..<(clean + jittery + calm) {
            let now = UInt64(Double(j * 128) * 1e9 / 44_100) + 1_000_000
            while qi < queue.count && queue[qi].0 <= now {
                let k = queue[qi].1
                let (_, h, s) = relayIndexPacket(first: UInt64(k * 128), frames: 128, sequence: UInt32(k))
                sim.jb.insert(h, s, arrival: queue[qi].0)
                qi += 1
            }
            _ = sim.jb.read(frames: 128, now: now)
            targets.append(sim.jb.targetFrames)
        }
        let minimum = 128.0 + 128 + 22.05
        // Clean link: at the minimum.
        #expect(abs(targets[clean - 1] - minimum) < 1)
        // Jitter (up to 8 ms = 353 frames): the target rises within half a second.
        let risen = targets[clean + periodsPerSecond / 2]
        #expect(risen > minimum + 250)
        let peak = targets[clean..<(clean + jittery)].max()!
        // Calm again: still high 3 s later (slow decay), back near the minimum after 90 s.
        #expect(targets[clean + jittery + 3 * periodsPerSecond] > 0.75 * peak)
        #expect(targets[clean + jittery + 3 * periodsPerSecond] < peak)
        #expect(targets.last! < minimum + 5)
    }

    /// `mesh-play --latency 2000`: the ring holds the fixed delay asked for, above the default 500 ms maximum.
    @Test(arguments: [1_000.0, 2_000.0])
    func fixedDelayAboveTheDefaultMaximumIsHeld(milliseconds: Double) {
        var sim = RelayJBSim(mode: .fixed(milliseconds: milliseconds))
        let delayPackets = Int(milliseconds * 44.1 / 128) + 200
        sim.run(packets: delayPackets, renders: delayPackets + 1) { [sim] k in [sim.nominal(k)] }
        #expect(abs(sim.jb.targetFrames - milliseconds * 44.1) < 0.01)
        // Silence while the delay fills, then every frame in order from the first: played `milliseconds` late.
        let primed = sim.results.prefix { $0 != .playing }.count
        #expect(abs(Double(primed * 128) - milliseconds * 44.1) <= 128 * 2)
        #expect(sim.played == (0..<sim.played.count).map { Float(1000 + $0) })
        #expect(sim.jb.snapshot.lostFrames == 0 && sim.jb.snapshot.skippedFrames == 0)
        // However the configuration was made: the mode set after the defaults holds it too.
        var configuration = JitterBuffer.Configuration()
        configuration.mode = .fixed(milliseconds: milliseconds)
        let later = JitterBuffer(format: .default, configuration: configuration)
        #expect(later.capacityFrames == sim.jb.capacityFrames && Double(later.capacityFrames) >= milliseconds * 44.1)
    }

    @Test func lowModePinsToMinimum() {
        var sim = RelayJBSim(mode: .low)
        sim.run(packets: 400, renders: 390) { [sim] k in [sim.nominal(k) + UInt64((k * 7919) % 3_000_000)] }
        #expect(abs(sim.jb.targetFrames - (256 + 22.05)) < 0.01)
    }
}
