#!/usr/bin/env bash
# The OpenAI API against a real client (issue 17 item 5): starts `engine-host serve --store
# local` (the synthetic `tiny` model unless extra serve arguments say otherwise) on a free
# loopback port with a temporary store dir, and runs deploy/checks/openai_client.py with the
# `openai` Python package (pinned; a venv at deploy/.venv-openai created on first use):
# models, completions (text, token ids, batch, n, stop, seeds, logprobs, echo, streaming with
# usage), chat (plain, streaming, n, logprobs) and the errors a client sees. One line per
# check; any failure exits non-zero. Stops the engine host with SIGTERM and requires exit 0.
# Leaves nothing running. Runs $ENGINE_HOST_BIN (deploy/test-all.sh sets it; alone, the
# check builds it once, deploy/checks/tools.sh).
#
#   bash deploy/checks/openai_client.sh [-- EXTRA SERVE ARGUMENTS...]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
# shellcheck source=deploy/checks/tools.sh
source "$ROOT/deploy/checks/tools.sh"

if [ "${1:-}" = "--" ]; then shift; fi
extra=("$@")

OPENAI_VERSION=1.109.1
VENV=deploy/.venv-openai
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
if ! "$VENV/bin/python" -c "import sys, importlib.metadata as m, openai
sys.exit(m.version('openai') != sys.argv[1])" "$OPENAI_VERSION" >/dev/null 2>&1; then
  echo "== creating $VENV with openai==$OPENAI_VERSION"
  if ! python3 -m venv "$VENV" 2>/dev/null; then
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq python3-venv
    python3 -m venv "$VENV"
  fi
  "$VENV/bin/pip" install -q --disable-pip-version-check "openai==$OPENAI_VERSION"
fi
PY="$ROOT/$VENV/bin/python"

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
TSL3_MODEL__EMULATE_DEVICE_TIME=false TSL3_MODEL__DEVICE=emulated RUST_LOG=warn \
  "$BIN" serve --store local --store-dir "$work/store" --listen "127.0.0.1:$port" \
  ${extra[@]+"${extra[@]}"} >"$work/engine.log" 2>&1 &
pid=$!

healthy=
for _ in $(seq 600); do
  kill -0 "$pid" 2>/dev/null || { cat "$work/engine.log"; echo "FAIL engine host exited during startup"; exit 1; }
  if "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
    "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
    healthy=1
    break
  fi
  sleep 0.1
done
[ -n "$healthy" ] || { cat "$work/engine.log"; echo "FAIL engine host never became healthy"; exit 1; }

rc=0
"$PY" "$ROOT/deploy/checks/openai_client.py" "http://127.0.0.1:$port/v1" || rc=$?

kill -TERM "$pid"
status=0
wait "$pid" || status=$?
pid=
if [ "$status" != 0 ]; then
  tail -n 40 "$work/engine.log"
  echo "FAIL engine host exited with $status after SIGTERM"
  exit 1
fi
if [ "$rc" != 0 ]; then
  tail -n 40 "$work/engine.log"
  echo "FAIL openai client checks"
  exit "$rc"
fi
echo "ok openai client: every check passed; the engine host stopped cleanly"
