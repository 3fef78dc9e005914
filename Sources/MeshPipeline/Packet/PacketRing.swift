import MeshAudio
import Synchronization

/// A decoded packet as it waits in a `PacketRing` slot.
public struct ReceivedPacket: Sendable, Equatable {
    /// The packet's header.
    public var header: AudioPacketHeader
    /// Receiver `CLOCK_MONOTONIC` nanoseconds at which the datagram arrived.
    public var arrivalNanos: UInt64
    /// True for frames the Opus decoder synthesized for a packet the network lost (`PacketIngress`): the jitter
    /// buffer plays them but counts the packet as lost, and takes no transit from it.
    public var concealed: Bool

    public init(header: AudioPacketHeader, arrivalNanos: UInt64, concealed: Bool = false) {
        self.header = header
        self.arrivalNanos = arrivalNanos
        self.concealed = concealed
    }
}

/// A preallocated single-producer single-consumer ring of fixed-size packet slots.
///
/// The network receive thread (the only producer, through `PacketIngress`) decodes each datagram's samples straight
/// into a free slot with `push`, its header already decoded; the playback real-time thread (the only consumer) reads
/// them in place with `pop`. Slot ownership is handed over
/// by the release/acquire `head`/`tail` atomics; nothing allocates or locks after `init`.
public final class PacketRing: @unchecked Sendable {
    // @unchecked: slot memory is written only by the producer before releasing `head` and read only by the
    // consumer before releasing `tail`, so the raw pointers are never accessed concurrently.

    /// Outcome of a producer `push`.
    public enum PushResult: Equatable, Sendable {
        /// Stored; `sanitized` samples had to be clamped or zeroed.
        case pushed(sanitized: Int)
        case full
        case malformed(AudioPacketError)
    }

    /// Slots in the ring.
    public let capacity: Int
    /// Samples each slot can hold.
    public let samplesPerSlot: Int
    private let headers: UnsafeMutablePointer<ReceivedPacket>
    private let samples: UnsafeMutablePointer<Float>
    private let head = Atomic<Int>(0)  // next slot to write; written by the producer only
    private let tail = Atomic<Int>(0)  // next slot to read; written by the consumer only

    /// Allocates `capacity` slots of `samplesPerSlot` samples each.
    public init(capacity: Int, samplesPerSlot: Int = AudioPacket.maximumSamples) {
        precondition(capacity > 0 && samplesPerSlot > 0, "PacketRing needs at least one slot of one sample")
        self.capacity = capacity
        self.samplesPerSlot = samplesPerSlot
        headers = .allocate(capacity: capacity)
        let blank = ReceivedPacket(
            header: AudioPacketHeader(sequence: 0, firstFrameIndex: 0, frameCount: 0, format: .default), arrivalNanos: 0)
        headers.initialize(repeating: blank, count: capacity)
        samples = .allocate(capacity: capacity * samplesPerSlot)
        samples.initialize(repeating: 0, count: capacity * samplesPerSlot)
    }

    deinit {
        headers.deinitialize(count: capacity)
        headers.deallocate()
        samples.deallocate()
    }

    /// Packets waiting (approximate when read from a third thread).
    public var count: Int { head.load(ordering: .acquiring) - tail.load(ordering: .acquiring) }

    /// Producer: decodes the samples of `bytes`, whose header `AudioPacket.decodeHeader` returned as `header`,
    /// into the next free slot, sanitized (`AudioPacket.decodeSamples`). A packet too big for a slot is rejected as
    /// `.malformed`, and nothing is stored.
    public func push(header: AudioPacketHeader, payload bytes: UnsafeRawBufferPointer, arrivalNanos: UInt64) -> PushResult {
        push(ReceivedPacket(header: header, arrivalNanos: arrivalNanos)) { slot throws(AudioPacketError) in
            try AudioPacket.decodeSamples(bytes, header: header, into: slot)
        }
    }

    /// Producer: has `fill` write `packet`'s `frameCount × channels` samples into the next free slot (it returns how
    /// many it had to sanitize, or throws for a packet that cannot be decoded: nothing is stored then). A packet too
    /// big for a slot is rejected as `.malformed` before `fill` runs.
    public func push(_ packet: ReceivedPacket,
                     fill: (UnsafeMutableBufferPointer<Float>) throws(AudioPacketError) -> Int) -> PushResult {
        let size = packet.header.frameCount * packet.header.format.channels
        guard size <= samplesPerSlot else { return .malformed(.tooLarge(size)) }
        let h = head.load(ordering: .relaxed)
        guard h - tail.load(ordering: .acquiring) < capacity else { return .full }
        let slot = h % capacity
        let sanitized: Int
        do {
            sanitized = try fill(UnsafeMutableBufferPointer(start: samples + slot * samplesPerSlot, count: samplesPerSlot))
        } catch { return .malformed(error) }
        headers[slot] = packet
        head.store(h + 1, ordering: .releasing)
        return .pushed(sanitized: sanitized)
    }

    /// Consumer: hands the oldest packet and its interleaved samples to `body`, then frees the slot.
    /// Returns nil (without calling `body`) when the ring is empty.
    @inline(__always)
    public func pop<R>(_ body: (ReceivedPacket, UnsafeBufferPointer<Float>) -> R) -> R? {
        let t = tail.load(ordering: .relaxed)
        guard head.load(ordering: .acquiring) > t else { return nil }
        let slot = t % capacity
        let packet = headers[slot]
        let n = packet.header.frameCount * packet.header.format.channels
        let r = body(packet, UnsafeBufferPointer(start: samples + slot * samplesPerSlot, count: n))
        tail.store(t + 1, ordering: .releasing)
        return r
    }
}
