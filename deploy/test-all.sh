#!/usr/bin/env bash
# The one test command (README): installs and starts everything the tests need, runs every
# test, stops what it started. Safe to run on a fresh machine and again on a used one.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

echo "== tsl3 test-all: $(date -u +%FT%TZ)"

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

echo "== cargo test"
cargo test --workspace --no-fail-fast 2>&1 | tee /tmp/tsl3-cargo-test.log
