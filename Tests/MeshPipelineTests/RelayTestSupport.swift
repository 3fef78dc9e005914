import MeshTestSupport
import MeshAudio
@testable import MeshPipeline

/// Deterministic PRNG for fuzz and impairment tests.
typealias RelayRNG = SeededRandom

/// sin without Foundation, double precision (range-reduced Taylor).
func relaySin(_ x: Double) -> Double {
    let twoPi = 2 * Double.pi
    var y = x - (x / twoPi).rounded() * twoPi          // [-π, π]
    if y > Double.pi / 2 { y = Double.pi - y } else if y < -Double.pi / 2 { y = -Double.pi - y }
    let y2 = y * y
    var term = y, sum = y
    for k in 1...10 {
        term *= -y2 / Double((2 * k) * (2 * k + 1))
        sum += term
    }
    return sum
}

func relayCos(_ x: Double) -> Double { relaySin(x + Double.pi / 2) }

/// Interleaved sine frames `[start, start+count)`, same value on every channel.
func relaySine(start: Int, count: Int, channels: Int = 1, frequency: Double = 440, rate: Double = 44_100,
               amplitude: Double = 0.5) -> [Float]
{
    var out = [Float](repeating: 0, count: count * channels)
    for i in 0..<count {
        let v = Float(amplitude * relaySin(2 * Double.pi * frequency * Double(start + i) / rate))
        for c in 0..<channels { out[i * channels + c] = v }
    }
    return out
}

/// A packet whose sample values are the frame indices (mod 2^20), for ordering checks.
func relayIndexPacket(first: UInt64, frames: Int, sequence: UInt32, format: AudioFormat = .default)
    -> (ReceivedPacket.Type, AudioPacketHeader, [Float])
{
    var samples = [Float](repeating: 0, count: frames * format.channels)
    for i in 0..<frames {
        for c in 0..<format.channels { samples[i * format.channels + c] = Float((first &+ UInt64(i)) % (1 << 20)) }
    }
    return (ReceivedPacket.self, AudioPacketHeader(sequence: sequence, firstFrameIndex: first, frameCount: frames, format: format), samples)
}

extension JitterBuffer {
    /// Test convenience: insert a header + samples arriving at `arrival`.
    @discardableResult
    mutating func insert(_ header: AudioPacketHeader, _ samples: [Float], arrival: UInt64) -> InsertResult {
        samples.withUnsafeBufferPointer { insert(ReceivedPacket(header: header, arrivalNanos: arrival), samples: $0) }
    }

    /// Test convenience: read `frames` frames; returns samples and marks.
    mutating func read(frames: Int, now: UInt64, pipeline: Double = 0) -> (samples: [Float], marks: [UInt8], result: ReadResult) {
        var s = [Float](repeating: -1, count: frames * format.channels)
        var m = [UInt8](repeating: 9, count: frames)
        var r = ReadResult.idle
        s.withUnsafeMutableBufferPointer { sp in
            m.withUnsafeMutableBufferPointer { mp in
                r = read(into: sp, marks: mp, frames: frames, nowNanos: now, pipelineFrames: pipeline)
            }
        }
        return (s, m, r)
    }
}

/// Nanoseconds of `frames` at `rate`.
func relayNanos(_ frames: Double, rate: Double = 44_100) -> UInt64 { UInt64((frames * 1e9 / rate).rounded()) }

/// Frames in `nanos` nanoseconds at `rate`.
func relayFrames(_ nanos: UInt64, rate: Double = 44_100) -> Int { Int((Double(nanos) * rate / 1e9).rounded()) }

/// A sink that never runs a thread: the test pulls the pipeline's renderer itself, in virtual time.
final class VirtualTimeSink: AudioSink {
    let format: AudioFormat
    let periodFrames = 128
    init(format: AudioFormat = .default) { self.format = format }
    func start(renderer: any AudioRenderer) throws {}
    func stop() {}
    var stats: AudioStats { AudioStats() }
}
