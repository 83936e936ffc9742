#!/usr/bin/env bash
# Stops what start.sh started, by PID (never by name).
#   stop.sh [all|master|owner]        (default all; owner first)
# MOONCAKE_INSTANCE selects the instance; MOONCAKE_STOP_SIGNAL=KILL kills without a grace
# period (the live tests' "storage owner killed mid-run").
set -euo pipefail
# shellcheck source=common.sh
. "$(dirname "$0")/common.sh"
WHAT="${1:-all}"
SIG="${MOONCAKE_STOP_SIGNAL:-TERM}"

stop_part() {
  local part="$1" f; f="$(mc_file "$part.pid")"
  if ! mc_alive "$part"; then rm -f "$f"; return; fi
  local pid; pid="$(cat "$f")"
  kill -s "$SIG" "$pid" 2>/dev/null || true
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then kill -s KILL "$pid" 2>/dev/null || true; fi
  rm -f "$f"
  echo "mooncake $part ($MOONCAKE_INSTANCE) stopped: pid $pid" >&2
}

case "$WHAT" in
  all) stop_part owner; stop_part master ;;
  master) stop_part master ;;
  owner) stop_part owner ;;
  *) echo "usage: stop.sh [all|master|owner]" >&2; exit 2 ;;
esac
