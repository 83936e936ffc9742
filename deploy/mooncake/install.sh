#!/usr/bin/env bash
# Installs a local Mooncake Store for tsl3's live tests and benchmark, idempotently (a second
# run with everything present does nothing but print the library path). Everything lands in
# deploy/.mooncake/ (gitignored):
#   venv-master/  mooncake-transfer-engine-non-cuda: mooncake_master, mooncake_client (the
#                 independent storage owner) and the Python MooncakeDistributedStore client
#   lib/          tokenspeed-mooncake + nvidia-cuda-runtime wheels extracted flat, giving
#                 mooncake/libmooncake_store.so (the C interface tsl3 loads) beside
#                 libcudart.so.13 so that the library's RPATH resolves
#   stub/         a no-driver libcuda.so.1, built only when the machine has no real one
# The two wheels both ship a top-level `mooncake` package: they never share a venv.
# Prints the library path as its last line.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
STATE="${MOONCAKE_STATE_DIR:-$ROOT/deploy/.mooncake}"
MASTER_PKG="mooncake-transfer-engine-non-cuda==0.3.13.post1"
STORE_WHEEL="tokenspeed-mooncake==0.3.13.post20261027"
CUDART_WHEEL="nvidia-cuda-runtime==13.5.37"
PY="${PYTHON:-python3}"
mkdir -p "$STATE"

log() { echo "[mooncake install] $*" >&2; }

# 1. Debian libraries the binaries link against.
missing=()
for pkg in libibverbs1 ibverbs-providers libnuma1 libcurl4; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "apt-get install ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >"$STATE/apt.log" 2>&1 \
    || { tail -n 20 "$STATE/apt.log" >&2; exit 1; }
fi

# 2. The master venv (master, storage owner, Python client).
VENV="$STATE/venv-master"
stamp="$VENV/.installed-$MASTER_PKG"
if [ ! -f "$stamp" ]; then
  log "creating $VENV with $MASTER_PKG"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q "$MASTER_PKG" >&2
  touch "$stamp"
fi

# 3. The C interface library, extracted flat.
LIB="$STATE/lib"
stamp="$LIB/.installed-$STORE_WHEEL-$CUDART_WHEEL"
if [ ! -f "$stamp" ]; then
  log "downloading $STORE_WHEEL and $CUDART_WHEEL"
  rm -rf "$LIB" "$STATE/wheels"
  mkdir -p "$LIB" "$STATE/wheels"
  # The C library does not depend on the interpreter; pin the tag the wheel is published for.
  "$VENV/bin/pip" download -q --no-deps --only-binary=:all: --python-version 3.11 \
    -d "$STATE/wheels" "$STORE_WHEEL" "$CUDART_WHEEL" >&2
  for whl in "$STATE"/wheels/*.whl; do
    "$PY" -m zipfile -e "$whl" "$LIB"
  done
  rm -rf "$STATE/wheels"
  touch "$stamp"
fi
SO="$(find "$LIB" -name 'libmooncake_store.so' -print -quit)"
[ -n "$SO" ] || { log "libmooncake_store.so not found under $LIB"; exit 1; }
CUDART_DIR="$(dirname "$(find "$LIB" -name 'libcudart.so.13*' -print -quit)")"

# 4. libcuda.so.1: only a stub where no real driver exists.
STUB="$STATE/stub"
if ldconfig -p | grep -q 'libcuda\.so\.1 ' || command -v nvidia-smi >/dev/null 2>&1; then
  log "real libcuda.so.1 present: no stub"
  rm -rf "$STUB"
elif [ ! -f "$STUB/libcuda.so.1" ] || [ "$HERE/cuda_stub.c" -nt "$STUB/libcuda.so.1" ]; then
  log "no NVIDIA driver: building the no-device libcuda.so.1 stub"
  mkdir -p "$STUB"
  gcc -shared -fPIC -O2 -Wl,-soname,libcuda.so.1 -o "$STUB/libcuda.so.1" "$HERE/cuda_stub.c"
fi

# 5. Where things are, for env.sh.
MASTER_BIN="$(find "$VENV" -path '*site-packages/mooncake/mooncake_master' -print -quit)"
OWNER_BIN="$(find "$VENV" -path '*site-packages/mooncake/mooncake_client' -print -quit)"
[ -x "$MASTER_BIN" ] || { log "mooncake_master not found in $VENV"; exit 1; }
[ -x "$OWNER_BIN" ] || { log "mooncake_client not found in $VENV"; exit 1; }
LDPATH="$CUDART_DIR"
[ -d "$STUB" ] && LDPATH="$STUB:$LDPATH"
cat > "$STATE/paths.env" <<PATHS
MOONCAKE_STORE_LIBRARY_PATH=$SO
MOONCAKE_LD_LIBRARY_PATH=$LDPATH
MOONCAKE_MASTER_BIN=$MASTER_BIN
MOONCAKE_OWNER_BIN=$OWNER_BIN
MOONCAKE_PYTHON=$VENV/bin/python
PATHS
log "ready"
echo "$SO"
