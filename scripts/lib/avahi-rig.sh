# shellcheck shell=bash
# avahi-rig.sh — a private dbus + avahi-daemon bound to loopback only, for PeerMesh's Avahi tests.
#
# Source this file, then:
#   avahi_rig_start DIR   start (or reuse) a system dbus and an avahi-daemon on `lo` only; exports
#                         MESH_AVAHI_RIG=1, MESH_AVAHI_PIDFILE, MESH_AVAHI_RESTART, MESH_AVAHI_CTL. Refuses a DIR
#                         whose pid files name running processes (a rig started from DIR that still runs).
#   avahi_rig_stop DIR    stop exactly what avahi_rig_start started (by PID), nothing else
#
# DIR must be this user's own, writable by nobody else, and not a symbolic link (made 0700 when it is not there):
# the rig runs scripts from it as root and kills the PIDs it reads there, so a directory another user made first (a
# fixed name in /tmp) would hand that user root. Both functions refuse any other.
#
# mDNS never leaves the machine: the daemon's config names its only interface (allow-interfaces=lo) and IPv6,
# wide-area DNS-SD and the reflector are off. An avahi-daemon that is already running is reused only when its
# config also allows nothing but `lo`; otherwise avahi_rig_start refuses (it never stops another's daemon).
#
# DIR/avahi-ctl {stop|start|restart} controls the daemon this rig started (tests use it to prove reconnection);
# it is only installed when this rig owns the daemon. Every wait is bounded.
#
# The daemons' paths (/run/dbus/system_bus_socket, /run/avahi-daemon/pid) are the machine's: one such rig per
# machine. The scripts that start it hold the run lock of scripts/lib/rig-lock.sh for their whole run, and its
# daemons do not inherit the lock's descriptor.

AVAHI_RIG_SYSTEM_BUS=/run/dbus/system_bus_socket

# avahi_rig__log MSG… — rig messages go to stderr.
avahi_rig__log() { echo "avahi-rig: $*" >&2; }

# avahi_rig__bus_alive — true when a system bus answers on the standard socket.
avahi_rig__bus_alive() {
  [[ -S $AVAHI_RIG_SYSTEM_BUS ]] &&
    timeout 3 dbus-send --system --print-reply --dest=org.freedesktop.DBus /org/freedesktop/DBus \
      org.freedesktop.DBus.GetId >/dev/null 2>&1
}

# avahi_rig__daemon_running — true when avahi-daemon answers on the system bus in state RUNNING (2).
avahi_rig__daemon_running() {
  timeout 3 dbus-send --system --print-reply --dest=org.freedesktop.Avahi / org.freedesktop.Avahi.Server.GetState \
    2>/dev/null | grep -q 'int32 2'
}

# avahi_rig__write_conf FILE IFACE [HOSTNAME [ipv6]] — an avahi-daemon config pinned to one interface, IPv4 only
# (IPv4 and IPv6 with `ipv6`), nothing published beyond what clients ask for. The two-host rig (netns-rig.sh)
# names each namespace's host with HOSTNAME and turns IPv6 on for its veth (lo has no IPv6 multicast).
avahi_rig__write_conf() {
  local ipv6=no
  [[ ${4:-} == ipv6 ]] && ipv6=yes
  {
    echo "# Written by scripts/lib/avahi-rig.sh — mDNS stays on $2 only."
    echo "[server]"
    [[ -n ${3:-} ]] && echo "host-name=$3"
    cat <<EOF
allow-interfaces=$2
use-ipv4=yes
use-ipv6=$ipv6
disallow-other-stacks=yes
ratelimit-interval-usec=1000000
ratelimit-burst=1000
[wide-area]
enable-wide-area=no
[publish]
publish-addresses=yes
publish-hinfo=no
publish-workstation=no
publish-domain=no
publish-aaaa-on-ipv4=no
publish-a-on-ipv6=no
[reflector]
enable-reflector=no
[rlimits]
EOF
  } >"$1"
}

# avahi_rig__conf_is_loopback_only PID — true when the running daemon PID is limited to `lo`: either its config
# file says allow-interfaces=lo, or (the daemon rewrites its command line, hiding -f) the kernel shows the mDNS
# group 224.0.0.251 / ff02::fb joined on lo and on no other interface.
avahi_rig__conf_is_loopback_only() {
  local pid=$1 conf=/etc/avahi/avahi-daemon.conf prev="" arg
  [[ -r /proc/$pid/cmdline ]] || return 1
  while IFS= read -r -d '' arg; do
    case $arg in
      --file=*) conf=${arg#--file=} ;;
    esac
    if [[ $prev == -f || $prev == --file ]]; then conf=$arg; fi
    prev=$arg
  done <"/proc/$pid/cmdline"
  if [[ -r $conf ]] && grep -Eq '^[[:space:]]*allow-interfaces[[:space:]]*=[[:space:]]*lo[[:space:]]*$' "$conf"; then
    return 0
  fi
  avahi_rig__mdns_on_lo_only
}

# avahi_rig__mdns_on_lo_only — true when the mDNS multicast groups are joined on lo and nowhere else.
avahi_rig__mdns_on_lo_only() {
  local dev="" line ifaces=""
  while read -r line; do
    case $line in
      [0-9]*) dev=$(awk '{print $2}' <<<"$line") ;;
      *FB0000E0*) ifaces+=" $dev" ;;
    esac
  done < <(tail -n +2 /proc/net/igmp 2>/dev/null)
  if [[ -r /proc/net/igmp6 ]]; then
    while read -r _ name group _; do
      [[ $group == ff0200000000000000000000000000fb ]] && ifaces+=" $name"
    done </proc/net/igmp6
  fi
  [[ -n $ifaces ]] && [[ -z $(tr ' ' '\n' <<<"$ifaces" | grep -v -x -e '' -e lo) ]]
}

# avahi_rig__wait_running SECONDS — waits (bounded) until the daemon reports RUNNING on the bus.
avahi_rig__wait_running() {
  local deadline=$((SECONDS + $1))
  until avahi_rig__daemon_running; do
    ((SECONDS < deadline)) || return 1
    sleep 0.1
  done
}

# avahi_rig__install_ctl DIR — writes DIR/avahi-ctl and DIR/avahi-restart, which stop/start the rig's daemon by
# its pidfile with the same config.
avahi_rig__install_ctl() {
  local dir=$1
  cat >"$dir/avahi-ctl" <<EOF
#!/usr/bin/env bash
# avahi-ctl {stop|start|restart} — controls the avahi-daemon of the rig in $dir (by PID only).
set -uo pipefail
dir='$dir'
stop() {
  local pid
  pid=\$(cat "\$dir/avahi.pid" 2>/dev/null) || return 0
  [[ -n \$pid ]] || return 0
  kill -TERM "\$pid" 2>/dev/null || { rm -f "\$dir/avahi.pid"; return 0; }
  for _ in \$(seq 100); do kill -0 "\$pid" 2>/dev/null || break; sleep 0.05; done
  kill -0 "\$pid" 2>/dev/null && kill -KILL "\$pid" 2>/dev/null
  rm -f "\$dir/avahi.pid"
}
start() {
  if [[ -s \$dir/avahi.pid ]] && kill -0 "\$(cat "\$dir/avahi.pid")" 2>/dev/null; then return 0; fi
  avahi-daemon --no-drop-root --no-chroot --no-rlimits -f "\$dir/avahi-daemon.conf" >>"\$dir/avahi.log" 2>&1 </dev/null 9>&- &
  echo \$! >"\$dir/avahi.pid"
  for _ in \$(seq 100); do
    timeout 3 dbus-send --system --print-reply --dest=org.freedesktop.Avahi / org.freedesktop.Avahi.Server.GetState \
      2>/dev/null | grep -q 'int32 2' && return 0
    kill -0 "\$(cat "\$dir/avahi.pid")" 2>/dev/null || break
    sleep 0.1
  done
  echo "avahi-ctl: avahi-daemon did not come up; see \$dir/avahi.log" >&2
  return 1
}
case \${1:-} in
  stop) stop ;;
  start) start ;;
  restart) stop; start ;;
  *) echo "usage: \$0 stop|start|restart" >&2; exit 2 ;;
esac
EOF
  chmod +x "$dir/avahi-ctl"
  printf '#!/usr/bin/env bash\n# Kills the rig'"'"'s avahi-daemon by PID and starts it again with the same config.\nexec "%s/avahi-ctl" restart\n' \
    "$dir" >"$dir/avahi-restart"
  chmod +x "$dir/avahi-restart"
}

# avahi_rig__own_dir DIR — true when DIR is a directory (not a link) owned by this user that no other can write in,
# with a message when not (see the header).
avahi_rig__own_dir() {
  local mode
  if [[ -d $1 && ! -L $1 && -O $1 ]] && mode=$(stat -c %a "$1") && (((8#$mode & 8#022) == 0)); then return 0; fi
  avahi_rig__log "$1 is not a directory of $(id -un)'s that only it can write in ($(stat -c '%U %A' "$1" 2>/dev/null ||
    echo missing)): not using it (the rig runs scripts from it as $(id -un)); name another DIR"
  return 1
}

# avahi_rig_start DIR — see the header. Returns non-zero (with a message) when the rig cannot be brought up.
avahi_rig_start() {
  local dir=${1:?usage: avahi_rig_start DIR}
  [[ -e $dir || -L $dir ]] || mkdir -p -m 0700 "$dir" || return 1
  avahi_rig__own_dir "$dir" || return 1
  dir=$(cd "$dir" && pwd)
  # A rig already running from DIR keeps its records: overwriting them would leave its daemons with nobody to stop them.
  local f other_pid
  for f in dbus.pid avahi.pid; do
    other_pid=$(cat "$dir/$f" 2>/dev/null) || continue
    if [[ -n $other_pid ]] && kill -0 "$other_pid" 2>/dev/null; then
      avahi_rig__log "$dir/$f names a running process (pid $other_pid): a rig started from $dir still runs;" \
        "stop it first (avahi_rig_stop $dir, or scripts/avahi-up --stop $dir)"
      return 1
    fi
  done
  rm -f "$dir/dbus.pid" "$dir/avahi.pid" "$dir/avahi-ctl" "$dir/avahi-restart"

  # 1. A system bus: reuse a live one, else start our own (clearing a stale socket/pidfile nobody owns).
  if ! avahi_rig__bus_alive; then
    mkdir -p /run/dbus
    if [[ -e /run/dbus/pid ]] && kill -0 "$(cat /run/dbus/pid 2>/dev/null)" 2>/dev/null; then
      avahi_rig__log "a dbus-daemon (pid $(cat /run/dbus/pid)) owns /run/dbus but does not answer; not touching it"
      return 1
    fi
    rm -f /run/dbus/pid "$AVAHI_RIG_SYSTEM_BUS"
    local pid
    # 9>&-: no daemon keeps the run lock's descriptor (scripts/lib/rig-lock.sh).
    pid=$(dbus-daemon --system --fork --print-pid 9>&-) || { avahi_rig__log "dbus-daemon --system failed to start"; return 1; }
    echo "$pid" >"$dir/dbus.pid"
    local deadline=$((SECONDS + 10))
    until avahi_rig__bus_alive; do
      ((SECONDS < deadline)) || { avahi_rig__log "system bus did not come up"; avahi_rig_stop "$dir"; return 1; }
      sleep 0.05
    done
  fi

  # 2. Loopback must carry multicast for mDNS.
  ip link set lo multicast on || { avahi_rig__log "cannot set lo multicast on"; avahi_rig_stop "$dir"; return 1; }

  # 3. avahi-daemon on lo only: reuse a loopback-only one, refuse any other, else start ours.
  avahi_rig__write_conf "$dir/avahi-daemon.conf" lo
  if avahi-daemon --check 2>/dev/null; then
    local other
    other=$(cat /run/avahi-daemon/pid 2>/dev/null) || other=""
    if [[ -z $other ]] || ! avahi_rig__conf_is_loopback_only "$other"; then
      avahi_rig__log "an avahi-daemon (pid ${other:-?}) is already running and is not limited to lo;" \
        "stop it (or restrict it with allow-interfaces=lo) — this rig must not send mDNS off the machine"
      avahi_rig_stop "$dir"
      return 1
    fi
    avahi_rig__log "reusing the running loopback-only avahi-daemon (pid $other); restart tests are disabled"
    avahi_rig__wait_running 10 || { avahi_rig__log "the running avahi-daemon is not answering"; return 1; }
    unset MESH_AVAHI_RESTART MESH_AVAHI_CTL
    export MESH_AVAHI_PIDFILE=/run/avahi-daemon/pid
  else
    # A pidfile left by a dead daemon would make avahi-daemon refuse to start.
    [[ -e /run/avahi-daemon/pid ]] && ! kill -0 "$(cat /run/avahi-daemon/pid 2>/dev/null)" 2>/dev/null &&
      rm -f /run/avahi-daemon/pid
    avahi_rig__install_ctl "$dir"
    : >"$dir/avahi.log"
    if ! "$dir/avahi-ctl" start; then
      avahi_rig__log "avahi-daemon failed; log:"; sed 's/^/  /' "$dir/avahi.log" >&2
      avahi_rig_stop "$dir"
      return 1
    fi
    export MESH_AVAHI_PIDFILE=$dir/avahi.pid MESH_AVAHI_RESTART=$dir/avahi-restart MESH_AVAHI_CTL=$dir/avahi-ctl
  fi
  export MESH_AVAHI_RIG=1
  avahi_rig__log "ready (dbus: $([[ -s $dir/dbus.pid ]] && echo "ours, pid $(cat "$dir/dbus.pid")" || echo reused);" \
    "avahi-daemon: $([[ -s $dir/avahi.pid ]] && echo "ours, pid $(cat "$dir/avahi.pid")" || echo reused), lo only)"
}

# (Every function here is safe under `set -euo pipefail`, as scripts/test runs.)

# avahi_rig_stop DIR — stops the avahi-daemon and dbus-daemon this rig started, by PID. Safe to call twice.
avahi_rig_stop() {
  local dir=${1:?usage: avahi_rig_stop DIR} pid
  # Nothing to stop where there is no DIR; nothing run or killed from one that is not ours.
  [[ -e $dir || -L $dir ]] || return 0
  avahi_rig__own_dir "$dir" || return 1
  if [[ -x $dir/avahi-ctl ]]; then "$dir/avahi-ctl" stop; fi
  if [[ -s $dir/dbus.pid ]]; then
    pid=$(cat "$dir/dbus.pid")
    if kill -TERM "$pid" 2>/dev/null; then
      for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
      kill -0 "$pid" 2>/dev/null && { kill -KILL "$pid" 2>/dev/null || true; }
    fi
    rm -f "$dir/dbus.pid"
    # dbus-daemon leaves its socket and pidfile behind; they are ours to clear.
    [[ -e /run/dbus/pid && $(cat /run/dbus/pid 2>/dev/null) == "$pid" ]] && rm -f /run/dbus/pid "$AVAHI_RIG_SYSTEM_BUS"
  fi
  unset MESH_AVAHI_RIG MESH_AVAHI_PIDFILE MESH_AVAHI_RESTART MESH_AVAHI_CTL
}
