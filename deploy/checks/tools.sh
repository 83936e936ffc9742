# Sourced by the check scripts: puts the promtool and prometheus that deploy/checks/setup.sh
# unpacked into deploy/.prometheus/ first on PATH (no system package is needed or used), and
# sets ENGINE_HOST, the one engine-host build every check runs: the binary `cargo test
# --workspace` builds (same features and profile), so no check compiles another one.
# deploy/test-all.sh exports ENGINE_HOST_BIN after its cargo test (not a TSL3_* name: an engine
# host refuses every TSL3_* variable that is not a setting); run alone, a check builds
# it with `cargo test --workspace --no-run` (a no-op once the test command ran).
_tools_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export PATH="$_tools_root/deploy/.prometheus/usr/bin:$PATH"

# engine_host_bin: sets and exports ENGINE_HOST (building it when ENGINE_HOST_BIN is unset).
engine_host_bin() {
  if [ -n "${ENGINE_HOST_BIN:-}" ]; then
    ENGINE_HOST=$ENGINE_HOST_BIN
  else
    local log
    log=$(mktemp)
    (cd "$_tools_root" && cargo test --workspace --no-run --quiet) >"$log" 2>&1 || {
      cat "$log" >&2
      rm -f "$log"
      echo "FAIL cargo test --workspace --no-run (building engine-host)" >&2
      return 1
    }
    rm -f "$log"
    ENGINE_HOST="${CARGO_TARGET_DIR:-$_tools_root/target}/debug/engine-host"
  fi
  [ -x "$ENGINE_HOST" ] || { echo "FAIL no engine-host binary at $ENGINE_HOST" >&2; return 1; }
  export ENGINE_HOST
}
