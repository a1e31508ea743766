#!/usr/bin/env bash
# Start modelyard from the environment scripts/install.sh made: the start step of
# scripts/serve-example.sh and of the Dockerfile. Arguments go to `modelyard serve`;
# settings also come from MODELYARD_* variables (MODELYARD_GRPC_PORT=off disables gRPC).
#
#   VENV=.venv          the environment to run from
set -euo pipefail
VENV=${VENV:-$(cd "$(dirname "$0")/.." && pwd)/.venv}
exec "$VENV/bin/modelyard" serve "$@"
