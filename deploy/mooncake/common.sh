# Shared by start.sh, stop.sh and env.sh (sourced, not run): one named instance of a local
# Mooncake master + independent storage owner, with its ports, PID and log files under
# deploy/.mooncake/. The default instance uses the standard ports; tests start others
# (MOONCAKE_INSTANCE plus their own ports) so that they never disturb the shared one.
MOONCAKE_DEPLOY="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MOONCAKE_ROOT="$(cd "$MOONCAKE_DEPLOY/../.." && pwd)"
MOONCAKE_STATE="${MOONCAKE_STATE_DIR:-$MOONCAKE_ROOT/deploy/.mooncake}"
MOONCAKE_INSTANCE="${MOONCAKE_INSTANCE:-default}"
MOONCAKE_RPC_PORT="${MOONCAKE_RPC_PORT:-50051}"
MOONCAKE_HTTP_PORT="${MOONCAKE_HTTP_PORT:-8080}"
MOONCAKE_METRICS_PORT="${MOONCAKE_METRICS_PORT:-9003}"
MOONCAKE_OWNER_PORT="${MOONCAKE_OWNER_PORT:-50052}"
MOONCAKE_SEGMENT_SIZE="${MOONCAKE_SEGMENT_SIZE:-1GB}"
MOONCAKE_LEASE_TTL_MS="${MOONCAKE_LEASE_TTL_MS:-5000}"
mc_file() { echo "$MOONCAKE_STATE/$MOONCAKE_INSTANCE-$1"; }
mc_paths() {
  if [ ! -f "$MOONCAKE_STATE/paths.env" ]; then
    echo "mooncake: $MOONCAKE_STATE/paths.env missing: run deploy/mooncake/install.sh first" >&2
    return 1
  fi
  # shellcheck disable=SC1091
  . "$MOONCAKE_STATE/paths.env"
}
# Whether the PID in a pid file is alive and is one of ours (guards against PID reuse).
mc_alive() {
  local f; f="$(mc_file "$1.pid")"
  [ -f "$f" ] || return 1
  local pid; pid="$(cat "$f")"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && grep -q mooncake "/proc/$pid/cmdline" 2>/dev/null
}
