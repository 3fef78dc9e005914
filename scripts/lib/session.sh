# session.sh — the processes of a session a script started itself (setsid), found by their session id in /proc,
# never by name: another run on the machine may run the same programs.
#
#   session_pids SID            the PIDs of the live processes of session SID (zombies are already gone)
#   session_signal SIGNAL SID   sends SIGNAL to each of them but this shell ($$); returns 1 when none is left

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
