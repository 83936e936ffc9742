#!/usr/bin/env bash
# Installs what the dashboard checks need, idempotently: promtool (Debian's `prometheus`
# package; its service is kept from starting) and a venv at deploy/.venv-checks with the
# pinned grafana-foundation-sdk. Starts nothing and leaves nothing running.
set -euo pipefail
cd "$(dirname "$0")/../.."

# Verified: from_json -> to_json drops unknown keys down to options/fieldConfig/targets.
SDK_VERSION='1769699998!10.1.0'
SDK_PIN="grafana-foundation-sdk==$SDK_VERSION"
VENV=deploy/.venv-checks

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if ! command -v promtool >/dev/null 2>&1; then
  echo "== installing promtool (Debian package prometheus)"
  # policy-rc.d exit 101 forbids maintainer scripts from starting the service.
  made_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    as_root sh -c 'printf "#!/bin/sh\nexit 101\n" > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d'
    made_policy=1
  fi
  status=0
  as_root apt-get update -qq || status=$?
  if [ "$status" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends prometheus \
      || status=$?
  fi
  if [ "$made_policy" = 1 ]; then as_root rm -f /usr/sbin/policy-rc.d; fi
  # Where systemd runs, the unit may still have been enabled: stop and disable it.
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
    as_root systemctl disable --now prometheus || true
  fi
  [ "$status" = 0 ] || { echo "installing prometheus failed" >&2; exit "$status"; }
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
