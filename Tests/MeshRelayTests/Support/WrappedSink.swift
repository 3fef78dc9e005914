import MeshAudio

/// An output that passes everything to the sink it wraps: tests subclass it to make an output misbehave as a device
/// can (fail on demand, take one client at a time).
class WrappedSink: AudioSink, @unchecked Sendable {  // Sendable: its one stored property is a Sendable sink.
    let inner: any AudioSink

    init(_ inner: any AudioSink) { self.inner = inner }

    var format: AudioFormat { inner.format }
    var periodFrames: Int { inner.periodFrames }
    var servesInput: Bool { inner.servesInput }
    func start(renderer: any AudioRenderer) throws { try inner.start(renderer: renderer) }
    func stop() { inner.stop() }
    var stats: AudioStats { inner.stats }
    var fault: (any Error)? { inner.fault }
    var schedulingNote: String? { inner.schedulingNote }
}
