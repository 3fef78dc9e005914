# session.sh — the processes of a session a script started itself (setsid), found by their session id in /proc,
# never by name: another run on the machine may run the same programs.
#
#   session_pids SID            the PIDs of the live processes of session SID (zombies are already gone)
#   session_signal SIGNAL SID   sends SIGNAL to each of them but this shell ($$); returns 1 when none is left
#   own_session SIDFILE CMD…    runs CMD in a new session (setsid), its id written to SIDFILE, and returns CMD's
#                               status. The session's first process watches this shell: if it is gone (killed from
#                               outside, where no trap runs), it kills the whole session. Run it in the background
#                               and `wait` for it, so that a signal this shell traps is handled at once (bash runs a
#                               trap only between foreground commands; `wait` returns when one comes). With
#                               OWN_SESSION_NICE set, the session's scheduler autogroup gets that nice value.
#   end_session SIDFILE SIGNAL SECONDS
#                               sends SIGNAL to every process of that session, waits up to SECONDS for them to end,
#                               and kills what is left
# A session reaches every process a command starts, SwiftPM's compile jobs and xctest among them (each of those has a
# process group of its own).

session_pids() {
  local sid=$1 stat line fields
  for stat in /proc/[0-9]*/stat; do
    read -r line 2>/dev/null <"$stat" || continue
    # After the command name, which may hold spaces and parentheses: state ppid pgrp session …
    read -r -a fields <<<"${line##*) }"
    [[ ${fields[3]:-} == "$sid" && ${fields[0]} != Z ]] || continue
    stat=${stat#/proc/}
    echo "${stat%/stat}"
  done
}

session_signal() {
  local signal=$1 pids
  pids=$(session_pids "$2" | grep -vx -e "$$")
  [[ -n $pids ]] || return 1
  # shellcheck disable=SC2086 # one PID a word
  kill "-$signal" $pids 2>/dev/null
  return 0
}

own_session() {
  local sidfile=$1
  shift
  # shellcheck disable=SC2016 # expanded by the inner bash
  setsid --wait bash -c '
    echo "$$" >"$1"
    [[ -n ${OWN_SESSION_NICE:-} ]] && echo "$OWN_SESSION_NICE" 2>/dev/null >"/proc/$$/autogroup"
    source scripts/lib/session.sh
    watched=$2
    shift 2
    "$@" &
    child=$!
    while :; do
      sleep 1 &
      tick=$!
      wait -n -p ended "$child" "$tick"
      rc=$?
      if [[ $ended == "$child" ]]; then kill "$tick" 2>/dev/null; exit "$rc"; fi
      kill -0 "$watched" 2>/dev/null || { session_signal KILL "$$"; exit 1; }
    done' own-session "$sidfile" "$$" "$@"
}

end_session() {
  local sid signal=$2 tries=$(($3 * 5))
  sid=$(cat "$1" 2>/dev/null) || return 0
  [[ -n $sid ]] || return 0
  session_signal "$signal" "$sid" || return 0
  for ((; tries > 0; tries--)); do
    [[ -n $(session_pids "$sid") ]] || return 0
    sleep 0.2
  done
  session_signal KILL "$sid" || true
}
