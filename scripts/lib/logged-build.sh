# logged-build.sh — a build whose output is kept aside (sourced by scripts/fuzz and scripts/lib/ship-build.sh).
#
#   logged_build WHAT COMMAND…   runs COMMAND with its output in a temporary file. On success prints SwiftPM's last
#                                "Build…" line; on failure "WHAT failed" and the output's last 40 lines (progress lines
#                                and pkg-config's harmless flag warning left out). Returns COMMAND's status.
logged_build() {
  local what=$1 log rc=0
  shift
  log=$(mktemp /tmp/pmbuild.XXXXXX)
  "$@" >"$log" 2>&1 || rc=$?
  if ((rc == 0)); then
    grep -E '^Build' "$log" | tail -n 1 >&2 || true
  else
    echo "$what failed; its last lines:" >&2
    sed '/prohibited flag/d; /^\[[0-9]*\/[0-9]*\]/d' "$log" | tail -n 40 >&2 || true
  fi
  rm -f "$log"
  return "$rc"
}
