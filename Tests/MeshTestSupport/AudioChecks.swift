// Audio checks the relay and pipeline tests share: reading what a sink wrote, finding a signal in it.
import Foundation
import MeshAudio

/// All samples of a WAV file.
package func readWAV(_ path: String) throws -> (samples: [Float], format: AudioFormat) {
    let source = try WAVFileSource(path: path, periodFrames: 1024, loop: false, realtime: false)
    try source.start()
    defer { source.stop() }
    var out: [Float] = []
    out.reserveCapacity(source.frameCount * source.format.channels)
    var buf = [Float](repeating: 0, count: 1024 * source.format.channels)
    while true {
        let info = buf.withUnsafeMutableBufferPointer { source.read(into: $0, timeoutNanos: 200_000_000) }
        guard let info else {
            if source.isFinished { break }
            continue
        }
        out.append(contentsOf: buf[0..<(info.frames * source.format.channels)])
    }
    return (out, source.format)
}

/// Raw Float32 little-endian samples.
package func readRaw(_ path: String) throws -> [Float] {
    let d = try Data(contentsOf: URL(fileURLWithPath: path))
    return d.withUnsafeBytes { raw in (0..<(raw.count / 4)).map { Float(bitPattern: UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: $0 * 4, as: UInt32.self))) } }
}

/// Where a 256-sample window of the received audio starting at `start` sits inside `reference`: the offset of
/// its last exact match (the last, so that a reference made of a looped signal can be walked back through), or
/// `nil`.
package func exactOffset(of received: [Float], at start: Int, in reference: [Float], window: Int = 256) -> Int? {
    guard start >= 0, start + window <= received.count else { return nil }
    let probe = Array(received[start..<(start + window)])
    guard probe.contains(where: { $0 != 0 }) else { return nil }
    var i = reference.count - window
    while i >= 0 {
        if reference[i] == probe[0], Array(reference[i..<(i + window)]) == probe { return i - start }
        i -= 1
    }
    return nil
}

/// The largest step between neighbouring samples.
package func largestJump(_ s: ArraySlice<Float>) -> Float {
    var m: Float = 0
    var prev = s.first ?? 0
    for v in s { m = max(m, abs(v - prev)); prev = v }
    return m
}

/// Signal-to-noise ratio (dB) of a sine of `hertz` fitted by least squares over `x`.
package func toneSNR(_ x: [Float], hertz: Double, rate: Double) -> Double {
    var ss = 0.0, sc = 0.0, cc = 0.0, xs = 0.0, xc = 0.0
    for (i, v) in x.enumerated() {
        let w = 2 * Double.pi * hertz * Double(i) / rate, s = sin(w), c = cos(w)
        ss += s * s; sc += s * c; cc += c * c; xs += Double(v) * s; xc += Double(v) * c
    }
    let det = ss * cc - sc * sc
    let a = (xs * cc - xc * sc) / det, b = (xc * ss - xs * sc) / det
    var noise = 0.0
    for (i, v) in x.enumerated() {
        let w = 2 * Double.pi * hertz * Double(i) / rate
        let e = Double(v) - a * sin(w) - b * cos(w)
        noise += e * e
    }
    return 10 * log10((a * a + b * b) / 2 / max(noise / Double(x.count), 1e-20))
}
