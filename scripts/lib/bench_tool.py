#!/usr/bin/env python3
"""Helpers for scripts/bench: process snapshots, jack_iodelay parsing, join-time measurement, the report.

  bench_tool.py snap PGID...                 JSON: per process group, utime+stime seconds and summed peak RSS
                                             (VmHWM) of its processes, shell wrappers (bash/sh/setsid) left out
  bench_tool.py iodelay LOG SKIP_LINES       JSON: median/min/max of jack_iodelay readings after SKIP_LINES lines
  bench_tool.py freeport [N]                 N (default 1) distinct free TCP+UDP port numbers on 127.0.0.1
  bench_tool.py measured RAW PATH            exit 0 if a latency row of PATH in RAW has a measured figure, else 1
  bench_tool.py join RUNS SERVICE MESH_PLAY STATE_DIR  join time: see join() below
  bench_tool.py report RAW.jsonl OUT.json TABLE.md META.json   merge results, write JSON and the Markdown table
  bench_tool.py smoke RAW.jsonl SECTIONS     --smoke's verdict (exit 1 with the reasons): see smoke() below
"""
import json
import os
import select
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time

WRAPPERS = {"bash", "sh", "setsid", "dash", "timeout"}
HZ = os.sysconf("SC_CLK_TCK")


def proc_snapshot(pgids):
    """utime+stime, VmHWM and context switches (every thread's, voluntary + involuntary) of every live process in
    each process group."""
    out = {str(g): {"cpuSeconds": 0.0, "peakRssKiB": 0, "peakRssExShmKiB": 0, "contextSwitches": 0, "processes": []}
           for g in pgids}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            pgrp = fields[2]
            if pgrp not in out or comm in WRAPPERS:
                continue
            cpu = (int(fields[11]) + int(fields[12])) / HZ
            hwm = shm = 0
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        hwm = int(line.split()[1])
                    elif line.startswith("RssShmem:"):
                        shm = int(line.split()[1])
            switches = 0
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    with open(f"/proc/{pid}/task/{tid}/status") as f:
                        for line in f:
                            if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                                switches += int(line.split()[1])
                except OSError:
                    continue  # the thread ended between the listing and the read
            o = out[pgrp]
            o["contextSwitches"] += switches
            o["cpuSeconds"] += cpu
            o["peakRssKiB"] += hwm
            o["peakRssExShmKiB"] += hwm - shm
            o["processes"].append({"pid": int(pid), "comm": comm, "cpuSeconds": cpu, "peakRssKiB": hwm,
                                   "rssShmemKiB": shm, "contextSwitches": switches})
        except (OSError, ValueError, IndexError):
            continue
    return out


def iodelay(log, skip):
    """Readings look like '   768.000 frames     17.415 ms total roundtrip latency'."""
    frames, ms, below, bad = [], [], 0, 0
    try:
        with open(log, errors="replace") as f:
            lines = f.read().splitlines()[skip:]
    except OSError:
        lines = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 4 and parts[1] == "frames" and parts[3] == "ms" and "roundtrip" in line:
            try:
                f, m = float(parts[0]), float(parts[2])
            except ValueError:
                continue
            if f == f and m == m and f > 0:  # drop nan and the 0.000 jack_iodelay prints while it locks on
                frames.append(f)
                ms.append(m)
            else:
                bad += 1
        elif "below threshold" in line:
            below += 1
    if not frames:
        return {"readings": 0, "belowThreshold": below, "invalidReadings": bad}
    return {"readings": len(frames), "belowThreshold": below, "invalidReadings": bad,
            "frames": statistics.median(frames), "ms": statistics.median(ms),
            "minFrames": min(frames), "maxFrames": max(frames)}


def freeport(count=1):
    """`count` distinct port numbers free for TCP and UDP on 127.0.0.1. Every socket stays bound until all are
    chosen: two ports taken one after the other could be the same one (the kernel may hand a port out again once it
    is closed), and a host and its proxy on one port measure nothing."""
    held, ports = [], []
    try:
        for _ in range(50 * count):
            if len(ports) == count:
                break
            t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            held += [t, u]
            try:
                t.bind(("127.0.0.1", 0))
                port = t.getsockname()[1]
                u.bind(("127.0.0.1", port))
                ports.append(port)
            except OSError:
                continue
    finally:
        for s in held:
            s.close()
    if len(ports) < count:
        raise SystemExit("no free port")
    return ports


def join(runs, service, mesh_play, state_dir, rate=44100, timeout=10.0):
    """Join time, measured from outside the player: `arecord -D pm_loop_cap` captures what `mesh-play --find
    --device pm_loop_play` plays (a sample-exact JACK client-to-client connection); the host sends a tone. Time
    from spawning mesh-play to the first non-zero sample captured, corrected to that sample's position in the
    read. Includes the capture side's one period (2.9 ms at 128) of buffering: an overestimate by at most that."""
    results = []
    for run in range(runs):
        rec = subprocess.Popen(["arecord", "-q", "-D", "pm_loop_cap", "-f", "FLOAT_LE", "-r", str(rate), "-c", "1",
                                "-t", "raw", "--period-size=128", "--buffer-size=512"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        fd = rec.stdout.fileno()
        # Let the capture run steadily (silence) before the player starts.
        warm_until = time.monotonic() + 0.5
        while time.monotonic() < warm_until:
            r, _, _ = select.select([fd], [], [], 0.05)
            if r:
                os.read(fd, 65536)
        t0 = time.monotonic()
        play = subprocess.Popen([mesh_play, "--find", "--service", service, "--device", "pm_loop_play", "--json",
                                 "--name", f"bench-join-{run}", "--state-dir", state_dir],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        first = None
        pending = b""
        deadline = t0 + timeout
        while first is None and time.monotonic() < deadline:
            r, _, _ = select.select([fd], [], [], 0.05)
            if not r:
                continue
            data = os.read(fd, 65536)
            now = time.monotonic()
            if not data:
                break
            data = pending + data
            usable = len(data) - len(data) % 4
            pending = data[usable:]
            samples = struct.unpack(f"<{usable // 4}f", data[:usable])
            for k, v in enumerate(samples):
                if abs(v) > 1e-6:
                    after = len(samples) - k
                    first = now - t0 - after / rate
                    break
        time.sleep(1.2)  # let the player emit a JSON status line (once a second)
        for p in (play, rec):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            out, err = play.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(play.pid, signal.SIGKILL)
            out, err = play.communicate()
        try:
            rec.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(rec.pid, signal.SIGKILL)
            rec.communicate()
        internal = None
        for line in out.decode(errors="replace").splitlines():
            try:
                o = json.loads(line)
            except ValueError:
                continue
            if o.get("firstAudioMs") is not None:
                internal = o["firstAudioMs"] / 1000
        results.append({"run": run, "firstSampleSeconds": first, "firstAudioSecondsReported": internal,
                        "stderrTail": err.decode(errors="replace").splitlines()[-3:]})
        time.sleep(0.3)
    good = [r["firstSampleSeconds"] for r in results if r["firstSampleSeconds"] is not None]
    reported = [r["firstAudioSecondsReported"] for r in results if r["firstAudioSecondsReported"] is not None]
    return {"runs": runs, "measured": len(good), "medianMs": statistics.median(good) * 1000 if good else None,
            "minMs": min(good) * 1000 if good else None, "maxMs": max(good) * 1000 if good else None,
            "firstRunMs": results[0]["firstSampleSeconds"] * 1000 if results and results[0]["firstSampleSeconds"] is not None else None,
            "reportedFirstAudioMedianMs": statistics.median(reported) * 1000 if reported else None,
            "details": results}


# ---------------------------------------------------------------------------------------------------- report


def fmt(v, digits=1):
    if v is None:
        return "n/m"
    if isinstance(v, str):
        return v
    return f"{v:,.{digits}f}"


def verdict(ok):
    return "n/m" if ok is None else ("met" if ok else "**missed**")


def at_most(v, bound):
    """A goal's outcome for a figure that must not exceed `bound`: None (not measured) when the figure is missing."""
    return None if v is None else v <= bound


def at_least(v, bound):
    """A goal's outcome for a figure that must reach `bound`: None (not measured) when the figure is missing."""
    return None if v is None else v >= bound


class Table:
    """One report section: its title, a blank line and a Markdown table header whose columns are aligned as `align`
    says (one letter a column: l or r), then `row`s. A row must have a cell for every column."""

    def __init__(self, md, title, columns, align):
        assert len(columns) == len(align)
        self.md, self.width = md, len(columns)
        md.append(title)
        md.append("")
        md.append("| " + " | ".join(columns) + " |")
        md.append("|" + "|".join("---:" if a == "r" else "---" for a in align) + "|")

    def row(self, *cells):
        assert len(cells) == self.width, f"{len(cells)} cells for {self.width} columns: {cells}"
        self.md.append("| " + " | ".join(str(c) for c in cells) + " |")


def latency_section(lat, md, goals):
    """1. Mouth-to-ear latency of each path against the floor (JACK with nothing in between), and its goals."""
    # A path may have several runs (scripts/bench repeats the floor, the defaults and --latency low): each run's
    # ratio is against the floor measured just before it, and the table gives the median and the worst.
    runs_of, order = {}, []
    for r in lat:
        key = (r["period"], r["path"])
        if key not in runs_of:
            order.append(key)
        runs_of.setdefault(key, []).append(r)
    floor_of = {(r["period"], r.get("run", 1)): r.get("frames") for r in lat if r["path"] == "floor"}
    def ratios(key):
        return [r["frames"] / floor_of[(key[0], r.get("run", 1))] for r in runs_of[key]
                if r.get("frames") and floor_of.get((key[0], r.get("run", 1)))]
    def median_of(key, field):
        v = [r[field] for r in runs_of[key] if r.get(field) is not None]
        return statistics.median(v) if v else None
    t = Table(md, "**1. Mouth-to-ear latency** (jack_iodelay round trip through the sender's capture PCM and the "
              "receiver's playback PCM; median of readings; a path measured in several runs shows the median "
              "run, each run against the floor measured just before it)",
              ['period', 'path', 'runs', 'frames', 'ms', 'vs floor (median)', 'vs floor (worst run)', 'note'], "llrrrrrl")
    for key in order:
        first = runs_of[key][0]
        rs = ratios(key)
        frames, ms = median_of(key, "frames"), median_of(key, "ms")
        note = first.get("note", "")
        if len(runs_of[key]) == 1 and first.get("frames") and first.get("minFrames") is not None \
                and first["maxFrames"] - first["minFrames"] > 1:
            note = (note + "; " if note else "") + f"range {first['minFrames']:.0f}–{first['maxFrames']:.0f}"
        if len(runs_of[key]) > 1:
            fr = [r["frames"] for r in runs_of[key] if r.get("frames")]
            if fr:
                note = (note + "; " if note else "") + f"runs {min(fr):.0f}–{max(fr):.0f} frames"
        worst = f"{max(rs):.2f}×" if rs and len(runs_of[key]) > 1 else ""
        t.row(key[0], first['label'], len(runs_of[key]), fmt(frames, 0), fmt(ms),
              f"{statistics.median(rs):.2f}×" if rs else "n/m", worst, note)
    md.append("")
    for key in order:
        period, path = key
        rs = ratios(key)
        if path == "mesh-default" and period == 128:
            ms = median_of(key, "ms")
            goals.append(("mesh defaults ≤ 12 ms at period 128", fmt(ms) + " ms", at_most(ms, 12.0)))
        for p, bound, what in (("mesh-default", 1.15, "defaults"), ("mesh-low", 1.05, "--latency low")):
            if path == p:
                shown = (f"{statistics.median(rs):.2f}× median, {max(rs):.2f}× worst of {len(rs)}" if rs else "n/m")
                goals.append((f"{what} ≤ {bound:.2f}× the floor at period {period} (median run)", shown,
                              at_most(statistics.median(rs) if rs else None, bound)))


def wire_format_section(lat, md, goals):
    """1c. Wire formats: each codec's run against the f32 default of the same run (run 1, measured just before it)."""
    codec_rows = [r for r in lat if r["path"] in ("mesh-default", "mesh-s16", "mesh-opus") and r.get("run", 1) == 1]
    if any(r["path"] != "mesh-default" for r in codec_rows):
        t = Table(md, "**1c. Wire formats** (`mesh-record --codec`, defaults otherwise; run 1 of each period, the codecs "
                  "right after the f32 default they are compared with; audio = the relay's packets with their 36-byte "
                  "header; wire adds PeerMesh's 20-byte datagram header, the 16-byte AEAD tag and 28 bytes of UDP/IPv4)",
                  ['period', 'codec', 'packets/s', 'audio kbit/s', 'wire kbit/s', 'latency frames', 'added vs f32 (frames)', 'note'],
                  "llrrrrrl")
        base = {r["period"]: r.get("frames") for r in codec_rows if r["path"] == "mesh-default"}
        for r in codec_rows:
            added = ""
            if r["path"] != "mesh-default" and r.get("frames") and base.get(r["period"]):
                added = f"{r['frames'] - base[r['period']]:+.0f}"
            name = r.get("codec") or {"mesh-default": "f32", "mesh-s16": "s16", "mesh-opus": "opus"}[r["path"]]
            t.row(r['period'], name, fmt(r.get('packetsPerSecond'), 0), fmt(r.get('audioKbps'), 0),
                  fmt(r.get('wireKbps'), 0), fmt(r.get('frames'), 0), added, r.get('note', ''))
            if r["path"] == "mesh-opus" and r.get("audioKbps") is not None:
                opus_bits = (r["audioKbps"] * 1000 - r["packetsPerSecond"] * 36 * 8) / 1000
                goals.append((f"Opus ≤ 100 kbit/s at the default bitrate (period {r['period']}; codec bits, without headers)",
                              f"{opus_bits:.0f} kbit/s", opus_bits <= 100))
        md.append("")


def throughput_section(th, md, goals):
    """2. Datagram throughput of an encrypted Session against raw UDP sockets."""
    run = th[-1]
    t = Table(md, "**2. Datagram throughput** (1 KB payloads, loopback, one sender + one receiver thread, "
              "alternating rounds in one process; median round)",
              ['pair', 'sent/s', 'received/s', 'ratio'], "lrrr")
    if run.get("error"):
        t.row("n/m", "", "", run["error"])
        goals.append(("encrypted throughput ratio ≥ 0.7", "n/m", None))
    else:
        for label, key, ratio in (("raw UDP (Swift)", "raw", "1.00"),
                                  ("PeerMesh Session, encrypted (default)", "mesh", f"{run['ratio']:.2f}"),
                                  ("PeerMesh Session, `.none` (insecure, reference)", "meshPlaintext",
                                   f"{run['plaintextRatio']:.2f}" if run.get("meshPlaintext") else "")):
            if run.get(key):
                t.row(label, fmt(run[key]["sentPerSecond"], 0), fmt(run[key]["receivedPerSecond"], 0), ratio)
        goals.append(("encrypted throughput ratio ≥ 0.7", f"{run['ratio']:.2f}", run["ratio"] >= 0.7))
    md.append("")


def cpu_section(cpu, md, goals):
    """3. CPU and memory of mesh-record and mesh-play against the arecord/nc/aplay and minimal C baselines."""
    t = Table(md, "**3. CPU and memory per stream** (same minute, all four running at once; CPU over the steady "
              "window scaled to one minute of audio; peak RSS = VmHWM summed over the side's processes; mesh-record and "
              "mesh-play as `scripts/package` ships them, with the Swift runtime linked statically)",
              ['side', 'processes', 'CPU s / min audio', '% of a core', 'vs baseline CPU', 'context switches / s',
              'peak RSS MB', 'peak RSS excl. JACK shm MB'], "llrrrrrr")
    by = {r["side"]: r for r in cpu}
    mb = lambda v: None if v is None else v / 1024
    for side, base in (("mesh-record", "arecord | nc -u"), ("mesh-play", "nc -l | aplay"),
                       ("arecord | nc -u", None), ("nc -l | aplay", None),
                       ("minimal C send", "arecord | nc -u"), ("minimal C recv", "nc -l | aplay")):
        r = by.get(side)
        if not r:
            continue
        ratio = "n/m"
        if base and r.get("cpuPerMinute") is not None and by.get(base, {}).get("cpuPerMinute"):
            ratio = f"{r['cpuPerMinute'] / by[base]['cpuPerMinute']:.2f}×"
        t.row(side.replace("|", "\\|"), r.get("processes", r.get("note", "")), fmt(r.get("cpuPerMinute"), 2),
              fmt(r.get("percentCore"), 2), ratio, fmt(r.get("contextSwitchesPerSecond"), 0),
              fmt(mb(r.get("peakRssKiB"))), fmt(mb(r.get("peakRssExShmKiB"))))
    md.append("")
    md.append("Every ALSA client of the JACK rig maps JACK's shared memory (~100 MB, RssShmem), baselines included; "
              "the last column (VmHWM − RssShmem) is what the process itself holds, and is what the 16 MB goal is judged on. "
              "`minimal C send`/`recv` (scripts/lib/minimal_relay.c) is the physical baseline: one process per side that "
              "wakes once per period (`snd_pcm_readi` + `sendto`; `poll` + `recvfrom` + `snd_pcm_writei`) and does nothing else.")
    md.append("")
    for side, base in (("mesh-record", "arecord | nc -u"), ("mesh-play", "nc -l | aplay")):
        r = by.get(side)
        if r:
            goals.append((f"{side} ≤ 1 % of a core", fmt(r.get("percentCore"), 2) + " %",
                          at_most(r.get("percentCore"), 1.0)))
            b = by.get(base, {}).get("cpuPerMinute")
            if r.get("cpuPerMinute") is not None and b:
                goals.append((f"{side} CPU ≤ 0.8× `{base}`", f"{r['cpuPerMinute'] / b:.2f}×", r["cpuPerMinute"] / b <= 0.8))
            v = mb(r.get("peakRssExShmKiB"))
            goals.append((f"{side} ≤ 16 MB RSS (excl. JACK shm)", fmt(v) + " MB", at_most(v, 16.0)))


def join_section(jn, md, goals):
    """4. Join time, from spawning mesh-play to its first audible sample."""
    j = jn[-1]
    t = Table(md, "**4. Join time** (spawn `mesh-play --find` → first non-zero sample captured from its playback "
              "device; Avahi on lo)",
              ['runs', 'median ms', 'min ms', 'max ms', 'first run ms', "player's own firstAudioMs (median)"], "rrrrrr")
    t.row(f"{j.get('measured', 0)}/{j.get('runs', 0)}", fmt(j.get("medianMs"), 0), fmt(j.get("minMs"), 0),
          fmt(j.get("maxMs"), 0), fmt(j.get("firstRunMs"), 0), fmt(j.get("reportedFirstAudioMedianMs"), 0) + " ms")
    if j.get("note"):
        md.append(f"\n{j['note']}")
    md.append("")
    goals.append(("join with the handshake ≤ 150 ms (median)", fmt(j.get("medianMs"), 0) + " ms",
                  at_most(j.get("medianMs"), 150)))


def fanout_section(fo, md, goals):
    """5. Fan-out: one host serving N players."""
    t = Table(md, "**5. Fan-out** (one `mesh-record --host --input tone:440`; N players as RelayPlayer objects in one "
              "`mesh-bench fanout` process, each with its own Session and a paced null sink)",
              ['players', 'joined', 'host % core', 'host % core per player', 'loss % (all)', 'worst player loss %', 'late', 'note'], "rrrrrrrl")
    for r in fo:
        t.row(r["players"], r.get("joined", "n/m"), fmt(r.get("hostPercentCore"), 2),
              fmt(r.get("hostPercentCorePerPlayer"), 3), fmt(r.get("lossPercent"), 3),
              fmt(r.get("worstPlayerLossPercent"), 3), r.get("late", "n/m"), r.get("note", ""))
    md.append("")
    for r in fo:
        if r["players"] == 32:
            goals.append(("32 players ≤ 0.1 % loss (worst player)", fmt(r.get("worstPlayerLossPercent"), 3) + " %",
                          at_most(r.get("worstPlayerLossPercent"), 0.1)))


def crypto_section(cr, md, goals):
    """5b. What encryption costs the host: the same players encrypted and in plaintext, alternating rounds."""
    t = Table(md, "**5b. What encryption costs the host** (`mesh-bench serve`: one RelayHost with a 440 Hz tone; "
              "the same N players encrypted, then plaintext, alternating rounds; host CPU over the same window)",
              ['round', 'players', 'encrypted: host % core', 'plaintext: host % core', 'worst loss % (enc / plain)'], "rrrrl")
    rounds = sorted({r["round"] for r in cr})
    enc_all, plain_all = [], []
    for n in rounds:
        e = next((r for r in cr if r["round"] == n and r.get("encrypted")), None)
        p = next((r for r in cr if r["round"] == n and not r.get("encrypted")), None)
        if e and e.get("hostPercentCore") is not None: enc_all.append(e["hostPercentCore"])
        if p and p.get("hostPercentCore") is not None: plain_all.append(p["hostPercentCore"])
        e, p = e or {}, p or {}
        t.row(n, (e or p).get("players", "n/m"), fmt(e.get("hostPercentCore"), 2), fmt(p.get("hostPercentCore"), 2),
              f"{fmt(e.get('worstPlayerLossPercent'), 3)} / {fmt(p.get('worstPlayerLossPercent'), 3)}")
    ratio = statistics.median(enc_all) / statistics.median(plain_all) if enc_all and plain_all and statistics.median(plain_all) > 0 else None
    md.append("")
    md.append(f"Median encrypted / median plaintext: {fmt(ratio, 2)}×.")
    md.append("")
    players = cr[0].get("players")
    goals.append((f"host CPU, {players} encrypted vs plaintext players ≤ 1.3×", fmt(ratio, 2) + "×",
                  None if players != 32 else at_most(ratio, 1.3)))


def impair_section(im, md, goals):
    """6. Latency and concealment under loss, jitter and reordering (mesh-impair)."""
    t = Table(md, "**6. Under impairment** (`mesh-impair`, both directions; mesh-play defaults; no goal yet)",
              ['impairment', 'latency frames', 'latency ms', 'concealed %', 'underruns', 'loss % (player)', 'note'], "lrrrrrl")
    for r in im:
        t.row(r["label"], fmt(r.get("frames"), 0), fmt(r.get("ms")), fmt(r.get("concealedPercent"), 2),
              r.get("underruns", "n/m"), fmt(r.get("lossPercent"), 2), r.get("note", ""))
    md.append("")


def resource_section(rs, md, goals):
    """7. Resource transfer against nc over TCP."""
    r = rs[-1]
    t = Table(md, f"**7. Resource transfer** (a {fmt(r.get('megabytes'), 0)} MB file of random bytes between two processes "
              f"on 127.0.0.1; PeerMesh `Session.sendResource`, encrypted (the default), timed from the call to its "
              f"completion — the receiver has written the file and checked its SHA-256; the handshake is before the "
              f"clock; baseline `nc -N` → `nc -l` (openbsd) into a file in the same directory, timed from starting the "
              f"sending nc until the receiving one exits; each of {r.get('repeats')} repeats starts both sides afresh, "
              f"alternating which goes first; MB = 10⁶ bytes)",
              ['transfer', 'MB/s (median)', 'MB/s (best)', 'ratio (median)'], "lrrr")
    def row(label, side, ratio):
        v = r.get(side) or {}
        shown = "1.00" if side == "nc" and v else (f"{ratio:.2f}" if ratio is not None else "n/m")
        t.row(label, fmt(v.get("medianMBPerSecond"), 0), fmt(v.get("bestMBPerSecond"), 0), shown)
    row("nc over TCP (baseline)", "nc", None)
    row("PeerMesh sendResource, encrypted: first transfer of a fresh session", "meshFirst", r.get("ratio"))
    row("PeerMesh sendResource, encrypted: second transfer, same session", "meshSecond", r.get("secondRatio"))
    if r.get("note"):
        md.append(f"\n{r['note']}")
    md.append("")
    goals.append(("resource transfer ≥ 0.5× nc over TCP (first transfer, median)", fmt(r.get("ratio"), 2),
                  at_least(r.get("ratio"), 0.5)))


def meshjoin_section(mj, md, goals):
    """8. Mesh join time: N full-mesh members, one at a time and all at once."""
    t = Table(md, "**8. Mesh join time** (N encrypted full-mesh sessions in one `mesh-bench meshjoin` process — one I/O "
              "thread for all — member i on 127.0.0.(i+1); members connect to the first's advertiser directly, no "
              "DNS-SD; time from the first connect until every member's `connectedPeers` lists all N-1 others. "
              "Absolute times: there is no baseline to compare with)",
              ['members', 'joining', 'runs', 'median ms', 'min ms', 'max ms', 'note'], "rlrrrrl")
    for r in mj:
        if r.get("oneAtATime") is None:
            t.row(r.get("members"), "", "", "n/m", "", "", r.get("note", ""))
            continue
        for key, how in (("oneAtATime", "one at a time"), ("allAtOnce", "all at once")):
            v = r[key]
            note = ""
            if key == "oneAtATime" and v.get("lastJoinMedianMs") is not None:
                note = f"the last member's join (into a mesh of {r['members'] - 1}): {fmt(v['lastJoinMedianMs'])} ms median"
            t.row(r["members"], how, r.get("runs"), fmt(v.get("medianMs")), fmt(v.get("minMs")),
                  fmt(v.get("maxMs")), note)
    md.append("")


# Each report section: the kind of raw row it is drawn from, and the function that writes its table and goals.
SECTIONS = (
    ("latency", latency_section),
    ("latency", wire_format_section),
    ("throughput", throughput_section),
    ("cpu", cpu_section),
    ("join", join_section),
    ("fanout", fanout_section),
    ("crypto", crypto_section),
    ("impair", impair_section),
    ("resource", resource_section),
    ("meshjoin", meshjoin_section),
)


def read_rows(raw_path):
    """The raw results: one JSON object a line (a line that is not JSON — a half-written one — is skipped)."""
    rows = []
    with open(raw_path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass
    return rows


def report(raw_path, out_json, out_md, meta_path):
    with open(meta_path) as f:
        meta = json.load(f)
    rows = read_rows(raw_path)
    sections = {}
    for r in rows:
        sections.setdefault(r["section"], []).append(r)
    goals = []
    md = []
    md.append(f"Measured {meta['date']} on {meta['machine']} ({meta['cores']} cores), `scripts/bench{meta['flags']}`; "
              f"JACK dummy 44.1 kHz. \"n/m\" = not measured here (the note says why).")
    md.append("")

    # The sections, in the order SECTIONS gives; each writes its table and appends its goals.
    for name, write in SECTIONS:
        if sections.get(name):
            write(sections[name], md, goals)

    if goals:
        t = Table(md, "**Goals**", ["goal", "figure", "verdict"], "lrl")
        for g, fig, ok in goals:
            t.row(g, fig, verdict(ok))
        md.append("")
    notes = [r for r in rows if r["section"] == "note"]
    if notes:
        md.append("**Not measured / notes**")
        md.append("")
        for n in notes:
            md.append(f"- {n['text']}")
        md.append("")
    text = "\n".join(md)
    with open(out_md, "w") as f:
        f.write(text + "\n")
    result = {"meta": meta, "sections": sections,
              "goals": [{"goal": g, "figure": fig, "met": ok} for g, fig, ok in goals]}
    with open(out_json, "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
        f.write("\n")
    print(text)
    # Exit status for --smoke: a table was produced.
    return 0 if any(line.startswith("| ") for line in md) else 1


def latency_measured(rows, path):
    """Whether some latency row of `path` (mesh-default, floor…) has a measured figure."""
    return any(r.get("section") == "latency" and r.get("path") == path and r.get("frames") for r in rows)


def smoke(raw_path, sections):
    """--smoke's verdict on the raw results: fails (1) when a process crashed (a "CRASH:" note), when the latency
    section ran and no relay path carried jack_iodelay's signal intact — neither the mesh default path
    (mesh-record --host → mesh-play --find, given a second run) nor `--latency low` has a measured latency (their
    table rows show n/m) — while the rig's floor (arecord | aplay) has one, or when the join section ran and no join
    time was measured (its row shows n/m, or there is none).
    The default path's adaptive buffer follows what the rig does to the stream: a JACK dummy graph that loses periods
    (JACK xruns, counted in each row's note) moves its delay, which jack_iodelay cannot lock on; `--latency low`'s
    fixed buffer does not move. So when every default run got readings (the signal came through) but did not lock,
    with JACK xruns in each, and `low` was measured, the relay is shown to carry the signal, and the default path's
    n/m is said with its reasons, not judged. A default run with no reading at all, or one that did not lock on a
    rig that lost nothing, fails.
    SECTIONS is bench's --only list: a section that was not run is not judged."""
    rows = read_rows(raw_path)
    wanted = set(sections.split(","))
    problems = [r.get("text", "") for r in rows if r.get("section") == "note" and r.get("text", "").startswith("CRASH:")]
    if "latency" in wanted:
        default = [r for r in rows if r.get("section") == "latency" and r.get("path") == "mesh-default"]
        floors = [r for r in rows if r.get("section") == "latency" and r.get("path") == "floor"]
        if not latency_measured(rows, "mesh-default"):
            why = "; ".join(r.get("note", "") for r in default if r.get("note")) or "no row"
            if floors and not latency_measured(rows, "floor"):
                # The rig's own floor (arecord | aplay, no PeerMesh) was not measured either: the JACK graph did not
                # carry the test signal, so nothing is known of the relay's path. Said, not judged.
                print(f"bench: smoke: not judged: the mesh default latency is n/m ({why}), and so is the floor "
                      "(arecord | aplay): the JACK rig did not carry the test signal", file=sys.stderr)
            elif default and all(r.get("readings", 0) > 0 and r.get("jackXruns", 0) > 0 for r in default) \
                    and latency_measured(rows, "mesh-low"):
                low = next(r for r in rows if r.get("section") == "latency" and r.get("path") == "mesh-low" and r.get("frames"))
                print(f"bench: smoke: the mesh default latency is n/m ({why}); --latency low carried the signal "
                      f"({low['frames']:.0f} frames): the relay path works, and the default path's adaptive buffer "
                      "moved with the rig", file=sys.stderr)
            else:
                problems.append(f"the mesh default latency (mesh-record --host → mesh-play --find) is n/m ({why}); "
                                "not explained by the rig (a run with no reading, or no JACK xruns), or --latency low "
                                "was not measured either")
    if "join" in wanted:
        join_rows = [r for r in rows if r.get("section") == "join"]
        if not join_rows or join_rows[-1].get("medianMs") is None:
            why = "; ".join(r.get("text", "") for r in rows if r.get("section") == "note"
                            and r.get("text", "").startswith("join")) or "no measured run"
            problems.append(f"the join time is n/m: {why}")
    for p in problems:
        print(f"bench: smoke: FAIL: {p}", file=sys.stderr)
    return 1 if problems else 0


def main():
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "snap":
        print(json.dumps(proc_snapshot(sys.argv[2:])))
    elif cmd == "iodelay":
        print(json.dumps(iodelay(sys.argv[2], int(sys.argv[3]))))
    elif cmd == "freeport":
        print(" ".join(map(str, freeport(int(sys.argv[2]) if len(sys.argv) > 2 else 1))))
    elif cmd == "join":
        print(json.dumps(join(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])))
    elif cmd == "report":
        sys.exit(report(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]))
    elif cmd == "smoke":
        sys.exit(smoke(sys.argv[2], sys.argv[3]))
    elif cmd == "measured":
        sys.exit(0 if latency_measured(read_rows(sys.argv[2]), sys.argv[3]) else 1)
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
