/// The jitter buffer's frames: a ring of `capacityFrames` interleaved frames, each with a presence flag, indexed by
/// stream frame index.
///
/// Slots are relative to the stream's first frame (`streamStart`), so the mapping stays continuous across the UInt64
/// wrap of frame indices. Pure; preallocated in `init`, nothing allocates after.
struct FrameStore {
    /// Samples per frame.
    let channels: Int
    /// Frames the ring holds.
    let capacityFrames: Int
    /// The frame index slot 0 is counted from: the current stream's first frame.
    private(set) var streamStart: UInt64 = 0
    private var samples: [Float]
    private var present: [UInt8]

    /// An empty store of `capacityFrames` frames of `channels` samples.
    init(channels: Int, capacityFrames: Int) {
        precondition(channels > 0 && capacityFrames > 0, "FrameStore needs at least one frame of one sample")
        self.channels = channels
        self.capacityFrames = capacityFrames
        samples = [Float](repeating: 0, count: capacityFrames * channels)
        present = [UInt8](repeating: 0, count: capacityFrames)
    }

    /// Forgets every frame.
    mutating func clear() {
        for i in present.indices { present[i] = 0 }
    }

    /// Forgets every frame and counts slots from `firstFrame`, a new stream's first frame.
    mutating func restart(at firstFrame: UInt64) {
        clear()
        streamStart = firstFrame
    }

    /// Stores `count` frames starting at frame `first` from `source` (interleaved, `count × channels` samples).
    mutating func store(_ source: UnsafeBufferPointer<Float>, first: UInt64, count: Int) {
        let ch = channels
        var s = slot(first)
        for i in 0..<count {
            let src = i * ch, dst = s * ch
            for c in 0..<ch { samples[dst + c] = source[src + c] }
            present[s] = 1
            s += 1
            if s == capacityFrames { s = 0 }
        }
    }

    /// Whether every frame of `first ..< first + count` is present.
    func holdsAll(first: UInt64, count: Int) -> Bool {
        for i in 0..<count where present[slot(first &+ UInt64(i))] == 0 { return false }
        return true
    }

    /// Forgets the frames `first ..< first + count` (more than the store holds forgets every frame once).
    mutating func drop(first: UInt64, count: Int) {
        for i in 0..<min(count, capacityFrames) { present[slot(first &+ UInt64(i))] = 0 }
    }

    /// Moves frame `index`, if present, to frame `frame` of `destination` (interleaved) and forgets it. Returns
    /// whether it was present (`destination` is untouched otherwise).
    @inline(__always)
    mutating func take(_ index: UInt64, into destination: UnsafeMutableBufferPointer<Float>, frame: Int) -> Bool {
        let s = slot(index)
        guard present[s] != 0 else { return false }
        present[s] = 0
        let src = s * channels, dst = frame * channels
        for c in 0..<channels { destination[dst + c] = samples[src + c] }
        return true
    }

    @inline(__always)
    private func slot(_ index: UInt64) -> Int {
        let r = Int(Int64(bitPattern: index &- streamStart) % Int64(capacityFrames))
        return r < 0 ? r + capacityFrames : r
    }
}
