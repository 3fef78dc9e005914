/// Decides when a packet restarts the stream (a resync: the host restarted its frame count, or jumped): a packet
/// more than the buffer's length ahead of the playout point; one far behind it (more than max(2 × target, 100 ms))
/// whose sequence number moved on, or jumped back by more than 1000; or the 8th late packet in a row. Pure.
struct ResyncDetector {
    /// Late packets in a row so far.
    private(set) var lateRun = 0

    /// A packet arrived whose first frame is `behindFrames` before the playout point (negative: ahead) and whose end
    /// is `aheadEndFrames` after it, with sequence number `sequenceDistance` after the highest seen. Returns whether
    /// it restarts the stream (the late run starts over then).
    mutating func packetArrived(behindFrames behind: Int64, aheadEndFrames aheadEnd: Int64, sequenceDistance: Int64,
                                targetFrames: Double, rate: Double, capacityFrames: Int) -> Bool {
        let farBehind = behind > Int64(max(2 * targetFrames, rate * 0.1))
        let restart = aheadEnd > Int64(capacityFrames)                                 // jumped beyond the buffer
            || (farBehind && (sequenceDistance > 0 || sequenceDistance < -1000))        // index went back, sequence on
            || (behind > 0 && lateRun >= 7)                                              // a run of late packets
        if restart { lateRun = 0 }
        return restart
    }

    /// The packet came too late. Returns whether it is the third (or later) in a row: no isolated outlier, the delay
    /// stepped up.
    mutating func packetLate() -> Bool {
        lateRun += 1
        return lateRun >= 3
    }

    /// The packet was stored: the run of late packets is over.
    mutating func packetStored() { lateRun = 0 }
}
