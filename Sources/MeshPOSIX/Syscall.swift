#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A failed system call: which call, its `errno`, and `strerror`'s text.
///
/// Every library in the package maps it into its own typed error (`PeerMeshError.transport`,
/// `ImpairmentError.system`, …) at its edge, so the text users see always carries the call and the system's words.
package struct SyscallError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The call and its subject, e.g. `bind(UDP 127.0.0.1:7000)`.
    package let call: String
    /// The `errno` value.
    package let code: Int32

    package init(call: String, code: Int32) {
        self.call = call
        self.code = code
    }

    /// `strerror(code)`.
    package var text: String { Sys.errorText(code) }

    package var description: String { "\(call): \(text)" }
}

/// The one place the package calls the raw POSIX API through: a negative return becomes a `SyscallError` with the
/// call's name and `errno`; `EINTR` is retried.
package enum Sys {
    /// Runs `body` until it does not fail with `EINTR`; a negative result throws.
    @discardableResult
    @inline(__always)
    package static func call<T: BinaryInteger>(_ what: @autoclosure () -> String, _ body: () -> T) throws(SyscallError) -> T {
        while true {
            let r = body()
            if r >= 0 { return r }
            let e = errno
            if e == EINTR { continue }
            throw SyscallError(call: what(), code: e)
        }
    }

    /// Like `call`, but `EAGAIN`/`EWOULDBLOCK`/`EINPROGRESS` come back as `nil` instead of an error.
    @inline(__always)
    package static func nonBlocking<T: BinaryInteger>(_ what: @autoclosure () -> String, _ body: () -> T) throws(SyscallError) -> T? {
        while true {
            let r = body()
            if r >= 0 { return r }
            let e = errno
            if e == EINTR { continue }
            if e == EAGAIN || e == EWOULDBLOCK || e == EINPROGRESS { return nil }
            throw SyscallError(call: what(), code: e)
        }
    }

    /// `strerror(code)` as a Swift string.
    package static func errorText(_ code: Int32) -> String { String(cString: strerror(code)) }

    /// Sets `O_NONBLOCK`.
    package static func setNonBlocking(_ fd: Int32) throws(SyscallError) {
        let flags = try call("fcntl(F_GETFL)") { fcntl(fd, F_GETFL) }
        try call("fcntl(F_SETFL)") { fcntl(fd, F_SETFL, flags | O_NONBLOCK) }
    }

    /// `setsockopt` with an `Int32` value.
    package static func setOption(_ fd: Int32, _ level: Int32, _ name: Int32, _ value: Int32) throws(SyscallError) {
        var v = value
        try call("setsockopt(\(level), \(name))") { setsockopt(fd, level, name, &v, socklen_t(MemoryLayout<Int32>.size)) }
    }

    /// Raises the soft limit on open files to the hard limit (a host serving many peers needs descriptors).
    /// Returns the new soft limit.
    @discardableResult
    package static func raiseFileLimit() -> UInt64 {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 0 }
        if limit.rlim_cur < limit.rlim_max {
            var raised = limit
            raised.rlim_cur = limit.rlim_max
            if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &raised) == 0 { return UInt64(raised.rlim_cur) }
        }
        return UInt64(limit.rlim_cur)
    }
}
