/// Rejects duplicated datagrams: remembers the highest sequence seen and a 1024-wide window behind it
/// (RFC 4303's anti-replay window). Pure.
struct ReplayWindow: Sendable {
    static let width: UInt64 = 1024
    /// The highest sequence number accepted so far (0: none).
    private(set) var highest: UInt64 = 0
    private var bits = [UInt64](repeating: 0, count: Int(width / 64))

    /// Returns `true` the first time `sequence` is seen and it is inside or ahead of the window; `false` for a
    /// duplicate, for 0, or for one too old to tell.
    mutating func accept(_ sequence: UInt64) -> Bool {
        guard sequence != 0 else { return false }
        if sequence > highest {
            let shift = sequence - highest
            if shift >= Self.width {
                for i in bits.indices { bits[i] = 0 }
            } else {
                for s in (highest + 1)...sequence { clear(s) }
            }
            highest = sequence
            set(sequence)
            return true
        }
        guard highest - sequence < Self.width else { return false }
        if isSet(sequence) { return false }
        set(sequence)
        return true
    }

    private func slot(_ s: UInt64) -> (Int, UInt64) { (Int((s % Self.width) / 64), UInt64(1) << (s % 64)) }
    private mutating func set(_ s: UInt64) { let (i, m) = slot(s); bits[i] |= m }
    private mutating func clear(_ s: UInt64) { let (i, m) = slot(s); bits[i] &= ~m }
    private func isSet(_ s: UInt64) -> Bool { let (i, m) = slot(s); return bits[i] & m != 0 }
}
