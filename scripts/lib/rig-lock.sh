# shellcheck shell=bash
# rig-lock.sh — one PeerMesh run at a time on this machine's shared test rig.
#
# The loopback Avahi rig (avahi-rig.sh) exists once per machine: the system bus socket /run/dbus/system_bus_socket
# and /run/avahi-daemon/pid are fixed paths, so two runs would share one daemon, and the run that started it would
# stop it while the other still used it. So every script that starts that rig (scripts/test, scripts/demo,
# scripts/bench, scripts/avahi-up, scripts/orderfile), and scripts/test-package (it installs the package machine-wide),
# sources this file and calls rig_lock_take before it sets anything up:
#
#   rig_lock_take NAME   takes an exclusive flock on /run/lock/peermesh-rig.lock on file descriptor 9, held until the
#                        script exits. When another run holds it, says so on stderr and waits, at most
#                        PEERMESH_RIG_LOCK_WAIT seconds (default 7200); then returns 1 with a message.
#
# Re-entrant: a script started by one that holds the lock (scripts/test runs scripts/bench and scripts/test-package)
# inherits descriptor 9, the same open file, and flock on it succeeds at once. It never unlocks (that would unlock
# its parent's lock too); the lock goes when the last descriptor of the open file closes.
# Daemons must not inherit descriptor 9, or one left running would hold the lock for ever: the rigs start theirs with
# 9>&- (jack-rig.sh, avahi-rig.sh, netns-rig.sh), and the scripts close it for every process they start in the
# background.

RIG_LOCK_FILE=/run/lock/peermesh-rig.lock

# rig_lock_take NAME — see above.
rig_lock_take() {
  local who=${1:-peermesh} wait=${PEERMESH_RIG_LOCK_WAIT:-7200}
  [[ $wait =~ ^[0-9]+$ ]] || { echo "$who: PEERMESH_RIG_LOCK_WAIT must be whole seconds, not \"$wait\"" >&2; return 1; }
  # Held by the script that started this one: descriptor 9 is its open file of the lock.
  if [[ -e /proc/$$/fd/9 && /proc/$$/fd/9 -ef $RIG_LOCK_FILE ]] && flock -n 9; then
    return 0
  fi
  mkdir -p "${RIG_LOCK_FILE%/*}" 2>/dev/null
  if ! exec 9>>"$RIG_LOCK_FILE"; then
    echo "$who: cannot open $RIG_LOCK_FILE (run as root)" >&2
    return 1
  fi
  if ! flock -n 9; then
    echo "$who: another PeerMesh run holds the test rig ($(cat "$RIG_LOCK_FILE" 2>/dev/null || true)); waiting" \
      "(at most $wait s; lock: $RIG_LOCK_FILE)" >&2
    local deadline=$((SECONDS + wait))
    # Polled, not `flock -w`: a signal to this script is then handled within a second.
    until flock -n 9; do
      if ((SECONDS >= deadline)); then
        echo "$who: the test rig is still held after $wait s; giving up" >&2
        exec 9>&-
        return 1
      fi
      sleep 1
    done
    echo "$who: got the test rig" >&2
  fi
  # Who holds it, for the message of a run that waits (the lock is on the file, not on its contents).
  echo "pid $$, $who, since $(date '+%F %T')" >"$RIG_LOCK_FILE" 2>/dev/null || true
}
