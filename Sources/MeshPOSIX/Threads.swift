#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import CLinux

/// Operating-system thread names, so `top -H`, `ps -L` and `perf` show what each thread is.
package enum ThreadName {
    /// Names the calling thread (`pthread_setname_np`; the kernel keeps 15 bytes).
    package static func setCurrent(_ name: String) { set(pthread_self(), name) }

    /// Names `thread`, which may be another thread of this process.
    package static func set(_ thread: pthread_t, _ name: String) {
        var bytes = Array(name.utf8.prefix(15))
        bytes.append(0)
        bytes.withUnsafeBufferPointer { p in
            p.withMemoryRebound(to: CChar.self) { _ = pthread_setname_np(thread, $0.baseAddress!) }
        }
    }

    /// The calling thread's name.
    package static var current: String {
        var buf = [CChar](repeating: 0, count: 32)
        pthread_getname_np(pthread_self(), &buf, buf.count)
        return String(decoding: buf.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

/// SplitMix64 (Steele, Lea & Flood): a small, fast, seedable generator. Used to expand a seed into the state of
/// stronger generators and, in tests, as the reproducible random source. Not for secrets.
package struct SplitMix64: RandomNumberGenerator, Sendable {
    private var state: UInt64

    package init(seed: UInt64) { state = seed }

    package mutating func next() -> UInt64 {
        state &+= 0x9e37_79b9_7f4a_7c15
        var z = state
        z = (z ^ (z >> 30)) &* 0xbf58_476d_1ce4_e5b9
        z = (z ^ (z >> 27)) &* 0x94d0_49bb_1331_11eb
        return z ^ (z >> 31)
    }
}
