#!/usr/bin/env bash
# Installs what the dashboard checks need, idempotently: promtool and the prometheus binary
# (unpacked from Debian's `prometheus` package into deploy/.prometheus/, not installed: no
# service) and a venv at deploy/.venv-checks with the pinned grafana-foundation-sdk.
# Starts nothing and leaves nothing running.
set -euo pipefail
cd "$(dirname "$0")/../.."

# Verified: from_json -> to_json drops unknown keys down to options/fieldConfig/targets.
SDK_VERSION='1769699998!10.1.0'
SDK_PIN="grafana-foundation-sdk==$SDK_VERSION"
VENV=deploy/.venv-checks

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# promtool and the Prometheus server binary (deploy/checks/prometheus_live.sh) come from
# Debian's `prometheus` package, downloaded and unpacked into deploy/.prometheus/
# (gitignored) with `apt-get download` + `dpkg -x`: nothing is installed, so no Prometheus
# service is enabled or started. deploy/checks/tools.sh puts them first on PATH.
PROM_DIR=deploy/.prometheus
if ! { "$PROM_DIR/usr/bin/promtool" --version && "$PROM_DIR/usr/bin/prometheus" --version; } >/dev/null 2>&1; then
  echo "== unpacking promtool and prometheus (Debian package prometheus) into $PROM_DIR"
  dl=$(mktemp -d)
  chmod 755 "$dl"
  fetch() { (cd "$dl" && apt-get download -qq prometheus 2>/dev/null); }
  # A fresh container has no package lists yet.
  if ! fetch; then as_root apt-get update -qq && fetch; fi \
    || { rm -rf "$dl"; echo "downloading the Debian package prometheus failed" >&2; exit 1; }
  rm -rf "$PROM_DIR"
  dpkg-deb -x "$dl"/prometheus_*.deb "$PROM_DIR"
  rm -rf "$dl"
  "$PROM_DIR/usr/bin/promtool" --version >/dev/null
fi

if ! "$VENV/bin/python" -c "import sys, importlib.metadata as m, grafana_foundation_sdk
sys.exit(m.version('grafana_foundation_sdk') != sys.argv[1])" "$SDK_VERSION" >/dev/null 2>&1; then
  echo "== creating $VENV with $SDK_PIN"
  if ! python3 -m venv "$VENV" 2>/dev/null; then
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq python3-venv
    python3 -m venv "$VENV"
  fi
  "$VENV/bin/pip" install -q --disable-pip-version-check "$SDK_PIN"
fi
