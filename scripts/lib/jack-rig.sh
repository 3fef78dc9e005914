#!/usr/bin/env bash
# jack-rig.sh — a private JACK dummy server plus the project's ALSA PCM definitions, for tests and benchmarks.
#
# Source it and call:
#   jack_rig_start DIR [NAME] [PERIOD]   start jackd NAME (default peermesh, period default 128 frames at 44.1 kHz),
#                                        write DIR/asound.conf and DIR/known.raw, export the environment below
#   jack_rig_stop DIR                    stop the jackd recorded in DIR/jackd.pid (only that PID), wait for exit
# Or run it:  scripts/lib/jack-rig.sh run DIR -- COMMAND...   (starts, runs COMMAND, stops on exit via trap)
#
# Exports: ALSA_CONFIG_PATH=DIR/asound.conf, JACK_DEFAULT_SERVER=NAME, JACK_NO_AUDIO_RESERVATION=1,
#          JACK_NO_START_SERVER=1, MESH_JACK_RIG=1, MESH_JACK_RIG_DIR=DIR.
# Env knobs: JACK_RIG_JACKD_FLAGS (extra jackd server flags before -d, e.g. -S; default none, see below);
#            JACK_RIG_RATE (the dummy driver's sample rate, default 44100; the benchmark runs trx, which needs
#            48000, on a second server).
#
# PCMs (names are a contract; all are 44.1 kHz Float32 through the ALSA jack plugin unless noted):
#   pm_cap         capture  <- system:capture_1 (JACK dummy: silence)
#   pm_play        playback -> system:playback_1 (JACK dummy: discarded)
#   pm_knowncap    capture through the `file` plugin over pm_cap with infile DIR/known.raw: yields the bytes of
#                  known.raw instead of the captured silence, at the jack pace. known.raw = KNOWN_SECONDS (8) s of
#                  mono Float32LE: x0=12345, x(n+1) = (1103515245*x(n) + 12345) mod 2^31, sample n =
#                  x(n+1)/2^31 - 0.5 (a non-repeating pattern in [-0.5, 0.5), never -0.0). After it, silence.
#                  Mono only (open it with 1 channel).
#   pm_loop_cap    capture; its JACK client is named "pm_loop_cap", port pm_loop_cap:in_000 (also fed by the
#                  silent system:capture_1, which adds exactly 0.0)
#   pm_loop_play   playback; JACK client "pm_loop_play", connects to pm_loop_cap:in_000. OPEN pm_loop_cap FIRST:
#                  the plugin connects at open and fails if the port is absent. A direct client-to-client
#                  connection is sample-exact (JACK runs the player before the recorder in the same cycle).
#                  Why not jackd's `-L` loopback driver: measured here, its latency flips between 0 and 1 period
#                  from cycle to cycle, duplicating or dropping periods.
#   pm_delay_cap   capture  <- jack_delay:out   (run `jack_iodelay` first; for the mouth-to-ear benchmark)
#   pm_delay_play  playback -> jack_delay:in
#   pm_s16         capture that refuses FLOAT_LE: an `lfloat` plugin (integer formats only on our side) over
#                  pm_knowncap. Opening it as Float32 must fall back to plug:pm_s16 and then delivers known.raw.
#   pm_s16_play    playback twin of pm_s16 over pm_play.
#
# Server mode: jackd runs in its default asynchronous mode, as in RIG-NOTES (whose latency figures were measured
# that way). The Swift pm_loop test was sample-exact in async mode, also with both cores busy; `aplay | arecord`
# through the same pair in async mode lost a period now and then (non-real-time clients that wake late), and
# were exact with -S. Set JACK_RIG_JACKD_FLAGS=-S for jackd's synchronous mode if non-RT clients need exactness.

KNOWN_SECONDS=8
JACK_RIG_LIB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

jack_rig__write_known() {  # $1 = output path
    perl -e '
        my ($path, $frames) = @ARGV;
        open(my $fh, ">:raw", $path) or die "cannot write $path: $!";
        my $x = 12345; my $buf = "";
        for (my $n = 0; $n < $frames; $n++) {
            $x = (1103515245 * $x + 12345) % 2147483648;
            $buf .= pack("f<", $x / 2147483648.0 - 0.5);
        }
        print $fh $buf; close($fh) or die "cannot write $path: $!";
    ' "$1" $((44100 * KNOWN_SECONDS))
}

jack_rig__write_conf() {  # $1 = DIR
    local dir=$1
    {
        cat /usr/share/alsa/alsa.conf
        cat <<CONF

# ---- PeerMesh test rig (scripts/lib/jack-rig.sh) ----
pcm.pm_cap { type jack capture_ports { 0 system:capture_1 } }
pcm.pm_play { type jack playback_ports { 0 system:playback_1 } }
pcm.pm_knowncap { type file slave.pcm "pm_cap" file "/dev/null" infile "$dir/known.raw" format "raw" }
pcm.pm_loop_cap { type jack name "pm_loop_cap" capture_ports { 0 system:capture_1 } }
pcm.pm_loop_play { type jack name "pm_loop_play" playback_ports { 0 "pm_loop_cap:in_000" } }
pcm.pm_delay_cap { type jack capture_ports { 0 jack_delay:out } }
pcm.pm_delay_play { type jack playback_ports { 0 jack_delay:in } }
pcm.pm_s16 { type lfloat slave { pcm "pm_knowncap" format FLOAT_LE } }
pcm.pm_s16_play { type lfloat slave { pcm "pm_play" format FLOAT_LE } }
CONF
    } > "$dir/asound.conf"
}

jack_rig_start() {
    local dir=${1:?usage: jack_rig_start DIR [NAME] [PERIOD]} name=${2:-peermesh} period=${3:-128}
    mkdir -p "$dir" || return 1
    dir=$(cd "$dir" && pwd)
    if [[ -s $dir/jackd.pid ]] && kill -0 "$(cat "$dir/jackd.pid")" 2>/dev/null; then
        echo "jack-rig: a jackd started from $dir is already running (PID $(cat "$dir/jackd.pid"))" >&2
        return 1
    fi
    export JACK_NO_AUDIO_RESERVATION=1 JACK_DEFAULT_SERVER=$name JACK_NO_START_SERVER=1
    # JACK's machine-wide registry has 8 server slots, and a jackd that ends without unregistering keeps its slot
    # until a server of the same name starts (never, for names like pmsoak$$): free the slots of dead servers first.
    # python3 missing is a broken setup, not a registry problem: say so instead of starting with full slots.
    if ! command -v python3 >/dev/null; then
        echo "jack-rig: python3 is missing (scripts/setup installs it); it frees the JACK registry slots" >&2
        return 1
    fi
    python3 "$JACK_RIG_LIB/jack_registry.py" reclaim ||
        echo "jack-rig: could not reclaim the registry slots of dead JACK servers (see above); starting jackd anyway" >&2
    local flags=${JACK_RIG_JACKD_FLAGS:-}
    # 9>&-: the daemon must not keep the run lock's descriptor (scripts/lib/rig-lock.sh).
    # shellcheck disable=SC2086  # flags are intentionally word-split
    jackd $flags -n "$name" -d dummy -r "${JACK_RIG_RATE:-44100}" -p "$period" -C 2 -P 2 >"$dir/jackd.log" 2>&1 </dev/null 9>&- &
    echo $! >"$dir/jackd.pid"

    local tries=0
    until jack_lsp >/dev/null 2>&1; do
        if ! kill -0 "$(cat "$dir/jackd.pid")" 2>/dev/null; then
            echo "jack-rig: jackd exited at start; see $dir/jackd.log:" >&2
            tail -5 "$dir/jackd.log" >&2
            rm -f "$dir/jackd.pid"
            return 1
        fi
        if (( ++tries > 100 )); then
            echo "jack-rig: jackd '$name' not ready after 10 s; stopping it (log: $dir/jackd.log)" >&2
            jack_rig_stop "$dir"
            return 1
        fi
        sleep 0.1
    done

    jack_rig__write_known "$dir/known.raw" || { jack_rig_stop "$dir"; return 1; }
    jack_rig__write_conf "$dir"
    export ALSA_CONFIG_PATH=$dir/asound.conf MESH_JACK_RIG=1 MESH_JACK_RIG_DIR=$dir
}

jack_rig_stop() {
    local dir=${1:?usage: jack_rig_stop DIR}
    local pidfile=$dir/jackd.pid pid
    [[ -s $pidfile ]] || return 0
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null
        local tries=0
        while kill -0 "$pid" 2>/dev/null; do
            if (( ++tries == 50 )); then kill -KILL "$pid" 2>/dev/null; fi
            if (( tries > 100 )); then echo "jack-rig: jackd PID $pid did not exit" >&2; return 1; fi
            sleep 0.1
        done
    fi
    # Reap it if it is our child and somehow not reaped yet (the loop above ends once the shell has reaped it: `kill
    # -0` succeeds on a zombie). Only while /proc has it: a `wait` on a child the shell reaped while it ran a signal
    # trap blocks for ever (scripts/test's end_job).
    if [[ -e /proc/$pid ]]; then wait "$pid" 2>/dev/null; fi
    # A jackd that had clients die on it can exit on TERM without unregistering (seen after every soak): free its
    # registry slot now that its PID is gone, so runs do not use up the machine's 8.
    python3 "$JACK_RIG_LIB/jack_registry.py" reclaim 2>/dev/null || true
    rm -f "$pidfile"
    unset MESH_JACK_RIG
}

# Standalone use: jack-rig.sh run DIR -- COMMAND...
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    set -u
    if [[ ${1:-} == run && $# -ge 4 && $3 == -- ]]; then
        rig_dir=$2; shift 3
        trap 'jack_rig_stop "$rig_dir"' EXIT
        trap 'exit 130' INT
        trap 'exit 143' TERM
        jack_rig_start "$rig_dir" || exit 1
        "$@"
        exit $?
    fi
    echo "usage: source $0; jack_rig_start DIR [NAME] [PERIOD]; ...; jack_rig_stop DIR" >&2
    echo "   or: $0 run DIR -- COMMAND..." >&2
    exit 2
fi
