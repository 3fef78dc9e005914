import MeshPOSIX

/// The impairment proxy's deterministic random source: xoshiro256** (Blackman & Vigna) seeded through SplitMix64.
/// The same seed gives the same sequence on every machine, so a run is reproducible given the same datagrams.
public struct ImpairmentRandom: RandomNumberGenerator, Sendable {
    private var s0: UInt64, s1: UInt64, s2: UInt64, s3: UInt64

    /// A generator whose whole sequence is fixed by `seed`.
    public init(seed: UInt64) {
        var sm = SplitMix64(seed: seed)
        s0 = sm.next(); s1 = sm.next(); s2 = sm.next(); s3 = sm.next()
    }

    /// The next 64 random bits.
    public mutating func next() -> UInt64 {
        let result = rotl(s1 &* 5, 7) &* 9
        let t = s1 << 17
        s2 ^= s0; s3 ^= s1; s1 ^= s2; s0 ^= s3
        s2 ^= t
        s3 = rotl(s3, 45)
        return result
    }

    /// A uniform value in [0, 1) with 53 bits of precision.
    public mutating func nextUnit() -> Double { Double(next() >> 11) * 0x1.0p-53 }

    private func rotl(_ x: UInt64, _ k: UInt64) -> UInt64 { (x << k) | (x >> (64 - k)) }
}
