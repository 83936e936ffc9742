#!/usr/bin/env bash
# Live metrics check (issue 9 item 4): starts `engine-host serve --store local` on a free
# loopback port with a temporary store dir, runs a short workload (completions including a
# repeated prompt), then checks the scrape: check_live_metrics (every metric and label the
# dashboards use, promtool lint), `promtool check metrics`, no object keys, and the repeated
# prompt counted as a Device hit. Stops the engine host with SIGTERM and requires exit 0.
# Needs deploy/checks/setup.sh to have run (run.sh does). Leaves nothing running. Runs the
# engine host the test command built ($ENGINE_HOST_BIN; deploy/checks/tools.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
# shellcheck source=deploy/checks/live.sh
source "$ROOT/deploy/checks/live.sh"
PY="$ROOT/deploy/.venv-checks/bin/python"

command -v curl >/dev/null 2>&1 || {
  as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq curl
}
# The engine host `cargo test --workspace` built (deploy/checks/tools.sh): no second build.
engine_host_bin
BIN=$ENGINE_HOST

work=$(mktemp -d)
pid=
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
base="http://127.0.0.1:$port"
TSL3_MODEL__EMULATE_DEVICE_TIME=false TSL3_MODEL__DEVICE=emulated RUST_LOG=warn \
  "$BIN" serve --store local --store-dir "$work/store" --listen "127.0.0.1:$port" \
  >"$work/engine.log" 2>&1 &
pid=$!

for _ in $(seq 300); do
  kill -0 "$pid" 2>/dev/null || { cat "$work/engine.log"; echo "FAIL engine host exited during startup"; exit 1; }
  curl -sf "$base/health" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -sf "$base/health" >/dev/null || { cat "$work/engine.log"; echo "FAIL engine host never became healthy"; exit 1; }

complete() {
  curl -sf -X POST -H 'content-type: application/json' \
    -d "{\"prompt\":[$1],\"max_tokens\":4}" "$base/v1/completions"
}
repeated=$(seq -s, 1 40)
complete "$repeated" >"$work/r1.json"
complete "$repeated" >"$work/r2.json"
complete "$(seq -s, 500 530)" >"$work/r3.json"
grep -q '"fallback_reason":"miss"' "$work/r1.json" || { cat "$work/r1.json"; echo "FAIL first prompt not a miss"; exit 1; }
grep -Eq '"device":[1-9]' "$work/r2.json" || { cat "$work/r2.json"; echo "FAIL repeated prompt reused no Device tokens"; exit 1; }

# Snapshots are exported at most once a second: poll until the workload shows.
for _ in $(seq 50); do
  curl -sf "$base/metrics" >"$work/metrics.txt"
  grep -Eq '^tsl3_prefix_tokens_total\{[^}]*tier="device"[^}]*\} [1-9]' "$work/metrics.txt" && break
  sleep 0.2
done
grep -Eq '^tsl3_prefix_tokens_total\{[^}]*tier="device"[^}]*\} [1-9]' "$work/metrics.txt" \
  || { echo "FAIL tsl3_prefix_tokens_total{tier=\"device\"} never positive"; exit 1; }
check_live_metrics "$base/metrics"
promtool check metrics <"$work/metrics.txt" || { echo "FAIL promtool check metrics"; exit 1; }
if grep -v '^#' "$work/metrics.txt" | grep -Eq 'tsl3-|request_id|cmpl-'; then
  echo "FAIL an object key or request id in /metrics"; exit 1
fi
echo "ok   live engine host /metrics: $(grep -vc '^#' "$work/metrics.txt") samples, promtool clean, no keys"

kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=
[ "$rc" = 0 ] || { cat "$work/engine.log"; echo "FAIL engine host exited $rc after SIGTERM"; exit 1; }
echo "ok   engine host stopped by SIGTERM with exit 0"
