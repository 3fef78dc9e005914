import Testing
import MeshAudio
@testable import MeshPipeline

/// The drift controller's timelines and steering, and the level meter, each alone.
@Suite("Drift timelines and steering")
struct DriftPartsTests {
    @Test func renderLatenessIsTheCallTimeBeyondTheFramesRendered() {
        var t = RenderTimeline(sampleRate: 48_000)   // a 96-frame device queue is 2 ms
        #expect(t.noteCall(nowNanos: 1_000_000_000, deviceDelayFrames: 96, latenessFloorNanos: nil) == .kept)
        #expect(t.latenessNanos == 0)
        t.noteRendered(frames: 480)   // 10 ms
        #expect(t.noteCall(nowNanos: 1_010_000_000, deviceDelayFrames: 96, latenessFloorNanos: 0) == .kept)
        #expect(t.latenessNanos == 0)
        t.noteRendered(frames: 480)
        #expect(t.noteCall(nowNanos: 1_023_000_000, deviceDelayFrames: 96, latenessFloorNanos: 0) == .kept)
        #expect(t.latenessNanos == 3_000_000, "3 ms late")
    }

    @Test func aRenderTimelineJumpOfMoreThan20msRebases() {
        var t = RenderTimeline(sampleRate: 48_000)
        _ = t.noteCall(nowNanos: 1_000_000_000, deviceDelayFrames: 0, latenessFloorNanos: nil)
        t.noteRendered(frames: 480)
        #expect(t.noteCall(nowNanos: 1_060_000_000, deviceDelayFrames: 0, latenessFloorNanos: nil) == .kept,
                "no floor, nothing to judge against")
        #expect(t.latenessNanos == 50_000_000)
        t.noteRendered(frames: 480)
        #expect(t.noteCall(nowNanos: 1_100_000_000, deviceDelayFrames: 0, latenessFloorNanos: 0) == .rebased)
        #expect(t.latenessNanos == 0)
        t.noteRendered(frames: 480)
        _ = t.noteCall(nowNanos: 1_111_000_000, deviceDelayFrames: 0, latenessFloorNanos: 0)
        #expect(t.latenessNanos == 1_000_000, "counted from the new anchor")
    }

    @Test func transitIsCountedFromTheAnchorPacket() {
        var a = ArrivalTimeline(sampleRate: 1000)   // a frame is a millisecond
        #expect(!a.isAnchored)
        #expect(a.transitNanos(end: 10, arrivalNanos: 50_000_000) == 40_000_000, "from origin 0 while unanchored")
        a.anchor(firstFrame: 100, arrivalNanos: 1_000_000_000)
        #expect(a.isAnchored)
        #expect(a.transitNanos(end: 110, arrivalNanos: 1_012_000_000) == 2_000_000)
        #expect(a.transitNanos(end: 100 &- 10, arrivalNanos: 1_000_000_000) == 10_000_000, "frames before the anchor")
    }

    @Test func withoutAStreamTheSteeringLeavesTheRatioAlone() {
        var drift = DriftController(sampleRate: 44_100)
        let s = drift.steer(measuredLatencyFrames: 300, stream: nil, nowNanos: 1)
        #expect(s.measuredLatencyFrames == 300 && s.steadyLatencyFrames == 300)
        #expect(s.correctionPPM == nil && !s.engaged && !s.floorsReady)
        #expect(s.jitterFeedback == JitterBuffer.DriftFeedback(steadyOffsetFrames: 0, holdStart: true))
    }

    @Test func aPlayingStreamIsRegulatedOnceTheFloorsAreReady() {
        var drift = DriftController(sampleRate: 44_100)
        drift.notePacket(firstFrame: 0, frames: 128, arrivalNanos: 1_000_000, streamRestarted: false)
        var now: UInt64 = 2_000_000
        for _ in 0..<32 {
            drift.noteRenderCall(nowNanos: now, deviceDelayFrames: 256)
            drift.noteRendered(frames: 128)
            now += 2_902_494
        }
        var stream = BufferedStream(newestFrameEnd: 128, newestArrivalNanos: 1_000_000, targetFrames: 300, isPlaying: false)
        let priming = drift.steer(measuredLatencyFrames: 300, stream: stream, nowNanos: now)
        #expect(priming.floorsReady && priming.correctionPPM == nil, "priming: no regulation yet")
        #expect(abs(priming.steadyLatencyFrames - 300) < 1e-6, "no jitter: the steady latency is the measured one")
        stream.isPlaying = true
        let playing = drift.steer(measuredLatencyFrames: 300, stream: stream, nowNanos: now)
        #expect(playing.correctionPPM == 0 && !playing.engaged, "settling: exactly no correction")
    }

    @Test func aRestartedStreamReanchorsTheArrivalTimeline() {
        var drift = DriftController(sampleRate: 44_100)
        drift.notePacket(firstFrame: 0, frames: 128, arrivalNanos: 1_000_000, streamRestarted: false)
        drift.notePacket(firstFrame: 128, frames: 128, arrivalNanos: 3_902_494, streamRestarted: false)
        #expect(drift.arrivalTimeline.transitNanos(end: 256, arrivalNanos: 3_902_494) < 0)
        drift.notePacket(firstFrame: 1_000_000, frames: 128, arrivalNanos: 9_000_000, streamRestarted: true)
        let transit = drift.arrivalTimeline.transitNanos(end: 1_000_128, arrivalNanos: 9_000_000)
        #expect(transit == -128e9 / 44_100)
        #expect(drift.transitFloor(atNanos: 9_000_000) == transit, "the floors start over with the new stream")
    }

    @Test func theMeterHoldsThePeakAndDecays() {
        var meter = LevelMeter(sampleRate: 44_100)
        [0.5, -0.8, 0.1].withUnsafeBufferPointer { meter.measure($0, frames: 3) }
        #expect(meter.peak == 0.8)
        let silence = [Float](repeating: 0, count: 4_410)
        silence.withUnsafeBufferPointer { meter.measure($0, frames: 4_410) }
        #expect(abs(meter.peak - 0.8 * 0.77) < 1e-5, "about 20 dB per second")
    }
}
