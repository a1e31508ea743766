"""What the GPU tests need: an NVIDIA driver answering NVML and ONNX Runtime's CUDA
execution provider. Without them every test here skips, saying which is missing.

Run them with ``scripts/gpu-check.sh`` (or ``pytest -m gpu tests/gpu``).
"""

from __future__ import annotations

import pytest

from modelyard.manager.nvml import open_nvml
from modelyard.manager.records import ModelRecord


def gpu_missing() -> str:
    """Why the GPU tests cannot run here ('' when they can)."""
    nvml, reason = open_nvml()
    if nvml is None:
        return reason
    if nvml.device_count() == 0:
        return "NVML sees no GPU"
    try:
        import onnxruntime as ort
    except ImportError:
        return "onnxruntime is not installed"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return (
            "this onnxruntime build has no CUDA execution provider "
            "(install the 'gpu' extra: onnxruntime-gpu)"
        )
    return ""


def worker_gpu_bytes(record: ModelRecord) -> int:
    """What NVML reports ``record``'s worker process holds on GPU 0 (asserted present)."""
    nvml, _ = open_nvml()
    assert nvml is not None
    assert record.info is not None
    assert record.info.pid is not None
    on_gpu = nvml.process_memory_bytes(0).get(record.info.pid)
    assert on_gpu is not None
    return on_gpu


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip every GPU test, with the reason, where no GPU can run them."""
    gpu_items = [i for i in items if i.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = gpu_missing()
    if reason:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=f"no GPU: {reason}"))
