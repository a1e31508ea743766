"""A worker entering its device: core-set affinity and thread pools, one visible GPU,
and ONNX Runtime refusing to run a CUDA model on the CPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from modelyard.examples.mlp import build_add_onnx
from modelyard.runtimes.base import RuntimeSpec, torch_device
from modelyard.runtimes.onnx import OnnxRuntime
from modelyard.workers.device import enter_device


def test_a_core_set_pins_the_process_and_sizes_its_thread_pools(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = os.sched_getaffinity(0)
    core = min(before)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    try:
        spec = enter_device(RuntimeSpec("onnx", ".", device=f"cpu:{core}", cores=(core,)))
        assert os.sched_getaffinity(0) == {core}
        assert os.environ["OMP_NUM_THREADS"] == "1"
        assert spec.device == f"cpu:{core}"
        assert torch_device(spec) == "cpu", "a core set is affinity, not a torch device"
    finally:
        os.sched_setaffinity(0, before)


def test_a_cuda_worker_sees_only_its_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    spec = enter_device(RuntimeSpec("onnx", ".", device="cuda:3"))
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"
    assert spec.device == "cuda:0", "inside the worker its one GPU is number 0"
    assert torch_device(spec) == "cuda:0"


def test_onnx_never_runs_a_cuda_model_on_the_cpu(tmp_path: Path) -> None:
    import onnxruntime as ort

    build_add_onnx(tmp_path / "model.onnx", 1.0)
    runtime = OnnxRuntime()
    spec = RuntimeSpec("onnx", str(tmp_path), device="cuda:0")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        with pytest.raises(RuntimeError, match="CUDA execution provider"):
            runtime.load(spec)
    else:  # a GPU build: on CUDA, or refused when no GPU answers; never on the CPU
        error: RuntimeError | None = None
        try:
            runtime.load(spec)
        except RuntimeError as exc:
            error = exc
        if error is not None:
            assert "could not start its CUDA execution provider" in str(error)
        else:
            session = runtime._session
            assert session is not None
            assert session.get_providers()[0] == "CUDAExecutionProvider"  # type: ignore[attr-defined]
