import Foundation
@testable import MeshAudio
import MeshPOSIX

/// Facts about the JACK test rig started by scripts/lib/jack-rig.sh (see that file for the PCM wiring).
enum JackRig {
    /// True when the rig's environment is exported (rig tests are enabled only then).
    static let isRunning = ProcessInfo.processInfo.environment["MESH_JACK_RIG"] == "1"

    /// The rig directory (holds known.raw and asound.conf).
    static var directory: String { ProcessInfo.processInfo.environment["MESH_JACK_RIG_DIR"] ?? "" }

    /// The known signal pm_knowncap delivers: mono Float32LE samples of DIR/known.raw.
    static func knownSignal() throws -> [Float] {
        let data = try Data(contentsOf: URL(fileURLWithPath: directory + "/known.raw"))
        return data.withUnsafeBytes { raw in
            (0..<(data.count / 4)).map { Float(bitPattern: UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: $0 * 4, as: UInt32.self))) }
        }
    }
}

/// What a source delivered.
struct Capture {
    var samples: [Float] = []
    var chunks: [ChunkInfo] = []
    var elapsedSeconds: Double = 0

    /// True when every chunk starts where the previous one ended.
    var isContiguous: Bool {
        zip(chunks, chunks.dropFirst()).allSatisfy { $0.firstFrameIndex + UInt64($0.frames) == $1.firstFrameIndex }
    }
}

/// Reads from a started source until `frames` frames have arrived, the source ends, or `timeoutSeconds` pass.
/// With `stopAtNil`, the first `nil` from `read` ends it (to drain a stopped source).
func collect(_ source: any AudioSource, frames: Int, timeoutSeconds: Double = 5, stopAtNil: Bool = false) -> Capture {
    let channels = source.format.channels
    var buffer = [Float](repeating: 0, count: source.periodFrames * channels)
    var capture = Capture()
    let start = MonotonicClock.nowNanos()
    let deadline = start + UInt64(timeoutSeconds * 1e9)
    while capture.samples.count < frames * channels, MonotonicClock.nowNanos() < deadline {
        let info = buffer.withUnsafeMutableBufferPointer { source.read(into: $0, timeoutNanos: 200_000_000) }
        guard let info else {
            if stopAtNil { break }
            if let file = source as? WAVFileSource, file.isFinished { break }
            continue
        }
        capture.chunks.append(info)
        capture.samples.append(contentsOf: buffer[0..<(info.frames * channels)])
    }
    capture.elapsedSeconds = Double(MonotonicClock.nowNanos() - start) / 1e9
    return capture
}

/// Bit patterns, so comparisons are byte-exact (and NaN-safe).
func bits(_ samples: some Collection<Float>) -> [UInt32] { samples.map(\.bitPattern) }

/// A renderer that plays a fixed signal once, then silence. Preallocated: safe on a real-time thread.
final class SignalRenderer: AudioRenderer, @unchecked Sendable {  // `position` is touched only by the sink's thread.
    private let signal: UnsafeMutableBufferPointer<Float>
    private var position = 0
    let channels: Int

    init(_ samples: [Float], channels: Int = 1) {
        signal = .allocate(capacity: samples.count)
        _ = signal.initialize(from: samples)
        self.channels = channels
    }

    deinit { signal.deallocate() }

    func render(into buffer: UnsafeMutableBufferPointer<Float>, context: RenderContext) {
        let wanted = context.frames * channels
        let available = min(wanted, signal.count - position)
        for index in 0..<wanted { buffer[index] = index < available ? signal[position + index] : 0 }
        position += available
    }
}

/// A renderer that plays silence but stalls once, on pull number `stallOnPull`, for `stallNanos`, to force an
/// underrun. (Sleeping on the audio thread is the point of this test double.)
final class StallingRenderer: AudioRenderer, @unchecked Sendable {  // `pulls` is touched only by the sink's thread.
    private let stallOnPull: Int
    private let stallNanos: UInt64
    private var pulls = 0

    init(stallOnPull: Int, stallNanos: UInt64) {
        self.stallOnPull = stallOnPull
        self.stallNanos = stallNanos
    }

    func render(into buffer: UnsafeMutableBufferPointer<Float>, context: RenderContext) {
        pulls += 1
        if pulls == stallOnPull { MonotonicClock.sleep(untilNanos: MonotonicClock.nowNanos() + stallNanos) }
        buffer.update(repeating: 0)
    }
}

/// A fresh path in a per-test temporary directory.
func temporaryPath(_ name: String) -> String {
    let dir = FileManager.default.temporaryDirectory.appendingPathComponent("meshaudio-tests-\(getpid())")
    try? FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    return dir.appendingPathComponent("\(UUID().uuidString)-\(name)").path
}
