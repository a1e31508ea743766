#!/usr/bin/env bash
# Fail (exit 1) when the committed gRPC modules differ from a fresh generation.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PROTO_DIR="$ROOT/src/modelyard/frontends/grpc/proto"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

"$ROOT/scripts/gen_proto.sh" "$TMP"

status=0
for f in grpc_predict_v2_pb2.py grpc_predict_v2_pb2.pyi grpc_predict_v2_pb2_grpc.py; do
  if ! diff -u "$PROTO_DIR/$f" "$TMP/$f"; then
    status=1
  fi
done
if [ "$status" -ne 0 ]; then
  echo "check_proto: generated gRPC modules are stale; run scripts/gen_proto.sh" >&2
fi
exit "$status"
