#ifndef PEERMESH_CSYSTEMD_SHIM_H
#define PEERMESH_CSYSTEMD_SHIM_H
// sd_notify(3) only. MeshCLI loads libsystemd when a service manager listens (NOTIFY_SOCKET is set): a CLI run by hand
// does not map it. These are the types of the entry points it resolves (dlsym), from systemd's own declarations.
#include <systemd/sd-daemon.h>

typedef __typeof__(&sd_notify) pm_sd_notify_fn;
typedef __typeof__(&sd_watchdog_enabled) pm_sd_watchdog_enabled_fn;
#endif
