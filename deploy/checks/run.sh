#!/usr/bin/env bash
# Every offline dashboard/observability check, fast (< 60 s once installed): installs its
# tools (setup.sh), then the SDK round trip, PromQL parse, metric names, panel semantics,
# the Prometheus config generator, and the self-tests on broken inputs. Starts no service.
set -euo pipefail
cd "$(dirname "$0")/../.."

bash deploy/checks/setup.sh
# shellcheck source=deploy/checks/tools.sh
source deploy/checks/tools.sh
PY=deploy/.venv-checks/bin/python

echo "-- (a) dashboards round-trip through grafana-foundation-sdk"
"$PY" deploy/checks/check_dashboards.py
echo "-- (b) dashboard queries parse (promtool check rules)"
"$PY" deploy/checks/check_promql.py
echo "-- (c) metrics used: declared in names.rs; present in the fixture exposition"
"$PY" deploy/checks/check_metrics_used.py --declared actors/src/names.rs
"$PY" deploy/checks/check_metrics_used.py deploy/checks/fixtures/engine-host-metrics.txt
echo "-- panel semantics on 2 DP x 2 TP series (promtool test rules)"
"$PY" deploy/checks/test_panel_semantics.py

echo "-- Prometheus config generator"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
deploy/observability/gen-prometheus.sh 2 >"$tmp/p2.yml"
diff -u deploy/observability/prometheus.yml "$tmp/p2.yml" \
  || { echo "FAIL prometheus.yml differs from gen-prometheus.sh 2 (regenerate it)"; exit 1; }
promtool check config deploy/observability/prometheus.yml >/dev/null
deploy/observability/gen-prometheus.sh 8 9100 10.0.0.5 >"$tmp/p8.yml"
promtool check config "$tmp/p8.yml" >/dev/null
[ "$(grep -c '"10.0.0.5:91[0-9][0-9]"' "$tmp/p8.yml")" = 8 ] && grep -q '"10.0.0.5:9107"' "$tmp/p8.yml" \
  || { echo "FAIL gen-prometheus.sh 8 9100 does not list ports 9100..9107"; exit 1; }
if deploy/observability/gen-prometheus.sh 0 >/dev/null 2>&1; then
  echo "FAIL gen-prometheus.sh accepted N=0"; exit 1
fi
echo "ok   prometheus.yml = gen-prometheus.sh 2; configs for 2 and 8 ranks pass promtool check config"

echo "-- (d) self-tests: each check fails on a broken input"
"$PY" deploy/checks/selftest.py
