import MeshAudio
import MeshPipeline
import MeshPOSIX
import PeerMesh
import Synchronization

/// What the player learns from each datagram of audio, on whichever thread reads it: lock-free counters and flags.
final class AudioArrivals: Sendable {
    /// Frames of audio that reached a pipeline.
    let framesReceived = Atomic<UInt64>(0)
    /// When the first audio arrived (0: not yet).
    let firstAudio = Atomic<UInt64>(0)
    /// Whether audio arrived since the player last joined a host.
    let sinceJoin = Atomic<Bool>(false)
    /// Whether the current pipeline has queued audio from a host.
    let inPipeline = Atomic<Bool>(false)

    /// A datagram that arrived at `now` had `outcome` in the pipeline. Real-time safe.
    @inline(__always)
    func note(_ outcome: PacketIngress.Outcome?, at now: UInt64) {
        guard case .queued(let frames) = outcome else { return }
        framesReceived.wrappingAdd(UInt64(frames), ordering: .relaxed)
        sinceJoin.store(true, ordering: .relaxed)
        inPipeline.store(true, ordering: .relaxed)
        _ = firstAudio.compareExchange(expected: 0, desired: max(1, now), ordering: .acquiringAndReleasing)
    }
}

/// The player's datagrams as a pipeline's `PacketSource`: its session's `DatagramReader`, read by the sink's real-time
/// thread into that pipeline, so that one thread wakes per period for the network and the device.
final class SessionPackets: PacketSource {
    let reader: DatagramReader
    let arrivals: AudioArrivals

    init(reader: DatagramReader, arrivals: AudioArrivals) {
        self.reader = reader
        self.arrivals = arrivals
    }

    var descriptor: Int32 { reader.descriptor }

    /// Datagrams taken per read at the most: no more than the pipeline's ring holds (the sink's thread takes them in
    /// before it reads again).
    static let batch = 32

    /// Reads no more than the ring surely has room for (`PacketIngress.readBatch`: an Opus datagram that follows a
    /// gap takes a slot for each packet its decoder conceals).
    func read(into ingress: PacketIngress) {
        let arrivals = self.arrivals
        reader.read(maximum: ingress.readBatch(maximum: Self.batch)) { bytes, _ in
            let now = MonotonicClock.nowNanos()
            arrivals.note(ingress.receive(bytes, arrivalNanos: now), at: now)
        }
    }
}

/// Reads a session's datagrams on a thread of its own (`pm-net`), for a sink that does not serve inputs
/// (`AudioSink.servesInput` false: a custom sink): each one goes to `deliver` with its arrival time.
final class DatagramPump: Sendable {
    private let reader: DatagramReader
    private let lifecycle = StageLifecycle(stage: "DatagramPump", threadName: "pm-net", scheduling: .normal)
    private let deliver: @Sendable (UnsafeRawBufferPointer, UInt64) -> Void

    init(reader: DatagramReader, deliver: @escaping @Sendable (UnsafeRawBufferPointer, UInt64) -> Void) {
        self.reader = reader
        self.deliver = deliver
    }

    /// Starts the thread (once).
    func start() throws {
        let reader = self.reader, deliver = self.deliver, lifecycle = self.lifecycle
        try lifecycle.start {
            let polls = PollSet(capacity: 1)
            while lifecycle.isRunning {
                polls.removeAll()
                polls.appendReadable(reader.descriptor)
                // A bounded wait, so that `stop` is seen within 100 ms.
                _ = polls.wait(untilNanos: MonotonicClock.nowNanos() &+ 100_000_000)
                switch polls.readiness(at: 0) {
                case .readable: reader.read { bytes, _ in deliver(bytes, MonotonicClock.nowNanos()) }
                case .gone: return
                case .idle: break
                }
            }
        }
    }

    /// Stops the thread and waits for it.
    func stop() { lifecycle.stop() }
}
