# Sourced by deploy/test-all.sh (and selftest.py): defines the hook for a running engine host.
#
#   check_live_metrics URL   e.g. check_live_metrics http://127.0.0.1:8000/metrics
#
# Fetches URL (an engine host's /metrics, best after a short workload so labelled metrics
# have samples) and fails unless every metric and matcher label the dashboards use is in it
# and `promtool check metrics` accepts it. Needs deploy/checks/setup.sh to have run.
# shellcheck source=deploy/checks/tools.sh
source "$(dirname "${BASH_SOURCE[0]}")/tools.sh"
check_live_metrics() {
  local url=${1:?usage: check_live_metrics URL}
  local root text rc=0
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  text=$(mktemp)
  if ! "$root/deploy/.venv-checks/bin/python" - "$url" >"$text" <<'PY'
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=10) as r:
    sys.stdout.write(r.read().decode("utf-8"))
PY
  then
    echo "FAIL check_live_metrics: cannot fetch $url" >&2
    rm -f "$text"
    return 1
  fi
  echo "-- live metrics from $url"
  "$root/deploy/.venv-checks/bin/python" "$root/deploy/checks/check_metrics_used.py" "$text" || rc=$?
  rm -f "$text"
  return "$rc"
}
