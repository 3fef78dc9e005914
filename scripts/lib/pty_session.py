#!/usr/bin/env python3
"""Runs a command on a pseudo-terminal, as a person at a terminal would see it, and reports the screen.

    pty_session.py REPORT.json --wait-for TEXT [--hold SECONDS] [--answer TEXT] [--after SECONDS] -- CMD ARGS...

Starts CMD on a new pty (80x24). When TEXT first appears in its output, waits --hold seconds (default 3) and
records the screen then; types --answer (plus a newline) if given; reads for --after seconds more (default 2);
sends SIGINT to the command's process group (its own, by PID) and reads to its end. The report holds:
  seen_at, screen_at_hold (list of lines), screen_end, raw (the whole output, latin-1), status, timed_out.
The screen model knows what our CLIs write: text, \\r, \\n, ESC[2K / ESC[K (erase line), ESC[nA (cursor up).
The test suite uses it for `mesh-record --accept ask`.
"""
import json
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import fcntl
import time


class Screen:
    """A tiny terminal: enough to tell what stays visible."""

    def __init__(self):
        self.lines = [""]
        self.col = 0

    def feed(self, text):
        i = 0
        while i < len(text):
            c = text[i]
            if c == "\x1b":
                m = re.match(r"\x1b\[(\d*)([A-Za-z])", text[i:])
                if m:
                    n = int(m.group(1) or "0")
                    op = m.group(2)
                    if op == "K" or (op == "J" and n == 0):
                        self.lines[-1] = self.lines[-1][: self.col] if n == 0 else ""
                        if n == 2:
                            self.col = 0
                    elif op == "A":
                        # Cursor up: keep the model simple, drop the lines below.
                        for _ in range(max(n, 1)):
                            if len(self.lines) > 1:
                                self.lines.pop()
                        self.col = min(self.col, len(self.lines[-1]))
                    i += len(m.group(0))
                    continue
                i += 1
                continue
            if c == "\r":
                self.col = 0
            elif c == "\n":
                self.lines.append("")
                self.col = 0
            else:
                line = self.lines[-1]
                line = line[: self.col] + c + line[self.col + 1:]
                self.lines[-1] = line
                self.col += 1
            i += 1

    def visible(self, rows=24):
        return self.lines[-rows:]


def main():
    args = sys.argv[1:]
    if "--" not in args or len(args) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    split = args.index("--")
    opts, cmd = args[:split], args[split + 1:]
    report_path = opts[0]
    wait_for, hold, answer, after = None, 3.0, None, 2.0
    k = 1
    while k < len(opts):
        if opts[k] == "--wait-for":
            wait_for = opts[k + 1]
        elif opts[k] == "--hold":
            hold = float(opts[k + 1])
        elif opts[k] == "--answer":
            answer = opts[k + 1]
        elif opts[k] == "--after":
            after = float(opts[k + 1])
        else:
            print(f"unknown option {opts[k]}", file=sys.stderr)
            return 2
        k += 2
    if wait_for is None:
        print("--wait-for is required", file=sys.stderr)
        return 2

    pid, fd = pty.fork()
    if pid == 0:
        os.execvp(cmd[0], cmd)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    screen = Screen()
    raw = bytearray()
    start = time.monotonic()
    seen_at = None
    screen_at_hold = None
    answered = False
    deadline = start + 30
    stop_at = None

    def read_some(timeout):
        r, _, _ = select.select([fd], [], [], timeout)
        if not r:
            return True
        try:
            data = os.read(fd, 4096)
        except OSError:
            return False
        if not data:
            return False
        raw.extend(data)
        screen.feed(data.decode("latin-1"))
        return True

    alive = True
    while alive:
        now = time.monotonic()
        if seen_at is None and wait_for.encode() in raw:
            seen_at = now
        if seen_at is not None and screen_at_hold is None and now >= seen_at + hold:
            screen_at_hold = list(screen.visible())
            if answer is not None:
                os.write(fd, (answer + "\n").encode())
            answered = True
            stop_at = now + after
        if stop_at is not None and now >= stop_at:
            break
        if now >= deadline:
            break
        alive = read_some(0.05)

    timed_out = seen_at is None
    try:
        os.killpg(pid, signal.SIGINT)
    except ProcessLookupError:
        pass
    end = time.monotonic() + 5
    while time.monotonic() < end and read_some(0.1):
        pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _, status = os.waitpid(pid, 0)
    report = {
        "seen_at": None if seen_at is None else seen_at - start,
        "screen_at_hold": screen_at_hold,
        "screen_end": screen.visible(),
        "raw": raw.decode("latin-1"),
        "answered": answered,
        "status": os.waitstatus_to_exitcode(status),
        "timed_out": timed_out,
    }
    with open(report_path, "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
