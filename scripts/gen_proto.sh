#!/usr/bin/env bash
# Regenerate the Python modules of the KServe v2 gRPC API from its .proto.
#
#   scripts/gen_proto.sh [OUT_DIR]
#
# OUT_DIR defaults to the package folder, where the generated files are committed;
# scripts/check_proto.sh passes a temporary folder and diffs the result.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PROTO_DIR="$ROOT/src/modelyard/frontends/grpc/proto"
OUT_DIR="${1:-$PROTO_DIR}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
NAME="grpc_predict_v2"

mkdir -p "$OUT_DIR"
"$PYTHON" -m grpc_tools.protoc \
  --proto_path="$PROTO_DIR" \
  --python_out="$OUT_DIR" \
  --pyi_out="$OUT_DIR" \
  --grpc_python_out="$OUT_DIR" \
  "$PROTO_DIR/$NAME.proto"

# Two rewrites of protoc's output, done in Python so they behave the same everywhere:
#
# 1. Register the file in a private descriptor pool, not the process-wide default
#    one. tritonclient's and MLServer's stubs define the same "inference.*" messages
#    under another file name and the default pool refuses duplicate symbols, so a
#    process could not hold both (e.g. a test driving an in-process server with
#    tritonclient). Message names and the wire format are unchanged.
# 2. protoc writes a top-level import ("import grpc_predict_v2_pb2 as ..."), which
#    only works with the folder on sys.path; make it absolute within the package.
"$PYTHON" - "$OUT_DIR" "$NAME" <<'PY'
import pathlib
import sys

out, name = pathlib.Path(sys.argv[1]), sys.argv[2]


def rewrite(path: pathlib.Path, old: str, new: str) -> None:
    text = path.read_text()
    if text.count(old) != 1:
        sys.exit(f"gen_proto: expected one {old!r} in {path.name}; protoc's output changed")
    path.write_text(text.replace(old, new))


rewrite(
    out / f"{name}_pb2.py",
    "\nDESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(",
    "\n_POOL = _descriptor_pool.DescriptorPool()\nDESCRIPTOR = _POOL.AddSerializedFile(",
)
rewrite(
    out / f"{name}_pb2_grpc.py",
    f"\nimport {name}_pb2 as ",
    f"\nfrom modelyard.frontends.grpc.proto import {name}_pb2 as ",
)
PY
