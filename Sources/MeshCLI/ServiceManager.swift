// The one file that calls libsystemd (CSystemd): readiness, status and the watchdog of sd_notify(3). libsystemd is
// loaded (dlopen) only when a service manager listens: a CLI run by hand does not map it and the libraries it pulls in.
import CSystemd
#if canImport(Glibc)
import Glibc
#endif
import MeshPOSIX

/// libsystemd's two entry points, resolved once.
private struct LibSystemd: Sendable {
    let notify: pm_sd_notify_fn
    let watchdogEnabled: pm_sd_watchdog_enabled_fn

    /// Loaded on first use under a service manager; nil when libsystemd is not there (nothing is sent then).
    static let shared: LibSystemd? = try? {
        let lib = try SharedLibrary.load(["libsystemd.so.0"])
        return LibSystemd(notify: try lib.function("sd_notify", as: pm_sd_notify_fn.self),
                          watchdogEnabled: try lib.function("sd_watchdog_enabled", as: pm_sd_watchdog_enabled_fn.self))
    }()
}

/// Talks to the service manager when the CLI runs as a systemd service (`Type=notify`, `WatchdogSec=`). Outside
/// systemd (no `NOTIFY_SOCKET`) every call does nothing, and libsystemd is not loaded.
package enum ServiceManager {
    /// Whether a service manager listens (`NOTIFY_SOCKET` is set).
    package static var isManaged: Bool { getenv("NOTIFY_SOCKET") != nil }

    /// Sends `fields` (`READY=1`, `STATUS=…`, `WATCHDOG=1`, `STOPPING=1`) to the service manager. A failure is
    /// ignored on purpose: a lost notification must not stop the relay.
    package static func notify(_ fields: String) {
        guard isManaged, let lib = LibSystemd.shared else { return }
        _ = lib.notify(0, fields)
    }

    /// Readiness, with a status line people see in `systemctl status`.
    package static func ready(status: String) {
        notify("READY=1\nSTATUS=\(status.replacingNewlines)")
    }

    /// A status line for `systemctl status`.
    package static func status(_ text: String) {
        notify("STATUS=\(text.replacingNewlines)")
    }

    /// The interval systemd expects a `WATCHDOG=1` within (`WatchdogSec=`), in nanoseconds, or nil.
    package static var watchdogIntervalNanos: UInt64? {
        guard isManaged, let lib = LibSystemd.shared else { return nil }
        var usec: UInt64 = 0
        return lib.watchdogEnabled(0, &usec) > 0 && usec > 0 ? usec * 1_000 : nil
    }

    /// Feeds the watchdog from `loop` (the I/O loop every session runs on), at half the interval systemd asked
    /// for: if the I/O loop stalls, systemd notices and restarts the service. Does nothing without a watchdog.
    package static func feedWatchdog(from loop: EventLoop) {
        guard let interval = watchdogIntervalNanos else { return }
        let period = max(interval / 2, 1_000_000)
        @Sendable func tick() {
            notify("WATCHDOG=1")
            loop.schedule(at: MonotonicClock.nowNanos() + period) { tick() }
        }
        loop.execute { tick() }
    }
}

private extension String {
    var replacingNewlines: String { String(map { $0 == "\n" ? " " : $0 }) }
}
