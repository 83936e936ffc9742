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
# The address every master and owner socket is asked to listen on (and the transfer
# engine advertises): loopback unless set.
MOONCAKE_BIND="${MOONCAKE_BIND:-127.0.0.1}"
# How the owner and the clients find each other: http (the master's HTTP metadata server on
# MOONCAKE_HTTP_PORT) or p2p (P2PHANDSHAKE: no metadata server at all).
MOONCAKE_METADATA="${MOONCAKE_METADATA:-http}"
case "$MOONCAKE_METADATA" in
  http) MOONCAKE_METADATA_SERVER_URL="http://$MOONCAKE_BIND:$MOONCAKE_HTTP_PORT/metadata" ;;
  p2p) MOONCAKE_METADATA_SERVER_URL="P2PHANDSHAKE" ;;
  *) echo "mooncake: MOONCAKE_METADATA must be http or p2p (got $MOONCAKE_METADATA)" >&2; return 2 2>/dev/null || exit 2 ;;
esac
mc_file() { echo "$MOONCAKE_STATE/$MOONCAKE_INSTANCE-$1"; }
mc_paths() {
  if [ ! -f "$MOONCAKE_STATE/paths.env" ]; then
    echo "mooncake: $MOONCAKE_STATE/paths.env missing: run deploy/mooncake/install.sh first" >&2
    return 1
  fi
  # shellcheck disable=SC1091
  . "$MOONCAKE_STATE/paths.env"
}
# The listening TCP sockets (address:port, one a line) of a PID, where `ss` is available.
mc_listeners() {
  command -v ss >/dev/null 2>&1 || return 0
  ss -Htlnp 2>/dev/null | awk -v p="pid=$1," 'index($0, p) { print $4 }'
}
# Whether the PID in a pid file is alive and is one of ours (guards against PID reuse).
mc_alive() {
  local f; f="$(mc_file "$1.pid")"
  [ -f "$f" ] || return 1
  local pid; pid="$(cat "$f")"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && grep -q mooncake "/proc/$pid/cmdline" 2>/dev/null
}
