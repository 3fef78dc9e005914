/// Counts the packets lost on the network from their sequence numbers, RFC 3550 style: the packets expected (the
/// span of sequence numbers seen) minus the distinct packets received. A bitmap of the last 1024 sequence numbers
/// keeps duplicates and late copies out of the received count, so that late packets count as received, not lost.
///
/// Sequence numbers (UInt32) are extended to Int64 with wrapping arithmetic. A forward jump beyond
/// `maximumDropout` is believed only once the next packet continues from it (RFC 3550 A.1's probation): one packet
/// with a wild sequence number, its frames in place, must not count a million packets lost. Pure; preallocated.
struct LossTracker {
    /// Sequence numbers the bitmap covers.
    static let window = 1024
    /// The longest forward jump taken at once: 3000 packets (RFC 3550's MAX_DROPOUT), 8.7 s of 128-frame packets
    /// at 44.1 kHz. A longer silence with the frames still continuous is confirmed by the packet after it.
    static let maximumDropout: Int64 = 3000

    private enum State {
        /// No stream: nothing is counted.
        case idle
        /// Counting a stream whose first sequence number was `first` and highest so far `highest` (extended), of
        /// which `received` distinct packets arrived.
        case counting(first: Int64, highest: Int64, received: UInt64)
    }

    private var state = State.idle
    /// Bitmap of the last `window` extended sequence numbers seen.
    private var seen = [UInt64](repeating: 0, count: LossTracker.window / 64)
    /// Losses of the streams already closed.
    private var lostInClosedStreams: UInt64 = 0
    /// The sequence number of the latest packet that jumped beyond `maximumDropout`, on probation: the next packet
    /// confirms the jump by continuing from it.
    private var probation: UInt32?

    /// Packets sent by the host's count, over every stream: the span of sequence numbers seen (RFC 3550's
    /// "expected"), which the received and the lost packets make up.
    private var expectedInClosedStreams: UInt64 = 0

    /// Packets lost so far, over every stream.
    var lostPackets: UInt64 { lostInClosedStreams &+ lostInStream }

    /// Packets the host sent so far, over every stream (received or lost): what a loss fraction is a fraction of.
    var expectedPackets: UInt64 { expectedInClosedStreams &+ expectedInStream }

    /// Starts counting a new stream at its first packet, `sequence` (received).
    mutating func startStream(at sequence: UInt32) {
        let first = Int64(sequence)
        state = .counting(first: first, highest: first, received: 0)
        probation = nil
        for i in seen.indices { seen[i] = 0 }
        _ = noteSequence(sequence)
        countReceived()
    }

    /// Ends the current stream's count, keeping its losses (a resync, or the buffer reset).
    mutating func closeStream() {
        lostInClosedStreams &+= lostInStream
        expectedInClosedStreams &+= expectedInStream
        state = .idle
        probation = nil
    }

    /// How far `sequence` is ahead of the highest sequence number seen (negative: behind), with wrapping.
    func distance(to sequence: UInt32) -> Int64 {
        Int64(Int32(bitPattern: sequence &- UInt32(truncatingIfNeeded: highest)))
    }

    /// Records a sequence number. Returns false when it was seen already (a duplicate, or a late copy). A jump
    /// beyond `maximumDropout` that the previous packet did not start is put on probation: the packet counts as
    /// received, and the span of sequence numbers is not stretched to it.
    mutating func noteSequence(_ sequence: UInt32) -> Bool {
        guard case .counting(let first, let highest, let received) = state else { return true }
        let delta = distance(to: sequence)
        if delta > Self.maximumDropout {
            let confirms = probation == sequence &- 1
            probation = sequence
            if !confirms { return true }
        }
        let extended = highest + delta
        if delta > 0 {
            var s = highest + 1
            let stop = min(extended, highest + Int64(Self.window))
            while s <= stop { setSeen(s, false); s += 1 }
            state = .counting(first: first, highest: extended, received: received)
        } else if delta <= -Int64(Self.window) {
            return true  // too old to tell
        }
        if isSeen(extended) { return false }
        setSeen(extended, true)
        return true
    }

    /// Counts one more distinct packet received.
    mutating func countReceived() {
        guard case .counting(let first, let highest, let received) = state else { return }
        state = .counting(first: first, highest: highest, received: received &+ 1)
    }

    private var highest: Int64 {
        if case .counting(_, let highest, _) = state { highest } else { 0 }
    }

    private var expectedInStream: UInt64 {
        guard case .counting(let first, let highest, let received) = state else { return 0 }
        return max(UInt64(highest - first + 1), received)
    }

    private var lostInStream: UInt64 {
        guard case .counting(let first, let highest, let received) = state else { return 0 }
        let expected = highest - first + 1
        return expected > Int64(received) ? UInt64(expected - Int64(received)) : 0
    }

    private func isSeen(_ extended: Int64) -> Bool {
        let bit = Int(UInt64(bitPattern: extended) % UInt64(Self.window))
        return seen[bit >> 6] & (1 << UInt64(bit & 63)) != 0
    }

    private mutating func setSeen(_ extended: Int64, _ value: Bool) {
        let bit = Int(UInt64(bitPattern: extended) % UInt64(Self.window))
        if value { seen[bit >> 6] |= 1 << UInt64(bit & 63) } else { seen[bit >> 6] &= ~(1 << UInt64(bit & 63)) }
    }
}
