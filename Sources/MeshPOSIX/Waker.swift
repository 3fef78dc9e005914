#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import CLinux

/// Wakes a thread blocked in `poll`/`epoll_wait`: a non-blocking `eventfd`.
package final class Waker: Sendable {
    /// The descriptor to poll for readability.
    package let descriptor: FileDescriptor

    package init() throws(SyscallError) {
        descriptor = FileDescriptor(try Sys.call("eventfd") { eventfd(0, Int32(EFD_CLOEXEC | EFD_NONBLOCK)) })
    }

    /// The descriptor number to poll.
    package var fd: Int32 { descriptor.fd }

    /// Makes the descriptor readable. Never blocks; safe from any thread.
    package func wake() {
        var one: UInt64 = 1
        _ = withUnsafeBytes(of: &one) { write(descriptor.fd, $0.baseAddress, 8) }
    }

    /// Consumes every pending wake-up.
    package func drain() {
        var count: UInt64 = 0
        _ = withUnsafeMutableBytes(of: &count) { read(descriptor.fd, $0.baseAddress, 8) }
    }
}
