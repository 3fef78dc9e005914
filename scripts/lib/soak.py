#!/usr/bin/env python3
"""The soak run behind scripts/soak: host → 4 paired players through mesh-impair on the JACK rig, sampled every
interval for RSS, descriptors, threads, xruns, loss, concealment and latency; judged at the end.

The JACK rig (ALSA_CONFIG_PATH, JACK_DEFAULT_SERVER) must be up; scripts/soak starts it. Every process this
starts runs in its own session (process group) and is stopped by that group's id, never by name.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

PLAYERS = 4
RSS_GROWTH_LIMIT_KB = 2 * 1024
LATENCY_DRIFT_LIMIT_MS = 2.0
THREAD_SLACK = 2


def log(*a):
    print("soak:", *a, file=sys.stderr, flush=True)


class Proc:
    """A child in its own process group; its stdout and stderr lines are collected by reader threads."""

    def __init__(self, name, argv, stdout_json=False):
        self.name = name
        self.argv = argv
        self.p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  start_new_session=True, text=True, bufsize=1)
        self.out, self.err = [], []
        self.json = []          # parsed stdout objects (for --json children), with arrival time
        self.lock = threading.Lock()
        self._threads = [threading.Thread(target=self._read, args=(self.p.stdout, self.out, stdout_json), daemon=True),
                         threading.Thread(target=self._read, args=(self.p.stderr, self.err, False), daemon=True)]
        for t in self._threads:
            t.start()

    def _read(self, stream, sink, parse):
        for line in stream:
            line = line.rstrip("\n")
            with self.lock:
                sink.append(line)
                if len(sink) > 2000:
                    del sink[:1000]
                if parse and line.startswith("{"):
                    try:
                        self.json.append((time.monotonic(), json.loads(line)))
                        if len(self.json) > 4000:
                            del self.json[:2000]
                    except ValueError:
                        pass

    @property
    def pid(self):
        return self.p.pid

    def alive(self):
        return self.p.poll() is None

    def wait_for(self, pattern, seconds):
        rx = re.compile(pattern)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            with self.lock:
                for line in self.err + self.out:
                    m = rx.search(line)
                    if m:
                        return m
            if not self.alive():
                return None
            time.sleep(0.05)
        return None

    def stop(self):
        if self.p.poll() is not None:
            return
        try:
            os.killpg(self.p.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.p.wait(5)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.p.wait(5)

    def records_since(self, t):
        with self.lock:
            return [o for (at, o) in self.json if at >= t]

    def last_record(self):
        with self.lock:
            return self.json[-1][1] if self.json else None


def proc_sample(pid):
    """RSS excluding shared memory (kB), descriptors and threads of a live process; None if it is gone."""
    try:
        status = open(f"/proc/{pid}/status").read()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None

    def field(name):
        m = re.search(rf"^{name}:\s+(\d+)", status, re.M)
        return int(m.group(1)) if m else 0
    return {"rssKb": field("VmRSS") - field("RssShmem"), "fds": fds, "threads": field("Threads")}


def iodelay_ms(lines):
    """jack_iodelay's latency readings (ms), from lines like '   512.000 frames     11.610 ms total roundtrip …'."""
    out = []
    for line in lines:
        m = re.search(r"([\d.]+) frames\s+([\d.]+) ms total roundtrip", line)
        if m:
            out.append(float(m.group(2)))
    return out


def main():
    # SIGTERM (scripts/soak's trap, a CI timeout) unwinds like SIGINT, so the `finally` below stops every process.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--interval", type=float, default=60)
    ap.add_argument("--out")
    args = ap.parse_args()
    b, w = args.bin, args.work
    duration = args.minutes * 60
    warmup = min(300.0, duration / 3)
    procs = []
    failures = []

    def start(name, argv, stdout_json=False):
        p = Proc(name, argv, stdout_json)
        procs.append(p)
        return p

    try:
        # jack_iodelay first: its ports are the host's capture source and player 1's playback sink.
        iod = start("jack_iodelay", ["stdbuf", "-oL", "jack_iodelay"])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if subprocess.run(["jack_lsp"], capture_output=True, text=True).stdout.find("jack_delay:out") >= 0:
                break
            time.sleep(0.1)
        else:
            log("jack_iodelay did not register its ports")
            return 1

        host = start("host", [f"{b}/mesh-record", "--host", "--pair", "--pair-timeout", "120", "--name", "soak-host",
                              "--device", "pm_delay_cap", "--bind", "127.0.0.1",
                              "--state-dir", f"{w}/host", "--json"], stdout_json=True)
        m = host.wait_for(r"pairing code: (\S+)", 20)
        port = host.wait_for(r"on port (\d+)", 5)
        if not m or not port:
            log("the host did not start:", "\n".join(host.err[-10:]))
            return 1
        code, port = m.group(1), int(port.group(1))

        proxy = start("mesh-impair", [f"{b}/mesh-impair", "--listen", "127.0.0.1:0", "--target", f"127.0.0.1:{port}",
                                      "--loss", "1%", "--delay-ms", "3", "--jitter-ms", "3", "--seed", "7", "--json"],
                      stdout_json=True)
        lm = proxy.wait_for(r"listening (\S+)", 10)
        if not lm:
            log("mesh-impair did not start:", "\n".join(proxy.err[-10:]))
            return 1
        via = lm.group(1)

        players = []
        for i in range(1, PLAYERS + 1):
            state = f"{w}/player{i}"
            pair = subprocess.run([f"{b}/mesh-play", "--pair", code, "--connect", via, "--state-dir", state,
                                   "--name", f"soak-player{i}"], capture_output=True, text=True, timeout=30)
            if pair.returncode != 0:
                log(f"player {i} could not pair:", pair.stderr.strip())
                return 1
            device = "pm_delay_play" if i == 1 else "pm_play"
            players.append(start(f"player{i}", [f"{b}/mesh-play", "--connect", via, "--state-dir", state,
                                                "--device", device, "--json"], stdout_json=True))
        for p in players:
            if not p.wait_for(r"joined soak-host", 20):
                log(f"{p.name} did not join:", "\n".join(p.err[-10:]))
                return 1
        log(f"host on port {port}, {PLAYERS} players through mesh-impair at {via}; "
            f"{args.minutes:g} min, a sample every {args.interval:g} s, warm-up {warmup:.0f} s")

        watched = [host, proxy] + players
        start_t = time.monotonic()
        samples = []
        header = ("  min | RSS MB host/proxy/p1-p4            | fds host/proxy/players | threads h/x/p   | xruns h/p "
                  "| loss % | concealed % | latency ms own p1–p4      | iodelay ms")
        print(header, flush=True)
        next_t = start_t + args.interval
        iod_seen = 0
        last_received = {p.name: None for p in players}
        while True:
            now = time.monotonic()
            if now < next_t:
                time.sleep(min(1.0, next_t - now))
                continue
            t0 = next_t - args.interval
            next_t += args.interval
            elapsed = now - start_t
            row = {"t": round(elapsed), "procs": {}, "players": {}}
            for p in watched:
                s = proc_sample(p.pid) if p.alive() else None
                if s is None:
                    failures.append(f"{p.name} exited at {elapsed:.0f} s: " + " / ".join(p.err[-3:]))
                    continue
                row["procs"][p.name] = s
            hrec = host.last_record() or {}
            row["hostXruns"] = hrec.get("xruns")
            for p in players:
                recs = p.records_since(t0)
                last = p.last_record() or {}
                lat = [r["mouthToEarMs"] for r in recs if isinstance(r.get("mouthToEarMs"), (int, float))]
                played = last.get("playedFrames") or 0
                row["players"][p.name] = {
                    "state": last.get("state"), "lossPercent": last.get("lossPercent"),
                    "concealedMs": last.get("concealedMs"), "xruns": last.get("xruns"),
                    "latencyMs": statistics.median(lat) if lat else None,
                    "receivedFrames": last.get("receivedFrames"), "playedFrames": played,
                }
                rf = last.get("receivedFrames")
                if last_received[p.name] is not None and rf is not None and rf <= last_received[p.name]:
                    failures.append(f"{p.name} received nothing between {t0 - start_t:.0f} s and {elapsed:.0f} s")
                last_received[p.name] = rf
            with iod.lock:
                lines = iod.out[iod_seen:]
                iod_seen = len(iod.out)
            readings = iodelay_ms(lines)
            row["iodelayMs"] = statistics.median(readings) if readings else None
            row["iodelayReadings"] = len(readings)
            samples.append(row)
            print(format_row(row, players), flush=True)
            if failures or elapsed >= duration - 0.5:
                break

        verdict = judge(samples, warmup, players, failures)
        final = {"minutes": args.minutes, "interval": args.interval, "warmupSeconds": warmup, "samples": samples,
                 "failures": verdict, "passed": not verdict}
        if args.out:
            with open(args.out, "w") as f:
                json.dump(final, f, indent=1)
        summarize(samples, warmup, players)
        if verdict:
            for v in verdict:
                log("FAIL:", v)
            return 1
        log(f"PASSED ({args.minutes:g} min)")
        return 0
    finally:
        for p in reversed(procs):
            p.stop()


def mb(kb):
    return f"{kb / 1024:.1f}"


def format_row(row, players):
    pr = row["procs"]
    names = ["host", "mesh-impair"] + [p.name for p in players]
    rss = "/".join(mb(pr[n]["rssKb"]) if n in pr else "–" for n in names)
    fds = "/".join(str(pr[n]["fds"]) if n in pr else "–" for n in names)
    thr = "/".join(str(pr[n]["threads"]) if n in pr else "–" for n in names)
    pl = row["players"]
    xr = f"{row.get('hostXruns', '–')}/" + ",".join(str(pl[p.name].get("xruns", "–")) for p in players)
    loss = ",".join(f"{pl[p.name]['lossPercent']:.2f}" if pl[p.name].get("lossPercent") is not None else "–" for p in players)

    def concealed(p):
        d = pl[p.name]
        if d.get("concealedMs") is None or not d.get("playedFrames"):
            return "–"
        return f"{100 * d['concealedMs'] / (d['playedFrames'] / 44.1):.2f}"
    conc = ",".join(concealed(p) for p in players)
    lat = ",".join(f"{pl[p.name]['latencyMs']:.1f}" if pl[p.name].get("latencyMs") is not None else "–" for p in players)
    iod = f"{row['iodelayMs']:.1f} ({row['iodelayReadings']})" if row.get("iodelayMs") is not None else "– (no lock)"
    return f"{row['t'] / 60:5.1f} | {rss:33} | {fds:22} | {thr:15} | {xr:9} | {loss} | {conc} | {lat:25} | {iod}"


def judge(samples, warmup, players, failures):
    """Growth is judged as a trend, not a blip: Dispatch's worker pool adds and retires a thread now and then, and the
    adaptive jitter buffer's latency moves with the impairment. A leak or a drift shows as the end of the run sitting
    above (or away from) the start of it."""
    out = list(failures)
    after = [s for s in samples if s["t"] >= warmup - 1]
    if len(after) < 2:
        return out if samples else out + ["no samples"]
    before = [s for s in samples if s["t"] <= after[0]["t"]]
    third = max(1, len(after) // 3)
    head, tail = after[:third], after[-third:]
    for name in after[0]["procs"]:
        seq = [s["procs"][name] for s in after if name in s["procs"]]
        if not seq:
            continue
        # A leak keeps the end of the run above the start: the least RSS of the last third against the most of the
        # first (one allocation burst that is given back is not growth).
        start_rss = max(s["procs"][name]["rssKb"] for s in head if name in s["procs"])
        end_rss = min(s["procs"][name]["rssKb"] for s in tail if name in s["procs"])
        growth = end_rss - start_rss
        if growth > RSS_GROWTH_LIMIT_KB:
            out.append(f"{name}: RSS grew {growth / 1024:.1f} MB after the warm-up "
                       f"({mb(start_rss)} → {mb(end_rss)} MB)")
        # Dispatch's worker pool grows on demand and keeps a worker or two for a while: threads may grow by
        # THREAD_SLACK without being a leak (a leak keeps growing; a long run shows it). Descriptors may not grow.
        for what, slack in (("fds", 0), ("threads", THREAD_SLACK)):
            start = max(s["procs"][name][what] for s in before if name in s["procs"])
            end = min(s["procs"][name][what] for s in tail if name in s["procs"])
            if end > start + slack:
                out.append(f"{name}: {what} grew after the warm-up (at most {start} until then, at least {end} at the end)")
    for p in players:
        def lat(rows):
            return [s["players"][p.name]["latencyMs"] for s in rows
                    if s["players"].get(p.name, {}).get("latencyMs") is not None]
        a, b = lat(head), lat(tail)
        # Too few samples per third (a short run) judge nothing: two readings under loss and jitter are noise.
        if len(a) >= 3 and len(b) >= 3 and abs(statistics.median(b) - statistics.median(a)) > LATENCY_DRIFT_LIMIT_MS:
            out.append(f"{p.name}: latency drifted {statistics.median(b) - statistics.median(a):+.1f} ms after the warm-up "
                       f"(median {statistics.median(a):.1f} ms in the first third, {statistics.median(b):.1f} ms in the last)")
        state = after[-1]["players"].get(p.name, {}).get("state") or ""
        if not state.startswith("joined"):
            out.append(f"{p.name}: not joined at the end ({state or 'gone'})")
    return out


def summarize(samples, warmup, players):
    after = [s for s in samples if s["t"] >= warmup - 1]
    if len(after) < 2:
        return
    base, last = after[0], after[-1]
    log(f"after the warm-up ({base['t']} s → {last['t']} s):")
    for name in base["procs"]:
        if name in last["procs"]:
            b, l = base["procs"][name], last["procs"][name]
            log(f"  {name:12} RSS {mb(b['rssKb'])} → {mb(l['rssKb'])} MB ({(l['rssKb'] - b['rssKb']) / 1024:+.2f}), "
                f"fds {b['fds']} → {l['fds']}, threads {b['threads']} → {l['threads']}")
    for p in players:
        lat = [s["players"][p.name]["latencyMs"] for s in after if s["players"][p.name].get("latencyMs") is not None]
        if lat:
            log(f"  {p.name:12} latency {lat[0]:.1f} → {lat[-1]:.1f} ms (range {min(lat):.1f}–{max(lat):.1f}), "
                f"loss {last['players'][p.name].get('lossPercent')} %")


if __name__ == "__main__":
    sys.exit(main())
