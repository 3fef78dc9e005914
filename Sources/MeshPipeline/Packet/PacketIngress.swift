import MeshAudio
import MeshPOSIX
import Synchronization

/// The first stage of the playout pipeline, on the network thread: decodes a datagram's header once, checks its
/// format once, and pushes the packet — samples decoded straight into a slot — into the `PacketRing` that the render
/// thread drains. What it drops it counts itself.
///
/// A packet in another format than the pipeline's is not queued: it is counted (`formatMismatches`) and reported
/// upward as `pendingFormat`, which the owner polls from its control queue to build a pipeline for that format.
/// Opus packets go through the stream's decoder (`OpusIngress`), which conceals short gaps itself. The decoder is made
/// when the first Opus packet arrives, off this thread (`OpusDecoderSlot`): packets that come before it is ready are
/// counted as `undecodedPackets`. One producer thread; lock-free and allocation-free.
public final class PacketIngress: Sendable {
    /// What became of one datagram.
    public enum Outcome: Sendable, Equatable {
        /// In the ring, for the render thread: `frames` frames of audio.
        case queued(frames: Int)
        /// Not an audio packet, or a corrupted one (counted as `malformed`).
        case malformed(AudioPacketError)
        /// A valid packet in another format (counted as a format mismatch, and left as `pendingFormat`).
        case formatChanged(AudioFormat)
        /// The render thread is behind: the ring is full (counted as a ring overflow).
        case ringFull
        /// An Opus packet older than one already decoded: the decoder has moved on (counted as stale).
        case stale
        /// An Opus packet that came before its decoder was ready, or when it cannot be made (counted as undecoded).
        case undecoded
    }

    /// Exact counts of the datagrams dropped here.
    public struct Counters: Sendable, Equatable, BitwiseCopyable {
        /// Datagrams that failed to decode.
        public var malformed: UInt64 = 0
        /// Valid packets of another format than the pipeline's.
        public var formatMismatches: UInt64 = 0
        /// Packets dropped because the ring was full.
        public var ringOverflows: UInt64 = 0
        /// Samples that arrived outside [−1, 1] (clamped) or not finite (zeroed).
        public var sanitizedSamples: UInt64 = 0
        /// Opus packets that arrived after a newer one was decoded (reordered or duplicated): dropped.
        public var stalePackets: UInt64 = 0
        /// Frames the Opus decoder synthesized for packets the network lost (played, and counted as concealed).
        public var decoderConcealedFrames: UInt64 = 0
        /// Opus packets dropped because their decoder was not ready: the first of a stream while libopus loads (about
        /// a millisecond), or every one when the decoder cannot be made (`PacketIngress.opusFailure` says why).
        public var undecodedPackets: UInt64 = 0
        public init() {}
    }

    /// What the stream that got through looks like on the wire.
    public struct WireUsage: Sendable, Equatable, BitwiseCopyable {
        /// Bytes of the audio packets queued (headers included): the stream's size before PeerMesh's datagram
        /// header and UDP/IP.
        public var queuedBytes: UInt64 = 0
        /// The sample encoding of the latest queued packet (nil before the first).
        public var encoding: SampleEncoding?
        public init() {}
    }

    /// The one format this stage passes on.
    public let format: AudioFormat
    private let ring: PacketRing
    private let counts = AtomicRecord(Counters())
    /// The Opus decoder, resampling to this pipeline's rate, made on the first Opus packet (nil for more than two
    /// channels, which Opus does not carry, or when the slot could not be set up: `opusSlotFailure`).
    private let opus: OpusDecoderSlot?
    /// Why there is no slot for a format Opus does carry (no eventfd, no I/O loop), or nil.
    private let opusSlotFailure: String?
    private let queuedBytes = Atomic<UInt64>(0)
    /// `SampleEncoding.rawValue` of the latest queued packet (0 = none yet).
    private let latestEncoding = Atomic<UInt8>(0)
    /// The latest other format seen and not yet taken (`PackedFormat`, 0 = none).
    private let pending = Atomic<UInt64>(0)

    /// Passes packets of `format` into `ring` (this stage is its only producer).
    public init(format: AudioFormat, ring: PacketRing) {
        self.format = format
        self.ring = ring
        var slot: OpusDecoderSlot?, failure: String?
        if format.channels <= 2 {
            do { slot = try OpusDecoderSlot(channels: format.channels, outputRate: format.sampleRate) } catch {
                failure = "cannot watch for Opus packets: \(error)"
            }
        }
        opus = slot
        opusSlotFailure = failure
    }

    /// Makes the Opus decoder now rather than on the first Opus packet (for an owner that knows Opus is coming, and
    /// for tests). Throws why it cannot be made.
    public func prepareOpusDecoder() throws(OpusDecoderUnavailable) {
        guard let opus else {
            throw OpusDecoderUnavailable(reason: opusSlotFailure ?? "Opus carries at most two channels, not \(format.channels)")
        }
        try opus.prepare()
    }

    /// Why this stage cannot decode the Opus packets that arrive (libopus is missing…), or nil.
    public var opusFailure: String? { opus?.failure ?? opusSlotFailure }

    /// Whether the Opus decoder has been made (a PCM stream never makes it).
    public var hasOpusDecoder: Bool { opus?.isMade ?? false }

    /// Producer side: how many datagrams the ring surely has room for now. A PCM datagram takes one slot; an Opus one
    /// up to `1 + OpusSequence.maximumConcealedPackets` (the packets its decoder conceals before it), which is what
    /// is assumed until a PCM packet has been queued. A reader that takes no more at once loses no packet that
    /// arrived to a ring it filled itself.
    public var datagramsWithRoom: Int {
        let free = max(0, ring.capacity - ring.count)
        let encoding = latestEncoding.load(ordering: .relaxed)
        let pcm = encoding != 0 && encoding != SampleEncoding.opus.rawValue
        return pcm ? free : free / (1 + OpusSequence.maximumConcealedPackets)
    }

    /// How many datagrams a reader on the producer's thread takes at once, `maximum` at the most: no more than
    /// `datagramsWithRoom` (a burst after a stall is then taken in over a few reads, the ring emptied between them,
    /// instead of overflowing it), and at least one, so that a readable socket is always read from.
    public func readBatch(maximum: Int) -> Int { max(1, min(maximum, datagramsWithRoom)) }

    /// Producer side (one network thread): takes one datagram that arrived at `arrivalNanos` (receiver clock).
    @discardableResult
    public func receive(_ datagram: UnsafeRawBufferPointer, arrivalNanos: UInt64) -> Outcome {
        let header: AudioPacketHeader
        do {
            header = try AudioPacket.decodeHeader(datagram)
        } catch {
            counts.add { $0.malformed += 1 }
            return .malformed(error)
        }
        // Opus is always 48 kHz on the wire and decoded to this pipeline's rate: only its channels must match.
        let wanted = header.encoding == .opus ? AudioFormat(sampleRate: format.sampleRate, channels: header.format.channels) : header.format
        guard wanted == format else {
            counts.add { $0.formatMismatches += 1 }
            pending.store(PackedFormat.pack(wanted), ordering: .releasing)
            return .formatChanged(wanted)
        }
        let pushed: PacketRing.PushResult
        // Frames queued at this pipeline's rate (Opus: what the resampler made of it, possibly none yet).
        var queuedFrames = header.frameCount
        if header.encoding == .opus {
            guard let slot = opus else {
                if opusSlotFailure != nil {
                    counts.add { $0.undecodedPackets += 1 }
                    return .undecoded
                }
                counts.add { $0.malformed += 1 }
                return .malformed(.unsupportedFormat)
            }
            guard let decoder = slot.decoder() else {
                counts.add { $0.undecodedPackets += 1 }
                return .undecoded
            }
            let r = decoder.receive(datagram, header: header, arrivalNanos: arrivalNanos, ring: ring)
            if r.concealedFrames > 0 { counts.add { $0.decoderConcealedFrames += UInt64(r.concealedFrames) } }
            if r.concealedOverflows > 0 { counts.add { $0.ringOverflows += UInt64(r.concealedOverflows) } }
            guard let p = r.push else {
                counts.add { $0.stalePackets += 1 }
                return .stale
            }
            pushed = p
            queuedFrames = r.frames
        } else {
            pushed = ring.push(header: header, payload: datagram, arrivalNanos: arrivalNanos)
        }
        switch pushed {
        case .pushed(let sanitized):
            if sanitized > 0 { counts.add { $0.sanitizedSamples += UInt64(sanitized) } }
            queuedBytes.add(UInt64(datagram.count), ordering: .relaxed)
            latestEncoding.store(header.encoding.rawValue, ordering: .relaxed)
            return .queued(frames: queuedFrames)
        case .full:
            counts.add { $0.ringOverflows += 1 }
            return .ringFull
        case .malformed(let error):
            counts.add { $0.malformed += 1 }
            return .malformed(error)
        }
    }

    /// The latest other format the host sent, taken (so each report is acted on once); nil when there is none.
    public func takePendingFormat() -> AudioFormat? {
        PackedFormat.unpack(pending.exchange(0, ordering: .acquiring))
    }

    /// A snapshot of the counters (any thread).
    public var counters: Counters { counts.load() }

    /// A snapshot of the wire usage (any thread).
    public var wire: WireUsage {
        var w = WireUsage()
        w.queuedBytes = queuedBytes.load(ordering: .relaxed)
        w.encoding = SampleEncoding(rawValue: latestEncoding.load(ordering: .relaxed))
        return w
    }
}

/// An `AudioFormat` in one atomic word: rate << 16 | channels << 8 | sample type (never 0: the type is ≥ 1).
enum PackedFormat {
    static func pack(_ format: AudioFormat) -> UInt64 {
        UInt64(truncatingIfNeeded: format.sampleRate) << 16 | UInt64(truncatingIfNeeded: format.channels & 0xFF) << 8
            | UInt64(format.sampleType.rawValue)
    }

    static func unpack(_ word: UInt64) -> AudioFormat? {
        guard let type = AudioFormat.SampleType(rawValue: UInt8(truncatingIfNeeded: word)) else { return nil }
        return AudioFormat(sampleRate: Int(word >> 16), channels: Int((word >> 8) & 0xFF), sampleType: type)
    }
}
