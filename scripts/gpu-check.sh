#!/usr/bin/env bash
# Runs every test marked `gpu` on a machine with an NVIDIA GPU, in well under ten minutes:
# placement on CUDA, device bytes per model measured through NVML, the per-model GPU
# memory cap, no silent fallback to the CPU, a GGUF model bigger than a capped GPU budget
# loaded with part of its layers offloaded (tests/gpu/), plus the device unit tests.
#
# Needs, in the Python it runs ($PYTHON, default: .venv/bin/python, else python3):
# modelyard's test dependencies and the `gpu` extra (onnxruntime-gpu in place of
# onnxruntime, nvidia-ml-py). With GPU_CHECK_INSTALL=1 it installs the extra first. The
# layer-offload check also needs a llama-cpp-python built with CUDA
# (CMAKE_ARGS=-DGGML_CUDA=on pip install llama-cpp-python); without one it skips, saying so.
# Prints one summary line per check (GPU-CHECK ...) for BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L; then
  echo "gpu-check: no NVIDIA driver or GPU on this machine" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

if [ "${GPU_CHECK_INSTALL:-0}" = "1" ]; then
  # onnxruntime and onnxruntime-gpu install the same module: replace, never mix.
  "$PYTHON" -m pip uninstall -y -q onnxruntime || true
  "$PYTHON" -m pip install -q "onnxruntime-gpu>=1.18" "nvidia-ml-py>=12"
fi

"$PYTHON" - <<'PY'
import onnxruntime, pynvml
print("onnxruntime", onnxruntime.__version__, onnxruntime.get_available_providers())
try:
    import llama_cpp
    print("llama-cpp-python", llama_cpp.__version__, "GPU offload:", llama_cpp.llama_supports_gpu_offload())
except ImportError:
    print("llama-cpp-python not installed: the layer-offload check skips")
PY

export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
# -s shows the GPU-CHECK lines; the timeout keeps the whole run under ten minutes.
timeout 540 "$PYTHON" -m pytest -m "gpu or not gpu" -p no:cacheprovider -s -q \
  --timeout 240 -rs tests/gpu tests/unit/test_devices.py tests/unit/manager/test_placement.py \
  tests/unit/workers/test_device.py tests/unit/manager/test_layer_offload.py 2>&1 | tee /dev/stderr | grep -E "GPU-CHECK|passed|failed|skipped" \
  | sed 's/^/summary: /'
