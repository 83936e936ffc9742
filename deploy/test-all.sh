#!/usr/bin/env bash
# The one test command (README): installs and starts everything the tests need, runs every
# test, stops what it started. Safe to run on a fresh machine and again on a used one.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
started=$(date +%s)

echo "== tsl3 test-all: $(date -u +%FT%TZ)"

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

# >>> mooncake (deploy/mooncake/): a local master + independent storage owner for the live
# tests (actors/tests/mooncake_live.rs). Installed idempotently (cached in deploy/.mooncake/),
# stopped by PID on exit; MOONCAKE_REQUIRE_MASTER=1 makes a missing master a test failure.
echo "== mooncake: install and start"
# The default instance's rpc and owner ports sit below Linux's ephemeral range
# (32768-60999): Mooncake's usual 50051/50052 lie inside it, where any outgoing connection
# may hold one (a live test's master once lost its admin port there). The tests reach the
# instance through env.sh; a user's own start.sh keeps the usual ports.
export MOONCAKE_RPC_PORT="${MOONCAKE_RPC_PORT:-27051}"
export MOONCAKE_OWNER_PORT="${MOONCAKE_OWNER_PORT:-27052}"
bash deploy/mooncake/install.sh
bash deploy/mooncake/start.sh
trap 'bash deploy/mooncake/stop.sh || true' EXIT
# shellcheck source=mooncake/env.sh
. deploy/mooncake/env.sh
export MOONCAKE_REQUIRE_MASTER=1
# The fault matrix (tests/faults.rs) mounts small tmpfs instances (disk full, read-only).
export TSL3_REQUIRE_MOUNT=1
# <<< mooncake

echo "== cargo test"
cargo test --workspace --no-fail-fast 2>&1 | tee /tmp/tsl3-cargo-test.log
# Every check below runs this one build (the binary cargo test built for the integration
# tests: same features and profile), never a second one (deploy/checks/tools.sh).
export ENGINE_HOST_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug/engine-host"

# --- observability checks (dashboards) ---
# Offline checks of dashboards/ and deploy/observability/ (deploy/checks/run.sh; it installs
# promtool (unpacked from the Debian package into deploy/.prometheus/, not installed) and the
# grafana-foundation-sdk venv deploy/.venv-checks on first use and starts no service): SDK
# round trip, promtool check rules on every query, metric names against names.rs and a
# fixture exposition, panel semantics, and self-tests on broken inputs.
# Then a live engine host (deploy/checks/live_engine.sh, < 20 s): `engine-host serve --store
# local` on a free loopback port, a few completions (one repeated), then
# `check_live_metrics http://127.0.0.1:PORT/metrics` and `promtool check metrics` on the
# scrape; SIGTERM must stop it with exit 0. Then every dashboard query against a real
# Prometheus (deploy/checks/prometheus_live.sh, < 60 s): the unpacked prometheus binary on a
# free loopback port scraping a `launch --tp 2` replica and a single host under a short load;
# each query valid and non-zero unless listed as may-be-zero, TP ranks 0 and 1 up and
# labelled; everything it started is stopped.
echo "== observability checks (dashboards)"
# shellcheck source=deploy/checks/live.sh
source "$ROOT/deploy/checks/live.sh"
bash "$ROOT/deploy/checks/run.sh"
echo "== observability: live engine host metrics"
bash "$ROOT/deploy/checks/live_engine.sh"
echo "== observability: dashboard queries against Prometheus scraping live engine hosts"
bash "$ROOT/deploy/checks/prometheus_live.sh"
# --- end observability checks ---

# The OpenAI API through the `openai` Python package (deploy/checks/openai_client.sh; a venv
# deploy/.venv-openai with a pinned openai on first use): a live `engine-host serve --store
# local` on a free loopback port answers models, completions and chat calls (batch, n, stop,
# seeds, logprobs, echo, streaming with usage) and the client's error types: once on the
# synthetic `tiny` model, once on a real model (the transformer backend over a random
# Llama-format checkpoint `engine-host model init-random` writes).
echo "== openai client (synthetic model)"
bash deploy/checks/openai_client.sh
echo "== openai client (a model directory: the transformer backend)"
model_dir=$(mktemp -d)
"$ENGINE_HOST_BIN" model init-random "$model_dir/random-llama" --seed 2
bash deploy/checks/openai_client.sh -- --model-dir "$model_dir/random-llama"
rm -rf "$model_dir"

# The closing line: every cargo test that passed (a failure stops the script earlier).
total=$(grep -Eo 'test result: ok\. [0-9]+ passed' /tmp/tsl3-cargo-test.log | awk '{s+=$4} END {print s+0}')
elapsed=$(($(date +%s) - started))
echo "test-all: ${total} passed, 0 failed in $((elapsed / 60)) min $((elapsed % 60)) s"
