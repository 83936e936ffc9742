#!/usr/bin/env bash
# Every dashboard query against a real Prometheus (issue 20, scope 2): the Prometheus binary
# deploy/checks/setup.sh unpacked (no service) on a free loopback port with a temporary data
# dir, scraping every second what gen-prometheus.sh generates for an `engine-host launch
# --tp 2` replica plus a single `engine-host serve` host (embedded local stores, emulated
# device, temporary dirs). After a short load on both (miss, Device, Host and L3 hits) every
# query of dashboards/*.json must be valid, non-zero unless listed in MAY_BE_ZERO of
# deploy/checks/prometheus_live.py, and ranks 0 and 1 must be up and tp_rank-labelled.
# Stops everything it started, on success and failure. Runs the engine host the test command
# built (deploy/checks/tools.sh). Needs deploy/checks/setup.sh to have run (run.sh does).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=deploy/checks/tools.sh
source deploy/checks/tools.sh
engine_host_bin
command -v prometheus >/dev/null || { echo "FAIL no prometheus binary: run deploy/checks/setup.sh"; exit 1; }
exec python3 deploy/checks/prometheus_live.py "$ENGINE_HOST"
