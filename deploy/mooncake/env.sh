# Source this (". deploy/mooncake/env.sh") after install.sh: it exports what a tsl3 process
# needs to reach the local Mooncake instance (see common.sh for the instance variables).
#   MOONCAKE_STORE_LIBRARY    libmooncake_store.so (the C interface tsl3 loads)
#   LD_LIBRARY_PATH           + the no-driver libcuda.so.1 stub where install.sh built one
#   MOONCAKE_MASTER           $MOONCAKE_BIND:<rpc port> (MOONCAKE_BIND: 127.0.0.1 unless set)
#   MOONCAKE_METADATA_SERVER  http://$MOONCAKE_BIND:<http port>/metadata, or P2PHANDSHAKE
#                             with MOONCAKE_METADATA=p2p
#   MC_TCP_BIND_ADDRESS       $MOONCAKE_BIND (otherwise the transfer engine advertises the
#                             first non-loopback interface)
#   MOONCAKE_PYTHON           the master venv's interpreter (its Python client, for the bench)
# shellcheck source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
if mc_paths; then
  export MOONCAKE_STORE_LIBRARY="$MOONCAKE_STORE_LIBRARY_PATH"
  case ":${LD_LIBRARY_PATH:-}:" in
    *":$MOONCAKE_LD_LIBRARY_PATH:"*) ;;
    *) export LD_LIBRARY_PATH="$MOONCAKE_LD_LIBRARY_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
  esac
  export MOONCAKE_MASTER="$MOONCAKE_BIND:$MOONCAKE_RPC_PORT"
  export MOONCAKE_METADATA_SERVER="$MOONCAKE_METADATA_SERVER_URL"
  export MC_TCP_BIND_ADDRESS="$MOONCAKE_BIND"
  # The clients' glog: warnings and errors only (expected failures in the live tests still
  # log their cause).
  export GLOG_minloglevel="${GLOG_minloglevel:-1}"
  export MOONCAKE_PYTHON MOONCAKE_MASTER_BIN MOONCAKE_OWNER_BIN
fi
