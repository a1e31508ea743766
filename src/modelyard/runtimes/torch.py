"""PyTorch programs: TorchScript (``.pt``) or ``torch.export`` (``.pt2``) files.

torch is an optional extra; it is imported only when a model with ``runtime: torch``
loads, and only inside the process that hosts it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from modelyard.runtimes.base import (
    DeclaredTensors,
    RuntimeSpec,
    TensorSpec,
    cuda_index,
    find_model_file,
    torch_device,
)


def _parse_specs(text: str) -> list[TensorSpec]:
    # "name:FP32:-1x4,other:INT64:-1x8" — torch programs carry no named signature.
    specs = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, datatype, shape = item.split(":")
        specs.append(TensorSpec(name, datatype, tuple(int(d) for d in shape.split("x"))))
    return specs


def _enter_cuda(torch: Any, spec: RuntimeSpec, index: int) -> None:
    """Check the GPU is there (never fall back to the CPU) and cap this process's share."""
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"device {spec.device}: torch sees no CUDA device (torch {torch.__version__}, "
            f"CUDA build {torch.version.cuda or 'none'})"
        )
    if index >= torch.cuda.device_count():
        raise RuntimeError(f"device {spec.device}: torch sees {torch.cuda.device_count()} GPU(s)")
    torch.cuda.set_device(index)
    if spec.gpu_memory_limit_bytes:
        total = torch.cuda.get_device_properties(index).total_memory
        fraction = min(1.0, spec.gpu_memory_limit_bytes / total)
        torch.cuda.set_per_process_memory_fraction(fraction, index)


class TorchRuntime(DeclaredTensors):
    """Runs a TorchScript or exported program; tensors are named by the config's options.

    ``options: {inputs: "x:FP32:-1x4", outputs: "y:FP32:-1x2"}`` names the positional
    inputs and outputs of the program.
    """

    def __init__(self) -> None:
        super().__init__()
        self._module: Any = None
        self._device = "cpu"

    def load(self, spec: RuntimeSpec) -> None:
        """Load the ``.pt`` (TorchScript) or ``.pt2`` (torch.export) file."""
        import torch

        path = find_model_file(Path(spec.version_dir), (".pt", ".pt2"), spec.model_file)
        self._device = torch_device(spec)
        torch.set_num_threads(spec.intra_op_threads)
        index = cuda_index(spec)
        if index is not None:
            _enter_cuda(torch, spec, index)
        if path.suffix == ".pt2":
            self._module = torch.export.load(str(path)).module().to(self._device)
        else:
            # torch.jit.load is untyped; without the torch extra torch is Any and the
            # ignore is unused, so both codes are listed (mypy runs both ways in CI).
            self._module = torch.jit.load(  # type: ignore[no-untyped-call,unused-ignore]
                str(path), map_location=self._device
            )
        self._module.eval()
        self._inputs = _parse_specs(spec.options.get("inputs", "input:FP32:-1x-1"))
        self._outputs = _parse_specs(spec.options.get("outputs", "output:FP32:-1x-1"))

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Call the program positionally in the order of the ``inputs`` option."""
        import torch

        args = [torch.from_numpy(np.ascontiguousarray(inputs[t.name])) for t in self._inputs]
        with torch.inference_mode():
            result = self._module(*[a.to(self._device) for a in args])
        values = result if isinstance(result, tuple | list) else (result,)
        return {
            t.name: v.detach().cpu().numpy() for t, v in zip(self._outputs, values, strict=True)
        }

    def close(self) -> None:
        """Drop the module."""
        self._module = None
