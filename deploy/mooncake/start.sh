#!/usr/bin/env bash
# Starts a local Mooncake master and an independent storage owner on MOONCAKE_BIND (default
# loopback), and waits until the master reports service_ready and a non-zero Mem Storage
# capacity (the owner's segment is mounted). Idempotent: a part already running is left
# alone. Then it names every socket a part listens on beyond MOONCAKE_BIND: Mooncake
# 0.3.13's HTTP metadata server binds every interface whatever --http_metadata_server_host
# says (MOONCAKE_METADATA=p2p runs without it), and the owner's transfer engine opens
# data sockets on every interface.
#   start.sh [all|master|owner|ready]   (default all; ready: only wait for readiness)
# Environment (see common.sh): MOONCAKE_INSTANCE, MOONCAKE_BIND, MOONCAKE_METADATA,
# MOONCAKE_RPC_PORT, MOONCAKE_HTTP_PORT, MOONCAKE_METRICS_PORT, MOONCAKE_OWNER_PORT,
# MOONCAKE_SEGMENT_SIZE, MOONCAKE_LEASE_TTL_MS, MOONCAKE_MASTER_EXTRA_ARGS. PIDs: deploy/.mooncake/<instance>-{master,owner}.pid; logs
# beside them (*.log).
set -euo pipefail
# shellcheck source=common.sh
. "$(dirname "$0")/common.sh"
mc_paths
WHAT="${1:-all}"
export MC_TCP_BIND_ADDRESS="$MOONCAKE_BIND"
mkdir -p "$MOONCAKE_STATE"
METRICS="http://$MOONCAKE_BIND:$MOONCAKE_METRICS_PORT"

fail() {
  echo "mooncake start ($MOONCAKE_INSTANCE): $*" >&2
  for part in master owner; do
    [ -f "$(mc_file "$part.log")" ] && { echo "--- $part log tail" >&2; tail -n 20 "$(mc_file "$part.log")" >&2; }
  done
  exit 1
}

# Polls a condition for up to $2 tenths of a second while part $1's process lives.
wait_for() {
  local part="$1" tenths="$2"; shift 2
  for _ in $(seq "$tenths"); do
    if "$@"; then return 0; fi
    # Look twice before calling it dead: while the process execs, /proc/PID/cmdline can
    # read empty for a moment (seen under load), which mc_alive would take for an exit.
    mc_alive "$part" || { sleep 0.3; mc_alive "$part"; } || fail "the $part exited during startup"
    sleep 0.1
  done
  return 1
}
master_ready() { curl -fsS --max-time 1 "$METRICS/health" 2>/dev/null | grep -q '"service_ready":true'; }
# The summary reads "Mem Storage: <used> / <capacity>"; a mounted segment makes capacity non-zero.
capacity_ready() {
  curl -fsS --max-time 1 "$METRICS/metrics/summary" 2>/dev/null \
    | grep -o 'Mem Storage: [^|]*' | grep -vq '/ 0 B'
}

# Names the sockets part $1 listens on beyond MOONCAKE_BIND (why: $2).
report_wide_listeners() {
  local part="$1" why="$2" pid wide
  pid="$(cat "$(mc_file "$part.pid")")"
  wide="$(mc_listeners "$pid" | grep -vF -e "$MOONCAKE_BIND:" -e "[::ffff:$MOONCAKE_BIND]:" | tr '\n' ' ' || true)"
  [ -z "$wide" ] || echo "mooncake $part ($MOONCAKE_INSTANCE): also listens on ${wide% } beyond MOONCAKE_BIND=$MOONCAKE_BIND ($why)" >&2
}

start_master() {
  if mc_alive master; then echo "mooncake master ($MOONCAKE_INSTANCE) already running" >&2; return; fi
  local metadata=()
  [ "$MOONCAKE_METADATA" = http ] && metadata=(--enable_http_metadata_server=true \
    --http_metadata_server_host="$MOONCAKE_BIND" --http_metadata_server_port="$MOONCAKE_HTTP_PORT")
  # shellcheck disable=SC2086
  nohup "$MOONCAKE_MASTER_BIN" \
    --rpc_address="$MOONCAKE_BIND" --rpc_port="$MOONCAKE_RPC_PORT" "${metadata[@]}" \
    --metrics_host="$MOONCAKE_BIND" --metrics_port="$MOONCAKE_METRICS_PORT" \
    --default_kv_lease_ttl="$MOONCAKE_LEASE_TTL_MS" ${MOONCAKE_MASTER_EXTRA_ARGS:-} \
    >"$(mc_file master.log)" 2>&1 </dev/null &
  echo $! >"$(mc_file master.pid)"
  wait_for master 300 master_ready || fail "master did not report service_ready on $METRICS/health"
  echo "mooncake master ($MOONCAKE_INSTANCE) ready: rpc $MOONCAKE_BIND:$MOONCAKE_RPC_PORT, metadata $MOONCAKE_METADATA_SERVER_URL, pid $(cat "$(mc_file master.pid)")" >&2
  report_wide_listeners master "Mooncake 0.3.13's HTTP metadata server ignores --http_metadata_server_host; MOONCAKE_METADATA=p2p runs without it"
}

start_owner() {
  if mc_alive owner; then echo "mooncake owner ($MOONCAKE_INSTANCE) already running" >&2; return; fi
  master_ready || fail "the master is not ready; start it first"
  nohup "$MOONCAKE_OWNER_BIN" --host="$MOONCAKE_BIND" --port="$MOONCAKE_OWNER_PORT" --protocol=tcp \
    --global_segment_size="$MOONCAKE_SEGMENT_SIZE" \
    --master_server_address="$MOONCAKE_BIND:$MOONCAKE_RPC_PORT" \
    --metadata_server="$MOONCAKE_METADATA_SERVER_URL" \
    >"$(mc_file owner.log)" 2>&1 </dev/null &
  echo $! >"$(mc_file owner.pid)"
  wait_for owner 600 capacity_ready || fail "the owner's segment did not show up in $METRICS/metrics/summary"
  echo "mooncake owner ($MOONCAKE_INSTANCE) mounted $MOONCAKE_SEGMENT_SIZE: pid $(cat "$(mc_file owner.pid)")" >&2
  report_wide_listeners owner "the transfer engine's data sockets; Mooncake 0.3.13 has no flag for their address"
}

# Waits until the master serves and a segment is mounted (after a master restart, the
# running owner remounts on its own).
wait_ready() {
  wait_for master 300 master_ready || fail "master not ready"
  wait_for owner 600 capacity_ready || fail "no mounted segment on $METRICS/metrics/summary"
}

case "$WHAT" in
  all) start_master; start_owner ;;
  ready) wait_ready ;;
  master) start_master ;;
  owner) start_owner ;;
  *) fail "usage: start.sh [all|master|owner|ready]" ;;
esac
