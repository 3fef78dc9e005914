import FoundationEssentials

/// Appends big-endian integers and byte strings to a growing buffer.
struct ByteWriter {
    private(set) var bytes: [UInt8]

    init(capacity: Int = 64) {
        bytes = []
        bytes.reserveCapacity(capacity)
    }

    mutating func u8(_ v: UInt8) { bytes.append(v) }
    mutating func u16(_ v: UInt16) { bytes.append(UInt8(v >> 8)); bytes.append(UInt8(v & 0xff)) }
    mutating func u32(_ v: UInt32) { for s in stride(from: 24, through: 0, by: -8) { bytes.append(UInt8((v >> UInt32(s)) & 0xff)) } }
    mutating func u64(_ v: UInt64) { for s in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8((v >> UInt64(s)) & 0xff)) } }
    mutating func raw(_ d: some Sequence<UInt8>) { bytes.append(contentsOf: d) }
    /// Overwrites a big-endian UInt32 written earlier at `offset`.
    mutating func patchU32(at offset: Int, _ v: UInt32) {
        bytes[offset] = UInt8(v >> 24); bytes[offset + 1] = UInt8((v >> 16) & 0xff)
        bytes[offset + 2] = UInt8((v >> 8) & 0xff); bytes[offset + 3] = UInt8(v & 0xff)
    }
}

/// Reads big-endian integers from a byte buffer; every read is bounds-checked and returns `nil` past the end,
/// so a decoder built on it never traps on any input.
struct ByteReader {
    private let base: UnsafeRawBufferPointer
    private(set) var offset: Int

    init(_ base: UnsafeRawBufferPointer, offset: Int = 0) {
        self.base = base
        self.offset = offset
    }

    var remaining: Int { base.count - offset }

    mutating func u8() -> UInt8? {
        guard remaining >= 1 else { return nil }
        defer { offset += 1 }
        return base[offset]
    }

    mutating func u16() -> UInt16? {
        guard remaining >= 2 else { return nil }
        defer { offset += 2 }
        return UInt16(base[offset]) << 8 | UInt16(base[offset + 1])
    }

    mutating func u32() -> UInt32? {
        guard remaining >= 4 else { return nil }
        var v: UInt32 = 0
        for i in 0..<4 { v = v << 8 | UInt32(base[offset + i]) }
        offset += 4
        return v
    }

    mutating func u64() -> UInt64? {
        guard remaining >= 8 else { return nil }
        var v: UInt64 = 0
        for i in 0..<8 { v = v << 8 | UInt64(base[offset + i]) }
        offset += 8
        return v
    }

    mutating func bytes(_ n: Int) -> UnsafeRawBufferPointer? {
        guard n >= 0, remaining >= n else { return nil }
        defer { offset += n }
        return UnsafeRawBufferPointer(rebasing: base[offset..<(offset + n)])
    }

    mutating func rest() -> UnsafeRawBufferPointer { bytes(remaining)! }
}
