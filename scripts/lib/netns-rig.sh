# shellcheck shell=bash
# netns-rig.sh — two "hosts" on one machine for PeerMesh's two-host tests.
#
# Source this file, then:
#   netns_rig_start DIR   creates network namespaces pmA<sfx> and pmB<sfx> joined by a veth pair
#                         (A: 198.18.0.1/30 on pma<sfx>, B: 198.18.0.2/30 on pmb<sfx>; 198.18.0.0/15 is the
#                         benchmarking range, never routed here). Each host gets a private mount namespace with
#                         a tmpfs on /run, its own `dbus-daemon --system` and its own avahi-daemon whose config
#                         names only that host's veth (IPv4 and IPv6). The veth also carries the IPv6 ULAs
#                         fd00:6::1/64 (A) and fd00:6::2/64 (B), and each end's link-local address. Exports
#                         MESH_NETNS_RIG=DIR, MESH_NETNS_A_ADDR, MESH_NETNS_B_ADDR, MESH_NETNS_A_ADDR6,
#                         MESH_NETNS_B_ADDR6, MESH_NETNS_A_IF, MESH_NETNS_B_IF.
#   netns_rig_stop DIR    stops every process in both namespaces (by PID), then deletes the namespaces (which
#                         deletes the veth). Safe to call twice and after a failed start: DIR/names lists only the
#                         namespaces and veths this run created, each written once it exists.
#   scripts/on-host A|B CMD…  runs CMD on a host (its network and mount namespaces, so it sees that host's bus).
#
# The suffix is the starting shell's PID (in base 36), so parallel runs never share names. Nothing here touches
# the root namespace's interfaces; mDNS stays on the veth pair.

NETNS_RIG_A_ADDR=198.18.0.1
NETNS_RIG_B_ADDR=198.18.0.2
NETNS_RIG_A_ADDR6=fd00:6::1
NETNS_RIG_B_ADDR6=fd00:6::2

# The avahi-daemon config writer is shared with the loopback rig.
# shellcheck source=avahi-rig.sh
source "$(dirname "${BASH_SOURCE[0]}")/avahi-rig.sh"

netns_rig__log() { echo "netns-rig: $*" >&2; }

# netns_rig__b36 N — N in base 36 (short, alphanumeric names).
netns_rig__b36() {
  local n=$1 digits=0123456789abcdefghijklmnopqrstuvwxyz out=""
  while ((n > 0)); do out=${digits:n%36:1}$out; n=$((n / 36)); done
  echo "${out:-0}"
}

# netns_rig__note FILE KEY VALUE — records one name this run created (KEY=VALUE in FILE). Called only after the
# object exists: a name that was taken already (an earlier run's namespace or veth) is never recorded, so stop never
# deletes what this run did not create.
netns_rig__note() {
  printf '%s=%s\n' "$2" "$3" >>"$1"
}

# netns_rig__ns_exists NAME — true when network namespace NAME exists. (The list is read first: `ip netns list |
# grep -q` fails under pipefail whenever grep's early exit makes ip die of SIGPIPE.)
netns_rig__ns_exists() {
  local list
  list=$(ip netns list 2>/dev/null) || return 1
  grep -qw -- "$1" <<<"$list"
}

# netns_rig__in HOST CMD… — runs CMD in HOST's holder namespaces (network + mount).
netns_rig__in() {
  local dir=$1 host=$2; shift 2
  nsenter -t "$(cat "$dir/$host.holder")" -m -n -- "$@"
}

# netns_rig__start_host DIR HOST NS IFACE ADDR — holder, dbus and avahi for one host.
netns_rig__start_host() {
  local dir=$1 host=$2 ns=$3 iface=$4 addr=$5 lower
  lower=$(tr 'AB' 'ab' <<<"$host")
  # The holder keeps the host's mount namespace (tmpfs /run) alive; on-host enters it by PID. Like the daemons below,
  # it does not keep the run lock's descriptor 9 (scripts/lib/rig-lock.sh).
  ip netns exec "$ns" unshare -m --propagation private \
    sh -c 'mount -t tmpfs -o mode=755 tmpfs /run && mkdir -p /run/dbus /run/avahi-daemon && exec sleep infinity' \
    </dev/null >/dev/null 2>"$dir/$host.holder.log" 9>&- &
  echo $! >"$dir/$host.holder"
  local deadline=$((SECONDS + 10))
  # Ready when the holder's /run is the tmpfs: it has exec'd sleep (so the mount is done), its dbus dir exists and
  # no host socket is visible. (Without the first check, the machine's own /run can pass for it: a dbus-daemon
  # started then puts its socket in the real /run/dbus.)
  until [[ $(cat "/proc/$(cat "$dir/$host.holder")/comm" 2>/dev/null) == sleep ]] &&
        [[ -d /proc/$(cat "$dir/$host.holder")/root/run/avahi-daemon ]] &&
        [[ ! -e /proc/$(cat "$dir/$host.holder")/root/run/dbus/system_bus_socket ]]; do
    kill -0 "$(cat "$dir/$host.holder")" 2>/dev/null || { netns_rig__log "host $host: holder died"; return 1; }
    ((SECONDS < deadline)) || { netns_rig__log "host $host: holder not ready"; return 1; }
    sleep 0.05
  done

  local pid
  pid=$(netns_rig__in "$dir" "$host" dbus-daemon --system --fork --print-pid 9>&-) ||
    { netns_rig__log "host $host: dbus-daemon failed"; return 1; }
  echo "$pid" >"$dir/$host.dbus.pid"

  avahi_rig__write_conf "$dir/$host.avahi-daemon.conf" "$iface" "pm-$lower" ipv6
  # exec, so that $! is avahi-daemon itself (nsenter without a PID namespace execs, it does not fork).
  (exec nsenter -t "$(cat "$dir/$host.holder")" -m -n -- avahi-daemon --no-drop-root --no-chroot --no-rlimits \
    -f "$dir/$host.avahi-daemon.conf" </dev/null >"$dir/$host.avahi.log" 2>&1 9>&-) &
  echo $! >"$dir/$host.avahi.pid"
  deadline=$((SECONDS + 15))
  until netns_rig__in "$dir" "$host" timeout 3 dbus-send --system --print-reply --dest=org.freedesktop.Avahi / \
          org.freedesktop.Avahi.Server.GetState 2>/dev/null | grep -q 'int32 2'; do
    kill -0 "$(cat "$dir/$host.avahi.pid")" 2>/dev/null ||
      { netns_rig__log "host $host: avahi-daemon died:"; sed 's/^/  /' "$dir/$host.avahi.log" >&2; return 1; }
    ((SECONDS < deadline)) || { netns_rig__log "host $host: avahi-daemon not running after 15 s"; return 1; }
    sleep 0.1
  done
  : "$addr"
}

# netns_rig_start DIR — see the header.
netns_rig_start() {
  local dir=${1:?usage: netns_rig_start DIR}
  mkdir -p "$dir" || return 1
  dir=$(cd "$dir" && pwd)
  case $dir in /run|/run/*) netns_rig__log "DIR must not be under /run (each host mounts its own /run)"; return 1 ;; esac
  local sfx
  sfx=$(netns_rig__b36 "$$")$(netns_rig__b36 $((RANDOM % 36)))
  [[ -e $dir/names ]] && { netns_rig__log "$dir already holds a two-host rig (netns_rig_stop it first)"; return 1; }
  local nsA=pmA$sfx nsB=pmB$sfx ifA=pma$sfx ifB=pmb$sfx names=$dir/names
  # Each name is written down once its namespace or veth exists (netns_rig__note).
  : >"$names"

  if ! { ip netns add "$nsA" && netns_rig__note "$names" NS_A "$nsA" &&
         ip netns add "$nsB" && netns_rig__note "$names" NS_B "$nsB" &&
         ip link add "$ifA" type veth peer name "$ifB" &&
         netns_rig__note "$names" IF_A "$ifA" && netns_rig__note "$names" IF_B "$ifB" &&
         ip link set "$ifA" netns "$nsA" && ip link set "$ifB" netns "$nsB" &&
         ip -n "$nsA" addr add "$NETNS_RIG_A_ADDR/30" dev "$ifA" && ip -n "$nsB" addr add "$NETNS_RIG_B_ADDR/30" dev "$ifB" &&
         ip -n "$nsA" addr add "$NETNS_RIG_A_ADDR6/64" dev "$ifA" nodad &&
         ip -n "$nsB" addr add "$NETNS_RIG_B_ADDR6/64" dev "$ifB" nodad &&
         ip -n "$nsA" link set lo up && ip -n "$nsB" link set lo up &&
         ip -n "$nsA" link set "$ifA" multicast on up && ip -n "$nsB" link set "$ifB" multicast on up; }; then
    netns_rig__log "could not create the namespaces and veth pair"
    netns_rig_stop "$dir"
    return 1
  fi
  if ! netns_rig__start_host "$dir" A "$nsA" "$ifA" "$NETNS_RIG_A_ADDR" ||
     ! netns_rig__start_host "$dir" B "$nsB" "$ifB" "$NETNS_RIG_B_ADDR"; then
    netns_rig_stop "$dir"
    return 1
  fi
  export MESH_NETNS_RIG=$dir MESH_NETNS_A_ADDR=$NETNS_RIG_A_ADDR MESH_NETNS_B_ADDR=$NETNS_RIG_B_ADDR \
    MESH_NETNS_A_ADDR6=$NETNS_RIG_A_ADDR6 MESH_NETNS_B_ADDR6=$NETNS_RIG_B_ADDR6 MESH_NETNS_A_IF=$ifA MESH_NETNS_B_IF=$ifB
  netns_rig__log "ready: host A = $nsA ($NETNS_RIG_A_ADDR on $ifA), host B = $nsB ($NETNS_RIG_B_ADDR on $ifB)"
}

# netns_rig__kill PID — SIGTERM, bounded wait, then SIGKILL.
netns_rig__kill() {
  local pid=$1
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.05; done
  kill -KILL "$pid" 2>/dev/null || true
}

# netns_rig_stop DIR — see the header. (Every function here is safe under `set -euo pipefail`.)
netns_rig_stop() {
  local dir=${1:?usage: netns_rig_stop DIR} host ns pid
  [[ -r $dir/names ]] || return 0
  # Only the names this run created are in the file (a start that failed half-way wrote fewer).
  # shellcheck disable=SC2034  # IF_B is recorded for completeness; deleting IF_A deletes its peer
  local NS_A="" NS_B="" IF_A="" IF_B=""
  # shellcheck disable=SC1091
  source "$dir/names"
  for host in A B; do
    for f in avahi.pid dbus.pid; do
      [[ -s $dir/$host.$f ]] && netns_rig__kill "$(cat "$dir/$host.$f")"
      rm -f "$dir/$host.$f"
    done
  done
  # Anything else still running on the hosts (a probe, an avahi-publish) was started through this rig.
  for ns in "$NS_A" "$NS_B"; do
    [[ -n $ns ]] || continue
    netns_rig__ns_exists "$ns" || continue
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      [[ -s $dir/A.holder && $pid == "$(cat "$dir/A.holder")" ]] && continue
      [[ -s $dir/B.holder && $pid == "$(cat "$dir/B.holder")" ]] && continue
      netns_rig__kill "$pid"
    done
  done
  for host in A B; do
    [[ -s $dir/$host.holder ]] && netns_rig__kill "$(cat "$dir/$host.holder")"
    rm -f "$dir/$host.holder"
  done
  for ns in "$NS_A" "$NS_B"; do
    [[ -n $ns ]] || continue
    netns_rig__ns_exists "$ns" && { ip netns del "$ns" || true; }
  done
  # A veth that never reached its namespace lives in the root namespace.
  [[ -n $IF_A ]] && ip link show "$IF_A" >/dev/null 2>&1 && { ip link del "$IF_A" || true; }
  rm -f "$dir/names"
  [[ ${MESH_NETNS_RIG:-} == "$dir" ]] &&
    unset MESH_NETNS_RIG MESH_NETNS_A_ADDR MESH_NETNS_B_ADDR MESH_NETNS_A_ADDR6 MESH_NETNS_B_ADDR6 MESH_NETNS_A_IF MESH_NETNS_B_IF
  return 0
}

# ---------------------------------------------------------------------------------------------------------------
# Three hosts in a line, for relayed links: A — H — B. A and B each reach H; nothing joins A and B.
#
#   netns_rig3_start DIR  creates network namespaces pm3a<sfx>, pm3h<sfx> and pm3b<sfx> and two veth pairs:
#                           A p3a<sfx>  10.77.1.2/24 fd00:77:1::2/64  <->  H p3ha<sfx> 10.77.1.1/24 fd00:77:1::1/64
#                           H p3hb<sfx> 10.77.2.1/24 fd00:77:2::1/64  <->  B p3b<sfx>  10.77.2.2/24 fd00:77:2::2/64
#                         IP forwarding is off in H (net.ipv4.ip_forward=0, net.ipv6.conf.all.forwarding=0, checked)
#                         and no host has a route beyond its own links, so A and B cannot reach each other. Each
#                         host gets a private mount namespace with a tmpfs on /run, its own `dbus-daemon --system`
#                         and its own avahi-daemon whose config names only that host's veths (A: p3a…, B: p3b…,
#                         H: p3ha…,p3hb…), IPv4 and IPv6, reflector off: mDNS never leaves the two links, and A's
#                         and B's announcements never meet. Writes DIR/on-host (DIR/on-host A|H|B CMD… runs CMD on
#                         that host, exec'ing it, so `setsid DIR/on-host A cmd &` leaves $! = cmd's PID). Exports
#                         MESH_NETNS3_RIG=DIR; MESH_NETNS3_{A,H,B}_NS; MESH_NETNS3_A_IF, _HA_IF, _HB_IF, _B_IF;
#                         MESH_NETNS3_A_ADDR, _HA_ADDR, _HB_ADDR, _B_ADDR and the same with ADDR6.
#   netns_rig3_stop DIR   stops every process in the three namespaces (by PID), then deletes them (and so the
#                         veths). Safe to call twice and after a failed start.
#   netns_rig3_on DIR A|H|B CMD…  runs CMD on a host (foreground; its exit status is CMD's).
#
# The names live in DIR/names3 (each written once the namespace or veth exists), the holders in DIR/{A,H,B}.holder:
# one DIR holds one rig. The two-host functions
# above are independent of these (a different DIR may hold a two-host rig at the same time; names never clash).

NETNS_RIG3_A_ADDR=10.77.1.2
NETNS_RIG3_HA_ADDR=10.77.1.1
NETNS_RIG3_HB_ADDR=10.77.2.1
NETNS_RIG3_B_ADDR=10.77.2.2
NETNS_RIG3_A_ADDR6=fd00:77:1::2
NETNS_RIG3_HA_ADDR6=fd00:77:1::1
NETNS_RIG3_HB_ADDR6=fd00:77:2::1
NETNS_RIG3_B_ADDR6=fd00:77:2::2

# netns_rig3__start_host DIR HOST NS IFACES — holder, dbus and avahi for one host of the line (IFACES: the
# host's veths, comma-separated, the only ones its avahi-daemon uses): the two-host rig's host start-up.
netns_rig3__start_host() {
  netns_rig__start_host "$1" "$2" "$3" "$4" ""
}

# netns_rig3_start DIR — see above.
netns_rig3_start() {
  local dir=${1:?usage: netns_rig3_start DIR}
  mkdir -p "$dir" || return 1
  dir=$(cd "$dir" && pwd)
  case $dir in /run|/run/*) netns_rig__log "DIR must not be under /run (each host mounts its own /run)"; return 1 ;; esac
  [[ -e $dir/names3 ]] && { netns_rig__log "$dir already holds a three-host rig (netns_rig3_stop it first)"; return 1; }
  local sfx
  sfx=$(netns_rig__b36 "$$")$(netns_rig__b36 $((RANDOM % 36)))$(netns_rig__b36 $((RANDOM % 36)))
  local nsA=pm3a$sfx nsH=pm3h$sfx nsB=pm3b$sfx ifA=p3a$sfx ifHA=p3ha$sfx ifHB=p3hb$sfx ifB=p3b$sfx names=$dir/names3
  # Each name is written down once its namespace or veth pair exists (netns_rig__note).
  : >"$names"

  if ! { ip netns add "$nsA" && netns_rig__note "$names" NS3_A "$nsA" &&
         ip netns add "$nsH" && netns_rig__note "$names" NS3_H "$nsH" &&
         ip netns add "$nsB" && netns_rig__note "$names" NS3_B "$nsB" &&
         ip link add "$ifA" type veth peer name "$ifHA" &&
         netns_rig__note "$names" IF3_A "$ifA" && netns_rig__note "$names" IF3_HA "$ifHA" &&
         ip link add "$ifHB" type veth peer name "$ifB" &&
         netns_rig__note "$names" IF3_HB "$ifHB" && netns_rig__note "$names" IF3_B "$ifB" &&
         ip link set "$ifA" netns "$nsA" && ip link set "$ifHA" netns "$nsH" &&
         ip link set "$ifHB" netns "$nsH" && ip link set "$ifB" netns "$nsB" &&
         ip netns exec "$nsH" sysctl -q -w net.ipv4.ip_forward=0 net.ipv6.conf.all.forwarding=0 &&
         ip -n "$nsA" addr add "$NETNS_RIG3_A_ADDR/24" dev "$ifA" &&
         ip -n "$nsH" addr add "$NETNS_RIG3_HA_ADDR/24" dev "$ifHA" &&
         ip -n "$nsH" addr add "$NETNS_RIG3_HB_ADDR/24" dev "$ifHB" &&
         ip -n "$nsB" addr add "$NETNS_RIG3_B_ADDR/24" dev "$ifB" &&
         ip -n "$nsA" addr add "$NETNS_RIG3_A_ADDR6/64" dev "$ifA" nodad &&
         ip -n "$nsH" addr add "$NETNS_RIG3_HA_ADDR6/64" dev "$ifHA" nodad &&
         ip -n "$nsH" addr add "$NETNS_RIG3_HB_ADDR6/64" dev "$ifHB" nodad &&
         ip -n "$nsB" addr add "$NETNS_RIG3_B_ADDR6/64" dev "$ifB" nodad &&
         ip -n "$nsA" link set lo up && ip -n "$nsH" link set lo up && ip -n "$nsB" link set lo up &&
         ip -n "$nsA" link set "$ifA" multicast on up && ip -n "$nsH" link set "$ifHA" multicast on up &&
         ip -n "$nsH" link set "$ifHB" multicast on up && ip -n "$nsB" link set "$ifB" multicast on up; }; then
    netns_rig__log "could not create the three namespaces and veth pairs"
    netns_rig3_stop "$dir"
    return 1
  fi
  # Forwarding must really be off in H: A and B meet only through what the session relays.
  local fwd4 fwd6
  fwd4=$(ip netns exec "$nsH" sysctl -n net.ipv4.ip_forward 2>/dev/null) || fwd4="?"
  fwd6=$(ip netns exec "$nsH" sysctl -n net.ipv6.conf.all.forwarding 2>/dev/null) || fwd6="?"
  if [[ $fwd4 != 0 || $fwd6 != 0 ]]; then
    netns_rig__log "host H forwards (ip_forward=$fwd4, ipv6 forwarding=$fwd6); refusing"
    netns_rig3_stop "$dir"
    return 1
  fi
  if ! netns_rig3__start_host "$dir" A "$nsA" "$ifA" ||
     ! netns_rig3__start_host "$dir" H "$nsH" "$ifHA,$ifHB" ||
     ! netns_rig3__start_host "$dir" B "$nsB" "$ifB"; then
    netns_rig3_stop "$dir"
    return 1
  fi
  cat >"$dir/on-host" <<ONHOST
#!/usr/bin/env bash
# on-host A|H|B CMD… — runs CMD on a host of the three-host rig in $dir (its network and mount namespaces).
case \${1:-} in A|H|B) ;; *) echo "usage: \$0 A|H|B CMD [ARGS…]" >&2; exit 2 ;; esac
((\$# > 1)) || { echo "usage: \$0 A|H|B CMD [ARGS…]" >&2; exit 2; }
holder=\$(cat '$dir'/"\$1".holder 2>/dev/null) && kill -0 "\$holder" 2>/dev/null ||
  { echo "on-host: host \$1 of the rig in $dir is not running" >&2; exit 2; }
shift
exec nsenter -t "\$holder" -m -n --wd="\$PWD" -- "\$@"
ONHOST
  chmod +x "$dir/on-host"
  export MESH_NETNS3_RIG=$dir MESH_NETNS3_A_NS=$nsA MESH_NETNS3_H_NS=$nsH MESH_NETNS3_B_NS=$nsB \
    MESH_NETNS3_A_IF=$ifA MESH_NETNS3_HA_IF=$ifHA MESH_NETNS3_HB_IF=$ifHB MESH_NETNS3_B_IF=$ifB \
    MESH_NETNS3_A_ADDR=$NETNS_RIG3_A_ADDR MESH_NETNS3_HA_ADDR=$NETNS_RIG3_HA_ADDR \
    MESH_NETNS3_HB_ADDR=$NETNS_RIG3_HB_ADDR MESH_NETNS3_B_ADDR=$NETNS_RIG3_B_ADDR \
    MESH_NETNS3_A_ADDR6=$NETNS_RIG3_A_ADDR6 MESH_NETNS3_HA_ADDR6=$NETNS_RIG3_HA_ADDR6 \
    MESH_NETNS3_HB_ADDR6=$NETNS_RIG3_HB_ADDR6 MESH_NETNS3_B_ADDR6=$NETNS_RIG3_B_ADDR6
  netns_rig__log "ready: A = $nsA ($NETNS_RIG3_A_ADDR on $ifA) — H = $nsH ($NETNS_RIG3_HA_ADDR on $ifHA," \
    "$NETNS_RIG3_HB_ADDR on $ifHB, not forwarding) — B = $nsB ($NETNS_RIG3_B_ADDR on $ifB)"
}

# netns_rig3_on DIR HOST CMD… — see above.
netns_rig3_on() {
  local dir=${1:?usage: netns_rig3_on DIR A|H|B CMD…} host=${2:?usage: netns_rig3_on DIR A|H|B CMD…}
  shift 2
  case $host in A|H|B) ;; *) netns_rig__log "netns_rig3_on: no host $host (A, H or B)"; return 2 ;; esac
  [[ -s $dir/$host.holder ]] || { netns_rig__log "netns_rig3_on: no three-host rig in $dir"; return 2; }
  netns_rig__in "$dir" "$host" "$@"
}

# netns_rig3_stop DIR — see above. (Safe under `set -euo pipefail`.)
netns_rig3_stop() {
  local dir=${1:?usage: netns_rig3_stop DIR} host ns pid f holders=" "
  [[ -r $dir/names3 ]] || return 0
  # Only the names this run created are in the file (a start that failed half-way wrote fewer).
  # shellcheck disable=SC2034  # names3 sets them all; only some are needed here
  local NS3_A="" NS3_H="" NS3_B="" IF3_A="" IF3_HA="" IF3_HB="" IF3_B=""
  # shellcheck disable=SC1091
  source "$dir/names3"
  for host in A H B; do
    for f in avahi.pid dbus.pid; do
      [[ -s $dir/$host.$f ]] && netns_rig__kill "$(cat "$dir/$host.$f")"
      rm -f "$dir/$host.$f"
    done
    [[ -s $dir/$host.holder ]] && holders+="$(cat "$dir/$host.holder") "
  done
  # Anything else still running on the hosts was started through this rig (the names are this run's own).
  for ns in "$NS3_A" "$NS3_H" "$NS3_B"; do
    [[ -n $ns ]] || continue
    netns_rig__ns_exists "$ns" || continue
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      [[ $holders == *" $pid "* ]] && continue
      netns_rig__kill "$pid"
    done
  done
  for host in A H B; do
    [[ -s $dir/$host.holder ]] && netns_rig__kill "$(cat "$dir/$host.holder")"
    rm -f "$dir/$host.holder"
  done
  for ns in "$NS3_A" "$NS3_H" "$NS3_B"; do
    [[ -n $ns ]] || continue
    netns_rig__ns_exists "$ns" && { ip netns del "$ns" || true; }
  done
  # A veth that never reached its namespace lives in the root namespace (deleting one end deletes its peer).
  for f in "$IF3_A" "$IF3_HB"; do
    [[ -n $f ]] || continue
    ip link show "$f" >/dev/null 2>&1 && { ip link del "$f" || true; }
  done
  rm -f "$dir/names3" "$dir/on-host"
  if [[ ${MESH_NETNS3_RIG:-} == "$dir" ]]; then
    unset MESH_NETNS3_RIG MESH_NETNS3_A_NS MESH_NETNS3_H_NS MESH_NETNS3_B_NS \
      MESH_NETNS3_A_IF MESH_NETNS3_HA_IF MESH_NETNS3_HB_IF MESH_NETNS3_B_IF \
      MESH_NETNS3_A_ADDR MESH_NETNS3_HA_ADDR MESH_NETNS3_HB_ADDR MESH_NETNS3_B_ADDR \
      MESH_NETNS3_A_ADDR6 MESH_NETNS3_HA_ADDR6 MESH_NETNS3_HB_ADDR6 MESH_NETNS3_B_ADDR6
  fi
  return 0
}
