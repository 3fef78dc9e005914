#!/usr/bin/env python3
"""The installed package, tested as an admin would use it (scripts/test-package runs this after `dpkg -i`).

1. The units' ExecStart= lines run under a harness that plays systemd's part: NOTIFY_SOCKET is a datagram socket
   this test owns and WATCHDOG_USEC asks for a watchdog. READY=1 must come after the host says it is advertised,
   and WATCHDOG=1 must repeat.
2. `mesh-record ctl` on that running host: `pair` opens a window and a player pairs through it, `paired` lists the
   player, `forget` disconnects it, and another user (uid 65534) cannot use the socket.

Needs the Avahi rig (MESH_AVAHI_RIG=1) and the JACK-free tone input. Every process it starts is stopped by its
process group; nothing is found by name.
"""
import os
import pwd
import re
import shutil
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

FAILURES = []


def check(ok, what):
    print(("  ok    " if ok else "  FAIL  ") + what, flush=True)
    if not ok:
        FAILURES.append(what)
    return ok


def exec_start(unit, instance=None):
    """The unit's ExecStart= command line, with %i/%I and $VARS from its EnvironmentFile expanded."""
    text = open(unit).read()
    line = re.search(r"^ExecStart=(.*)$", text, re.M).group(1)
    env = {}
    m = re.search(r"^EnvironmentFile=-?(.*)$", text, re.M)
    if m and os.path.exists(m.group(1)):
        for l in open(m.group(1)):
            l = l.strip()
            if l and not l.startswith("#") and "=" in l:
                k, v = l.split("=", 1)
                env[k] = shlex.split(v)[0] if v.strip() else ""
    if instance:
        line = line.replace("%I", instance).replace("%i", instance)
    return line, env


class Child:
    def __init__(self, argv, env=None):
        self.p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, start_new_session=True, env=env)
        CHILDREN.append(self)
        self.err = []
        self.times = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: [None for _ in self.p.stdout], daemon=True).start()

    def _read(self):
        for line in self.p.stderr:
            self.err.append(line.rstrip("\n"))
            self.times.append(time.monotonic())

    def when(self, text, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for i, l in enumerate(list(self.err)):
                if text in l:
                    return self.times[i]
            time.sleep(0.02)
        return None

    def stop(self):
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait(5)


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=kw.pop("timeout", 30), **kw)


CHILDREN = []
# Directories this test made as systemd would have (RuntimeDirectory=), removed at the end.
MADE = []


def main():
    if os.environ.get("MESH_AVAHI_RIG") != "1":
        print("package_test: needs scripts/test's Avahi rig (MESH_AVAHI_RIG=1): mDNS must stay on lo")
        return 1
    work = tempfile.mkdtemp(prefix="pmpkgtest.")
    try:
        return tests(work)
    finally:
        for c in CHILDREN:
            c.stop()
        shutil.rmtree(work, ignore_errors=True)
        for path in MADE:
            shutil.rmtree(path, ignore_errors=True)


def as_unit_user(unit, argv, made):
    """argv as systemd runs the unit's command: as its User= (with that user's groups, through setpriv), with its
    StateDirectory= and RuntimeDirectory= made for that user, mode 0700; one that exists already is handed to that
    user with everything in it, as systemd does (it chowns them recursively at start: a lock file a root run of
    mesh-record left in /run/peermesh must not keep the service from its control socket). What is to be removed at
    the end is appended to `made`: the RuntimeDirectory= always (systemd removes it when the service stops), the
    StateDirectory= if this made it."""
    text = open(unit).read()
    user = re.search(r"^User=(\S+)$", text, re.M).group(1)
    pw = pwd.getpwnam(user)
    for key, root in (("StateDirectory", "/var/lib"), ("RuntimeDirectory", "/run")):
        m = re.search(rf"^{key}=(\S+)$", text, re.M)
        if m:
            path = os.path.join(root, m.group(1))
            if not os.path.isdir(path):
                os.makedirs(path)
                made.append(path)
            elif key == "RuntimeDirectory" and path not in made:
                made.append(path)
            if os.path.islink(path):
                raise SystemExit(f"{path} is a symbolic link: not handed to {user} (systemd refuses one too)")
            # Relative to each directory's descriptor, never following a link: nothing outside is touched.
            for _, dirs, files, fd in os.fwalk(path):
                for name in dirs + files:
                    os.chown(name, pw.pw_uid, pw.pw_gid, dir_fd=fd, follow_symlinks=False)
            os.chown(path, pw.pw_uid, pw.pw_gid)
            os.chmod(path, 0o700)
    return ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", "--"] + argv, pw


def tests(work):
    service = "pmpkg" + str(os.getpid() % 100000)
    # 1. mesh-record.service's ExecStart under a notify harness, as the unit's user (peermesh), as systemd runs it.
    unit = "/lib/systemd/system/mesh-record.service"
    line, env = exec_start(unit)
    opts = f"--input tone:440 --service {service} --name pkg-host --bind 127.0.0.1"
    cmd = line.replace("$MESH_RECORD_OPTS", opts)
    argv, pw = as_unit_user(unit, shlex.split(cmd), MADE)
    notify_path = os.path.join(work, "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(notify_path)
    sock.settimeout(0.2)
    # The service's user reaches the harness's socket, as it reaches systemd's.
    os.chmod(work, 0o711)
    os.chown(notify_path, pw.pw_uid, pw.pw_gid)
    child_env = dict(os.environ, NOTIFY_SOCKET=notify_path, WATCHDOG_USEC="1000000")
    host = Child(argv, env=child_env)
    messages = []
    start = time.monotonic()
    while time.monotonic() - start < 8:
        try:
            data = sock.recv(4096).decode()
            messages.append((time.monotonic(), data))
        except socket.timeout:
            pass
        if any("READY=1" in m for _, m in messages) and sum("WATCHDOG=1" in m for _, m in messages) >= 4:
            break
    advertised = host.when("advertised as _", 1)
    ready = next((t for t, m in messages if "READY=1" in m), None)
    watchdogs = [t for t, m in messages if "WATCHDOG=1" in m]
    print(f"  notify: {[m.replace(chr(10), ' | ') for _, m in messages[:3]]} … ({len(watchdogs)} × WATCHDOG=1)")
    check(ready is not None, "the host sends READY=1 (Type=notify)")
    ready_message = next((m for _, m in messages if "READY=1" in m), "")
    check(advertised is not None and "STATUS=serving, advertised" in ready_message,
          "READY=1 comes once the host is advertised: " + ready_message.replace("\n", " | "))
    check(len(watchdogs) >= 3, f"WATCHDOG=1 repeats (WATCHDOG_USEC=1 s: {len(watchdogs)} in {time.monotonic() - start:.1f} s)")

    # 2. mesh-record ctl against that host (run by root, as `sudo mesh-record ctl …`; the host runs as peermesh).
    status = run(["mesh-record", "ctl", "status", "--runtime-dir", "/run/peermesh"])
    if not check(status.returncode == 0 and "pkg-host" in status.stdout, "ctl status answers: " + status.stdout.split("\n")[0]):
        # Say why: what ctl said, and the host's last lines (and whether it still runs).
        print(f"        ctl: rc {status.returncode}: {status.stderr.strip()[-300:]}")
        state = "running" if host.p.poll() is None else f"exited {host.p.returncode}"
        print(f"        host ({state}): " + " | ".join(host.err[-8:])[-900:], flush=True)
    pair = run(["mesh-record", "ctl", "pair", "--runtime-dir", "/run/peermesh"])
    code = re.search(r"pairing code: (\S+)", pair.stdout)
    check(pair.returncode == 0 and code is not None, "ctl pair opens a window and prints the code")
    player_state = os.path.join(work, "player")
    if code:
        p = run(["mesh-play", "--pair", code.group(1), "--service", service, "--state-dir", player_state,
                 "--name", "pkg-player"], timeout=30)
        check(p.returncode == 0 and "paired with pkg-host" in p.stderr, "a player pairs through it: " + p.stderr.strip()[-80:])
    paired = run(["mesh-record", "ctl", "paired", "--runtime-dir", "/run/peermesh"])
    check(paired.returncode == 0 and "pkg-player" in paired.stdout, "ctl paired lists the player")
    player = Child(["mesh-play", "--find", "--service", service, "--state-dir", player_state,
                    "--output", os.path.join(work, "p.wav")])
    joined = player.when("joined pkg-host", 15)
    check(joined is not None, "the paired player joins the service's host")
    t0 = time.monotonic()
    forget = run(["mesh-record", "ctl", "forget", "pkg-player", "--runtime-dir", "/run/peermesh"])
    gone = player.when("went away", 5)
    check(forget.returncode == 0 and gone is not None and gone - t0 < 1.5,
          f"ctl forget disconnects the player ({'%.0f ms' % ((gone - t0) * 1000) if gone else 'not disconnected'})")
    other = run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "mesh-record", "ctl", "status",
                 "--runtime-dir", "/run/peermesh"])
    check(other.returncode == 1 and ("Permission denied" in other.stderr or "not allowed" in other.stdout),
          "another user (uid 65534) cannot use the control socket: " + (other.stderr or other.stdout).strip()[-90:])
    st = os.stat("/run/peermesh/mesh-record.sock") if os.path.exists("/run/peermesh/mesh-record.sock") else None
    check(st is not None and st.st_mode & 0o777 == 0o600, f"the socket is mode {oct(st.st_mode & 0o777) if st else 'missing'}")
    player.stop()
    host.stop()
    nohost = run(["mesh-record", "ctl", "status", "--runtime-dir", "/run/peermesh"])
    check(nohost.returncode == 1 and "no mesh-record --host is running" in nohost.stderr,
          "with no host running, ctl says so and exits 1")

    # 3. mesh-play@.service's ExecStart also speaks the notify protocol (as its unit's user, writing where it may).
    unit = "/lib/systemd/system/mesh-play@.service"
    line, _ = exec_start(unit, instance="pkg-host")
    out_dir = os.path.join(work, "svc")
    os.mkdir(out_dir, 0o700)
    os.chown(out_dir, pw.pw_uid, pw.pw_gid)
    cmd = line.replace("$MESH_PLAY_OPTS", f"--service {service} --output {os.path.join(out_dir, 'svc.wav')} --duration 2")
    argv, _ = as_unit_user(unit, shlex.split(cmd), MADE)
    svc = Child(argv, env=child_env)
    got = []
    end = time.monotonic() + 4
    while time.monotonic() < end and not any("READY=1" in m for m in got):
        try:
            got.append(sock.recv(4096).decode())
        except socket.timeout:
            pass
    check(any("READY=1" in m for m in got), "mesh-play@.service's command sends READY=1")
    svc.stop()
    sock.close()
    print(f"package_test: {'FAILED: ' + '; '.join(FAILURES) if FAILURES else 'passed'}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
