# child-ledger.sh — ends the test children a dead test process left running (sourced by scripts/test).
#
# MeshTestSupport.ChildLedger writes one line per child a test starts into $PEERMESH_TEST_CHILDREN: its PID and
# its start time (field 22 of /proc/PID/stat). A child is normally ended by the test that started it; when the
# test process dies first (a crash, a timeout), its children would live on. child_ledger_reap ends those still
# running, by PID, and only if the PID's start time is the one written down: a PID reused since is someone else's.

# child_ledger_start_time PID: prints PID's start time in clock ticks since boot (nothing if it is gone, or
# a zombie: dead already, waiting for its parent to reap it).
child_ledger_start_time() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  # After "PID (comm) " the fields start at field 3 (the state); comm may hold spaces and parentheses.
  stat=${stat##*) }
  set -- $stat
  [ "${1:-}" = Z ] || echo "${20:-}"
}

# child_ledger_reap FILE: SIGKILLs the children in FILE that still run; says on stderr which, and returns 0.
child_ledger_reap() {
  local ledger=$1 pid start ended=()
  [ -s "$ledger" ] || return 0
  while read -r pid start; do
    [[ $pid =~ ^[0-9]+$ ]] || continue
    [ "$(child_ledger_start_time "$pid")" = "$start" ] || continue
    kill -KILL "$pid" 2>/dev/null && ended+=("$pid")
  done <"$ledger"
  if [ ${#ended[@]} -gt 0 ]; then
    echo "scripts/test: ended ${#ended[@]} test child process(es) left running by a test process that died: ${ended[*]}" >&2
  fi
  return 0
}
