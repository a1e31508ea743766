#!/usr/bin/env bash
# Build the peer venvs if missing, then run the modelyard / MLServer / PyTriton comparison.
# Usage (from anywhere):  bench/run_peers.sh [run_peers.py options]
#   e.g. bench/run_peers.sh --concurrency 1,8,50 --duration 15 --rounds 2
# Results: bench/results/peers.json, plus a markdown table on stdout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
peers="$here/peers"

[[ -x "$peers/.venvs/mlserver/bin/mlserver" ]] || "$peers/setup_mlserver.sh"
[[ -x "$peers/.venvs/pytriton/bin/python" ]] || "$peers/setup_pytriton.sh"
cd "$root"
exec "$root/.venv/bin/python" "$peers/run_peers.py" "$@"
