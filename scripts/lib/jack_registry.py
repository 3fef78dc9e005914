#!/usr/bin/env python3
"""jack_registry.py — list JACK's server registry, or reclaim the entries of servers that no longer exist.

jackd (jack2) records every running server in the machine-wide POSIX shm segment /dev/shm/jack-shm-registry, in a
table of 8 slots (MAX_SERVERS). A server that ends without unregistering — killed with SIGKILL, crashed, or ended
while its clients hung — keeps its slot. jackd reclaims a dead server's slot only when a server of the *same name*
starts again, and the rigs name their servers after their shell's PID (`pmtest$$`, `pmsoak$$`), so after eight such
ends no jackd can start on the machine: it prints "Too many servers already active".

`reclaim` applies jackd's own rule to every slot instead of only to the same name: a slot whose PID no longer exists
(kill(pid, 0) fails with ESRCH) is cleared. It holds the registry's own lock (the SysV semaphore with key 0x282929,
taken with SEM_UNDO, as jackd takes it) while it looks and writes. Slots of live servers are never touched.
A server in another PID namespace that shares this /dev/shm would look gone from here; clearing its slot does not
stop or disturb it (clients reach a server by its socket, not by the slot), it only lets a server of the same name
register, and the rigs' names carry their own PIDs.

usage: jack_registry.py list | reclaim
"""
import ctypes
import mmap
import os
import struct
import sys

REGISTRY = "/dev/shm/jack-shm-registry"
SEMAPHORE_KEY = 0x282929
MAGIC = 0x4A41434B  # "JACK"
MAX_SERVERS = 8
HEADER = struct.Struct("<IIiIII")  # magic, protocol, type, size, hdr_len, entry_len
NAME_BYTES = 257  # JACK_SERVER_NAME_SIZE + 1
SLOT = (4 + NAME_BYTES + 3) // 4 * 4  # pid_t pid; char name[257]; padded to 4
SEM_UNDO = 0x1000


class SemBuf(ctypes.Structure):
    _fields_ = [("sem_num", ctypes.c_ushort), ("sem_op", ctypes.c_short), ("sem_flg", ctypes.c_short)]


class RegistryLock:
    """jackd's registry lock: one SysV semaphore, taken with SEM_UNDO so a crash here cannot leave it held."""

    def __init__(self):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.semid = self.libc.semget(SEMAPHORE_KEY, 0, 0)

    def _op(self, delta):
        if self.semid < 0:
            return  # no jackd has ever run since boot: nobody else can be writing
        op = SemBuf(0, delta, SEM_UNDO)
        while self.libc.semop(self.semid, ctypes.byref(op), 1) != 0:
            err = ctypes.get_errno()
            if err != 4:  # EINTR
                raise OSError(err, "semop on JACK's registry lock: " + os.strerror(err))

    def __enter__(self):
        self._op(-1)
        return self

    def __exit__(self, *_):
        self._op(1)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def slots(view):
    for i in range(MAX_SERVERS):
        off = HEADER.size + i * SLOT
        pid, = struct.unpack_from("<i", view, off)
        name = bytes(view[off + 4:off + 4 + NAME_BYTES]).split(b"\0")[0].decode(errors="replace")
        yield i, off, pid, name


def main(argv):
    if len(argv) != 2 or argv[1] not in ("list", "reclaim"):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    if not os.path.exists(REGISTRY):
        return 0  # no registry yet: jackd creates it
    with open(REGISTRY, "r+b") as f, RegistryLock():
        view = mmap.mmap(f.fileno(), 0)
        magic, _, _, _, hdr_len, _ = HEADER.unpack_from(view, 0)
        if magic != MAGIC or hdr_len != HEADER.size + MAX_SERVERS * SLOT:
            print("jack-registry: %s has a layout this tool does not know; left alone" % REGISTRY, file=sys.stderr)
            return 1
        freed = []
        for i, off, pid, name in slots(view):
            if pid == 0:
                continue
            live = alive(pid)
            if argv[1] == "list":
                print("%d %d %s %s" % (i, pid, "alive" if live else "gone", name))
            elif not live:
                view[off:off + SLOT] = bytes(SLOT)
                freed.append("%s (PID %d)" % (name, pid))
        view.flush()
        view.close()
    if freed:
        print("jack-registry: reclaimed %d slot(s) of servers that no longer exist: %s" % (len(freed), ", ".join(freed)),
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
