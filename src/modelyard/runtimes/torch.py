"""PyTorch models: TorchScript (``.pt``), ``torch.export`` programs (``.pt2``), and
safetensors state dicts (``.safetensors``, memory-mapped) for a module class.

torch is an optional extra; it is imported only when a model with ``runtime: torch``
loads, and only inside the process that hosts it.

Metadata: an exported program carries its own (input and output names, dtypes, shapes
with dynamic dimensions as -1). TorchScript keeps its argument names but no dtypes or
shapes, and a state dict keeps neither: the ``inputs``/``outputs`` options
(``"x:FP32:-1x4,…"``) or the module class's own ``inputs``/``outputs`` attributes name
them, else they are derived from the first and last weight matrix.
"""

from __future__ import annotations

import importlib
import sys
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

SUFFIXES = (".pt", ".pt2", ".safetensors")
"""TorchScript, torch.export and safetensors files."""

# torch dtype names to protocol datatypes.
_TORCH_TYPES: dict[str, str] = {
    "float32": "FP32",
    "float64": "FP64",
    "float16": "FP16",
    "bfloat16": "BF16",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "uint8": "UINT8",
    "bool": "BOOL",
}


def _parse_specs(text: str) -> list[TensorSpec]:
    # "name:FP32:-1x4,other:INT64:-1x8" — what a program does not carry itself.
    specs = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, datatype, shape = item.split(":")
        specs.append(TensorSpec(name, datatype, tuple(int(d) for d in shape.split("x"))))
    return specs


def _datatype(dtype: object) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _TORCH_TYPES:
        raise ValueError(f"tensors of dtype {name} have no protocol datatype")
    return _TORCH_TYPES[name]


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


def _dims(shape: Any) -> tuple[int, ...]:
    # Symbolic (dynamic) dimensions of an exported program print as names like s0.
    return tuple(d if isinstance(d, int) else -1 for d in shape)


def exported_specs(program: Any) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Input and output tensors of a ``torch.export`` program, from its graph."""
    signature = program.graph_signature
    user_inputs = set(signature.user_inputs)
    inputs: list[TensorSpec] = []
    outputs: list[TensorSpec] = []
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in user_inputs:
            val = node.meta["val"]
            inputs.append(TensorSpec(node.name, _datatype(val.dtype), _dims(val.shape)))
        elif node.op == "output":
            results = node.args[0]
            names = list(signature.user_outputs)
            for name, arg in zip(names, results[-len(names) :], strict=True):
                val = arg.meta["val"]
                outputs.append(TensorSpec(str(name), _datatype(val.dtype), _dims(val.shape)))
    return inputs, outputs


def _script_input_names(module: Any) -> list[str]:
    schema = module.forward.schema
    return [a.name for a in schema.arguments[1:]]


def _weight_specs(module: Any) -> tuple[list[TensorSpec], list[TensorSpec]]:
    # A state dict says nothing of the forward signature; for the common stack of
    # layers, the first weight matrix's width is the input's, the last one's height the
    # output's.
    matrices = [p for p in module.parameters() if p.dim() == 2]
    if not matrices:
        return [TensorSpec("input", "FP32", (-1, -1))], [TensorSpec("output", "FP32", (-1, -1))]
    dtype = _datatype(matrices[0].dtype)
    return (
        [TensorSpec("input", dtype, (-1, int(matrices[0].shape[1])))],
        [TensorSpec("output", dtype, (-1, int(matrices[-1].shape[0])))],
    )


def _declared(value: Any) -> list[TensorSpec]:
    specs: list[TensorSpec] = []
    for item in value or []:
        if isinstance(item, TensorSpec):
            specs.append(item)
        else:
            specs.append(TensorSpec(item["name"], item["datatype"], tuple(item["shape"])))
    return specs


class TorchRuntime(DeclaredTensors):
    """Runs a TorchScript module, an exported program, or a class with safetensors weights.

    Inputs are passed positionally in metadata order; outputs are named in order.
    """

    def __init__(self) -> None:
        super().__init__()
        self._module: Any = None
        self._device = "cpu"

    def load(self, spec: RuntimeSpec) -> None:
        """Load the ``.pt``, ``.pt2`` or ``.safetensors`` file of the version."""
        import torch

        path = find_model_file(Path(spec.version_dir), SUFFIXES, spec.model_file)
        self._device = torch_device(spec)
        torch.set_num_threads(spec.intra_op_threads)
        index = cuda_index(spec)
        if index is not None:
            _enter_cuda(torch, spec, index)
        derived: tuple[list[TensorSpec], list[TensorSpec]]
        if path.suffix == ".pt2":
            program = torch.export.load(str(path))
            derived = exported_specs(program)
            # An exported program's module has no train/eval modes (eval() raises): the
            # program was captured in whatever mode it was exported in.
            self._module = program.module().to(self._device)
        elif path.suffix == ".safetensors":
            self._module = self._state_dict_module(spec, path).to(self._device)
            declared = (
                _declared(getattr(self._module, "inputs", None)),
                _declared(getattr(self._module, "outputs", None)),
            )
            derived = declared if all(declared) else _weight_specs(self._module)
        else:
            # torch.jit.load is untyped; without the torch extra torch is Any and the
            # ignore is unused, so both codes are listed (mypy runs both ways in CI).
            self._module = torch.jit.load(  # type: ignore[no-untyped-call,unused-ignore]
                str(path), map_location=self._device
            )
            names = _script_input_names(self._module)
            derived = (
                [TensorSpec(n, "FP32", (-1, -1)) for n in names],
                [TensorSpec("output", "FP32", (-1, -1))],
            )
        if path.suffix != ".pt2":
            self._module.eval()
        opts = spec.options
        self._inputs = _parse_specs(opts["inputs"]) if "inputs" in opts else derived[0]
        self._outputs = _parse_specs(opts["outputs"]) if "outputs" in opts else derived[1]

    @staticmethod
    def _state_dict_module(spec: RuntimeSpec, path: Path) -> Any:
        """The config's ``class`` instantiated, with the file's tensors as its weights."""
        from modelyard.runtimes.safetensors_mmap import mmap_state_dict

        if not spec.python_class:
            raise ValueError(
                f"{path.name} is a state dict: name the module that holds it with "
                "'class: module:Class' in the model's config"
            )
        module_name, _, class_name = spec.python_class.partition(":")
        if spec.version_dir not in sys.path:
            sys.path.insert(0, spec.version_dir)
        module = getattr(importlib.import_module(module_name), class_name)()
        # assign=True keeps the mapped tensors themselves instead of copying into the
        # freshly initialised parameters.
        module.load_state_dict(mmap_state_dict(path), strict=True, assign=True)
        return module

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Call the module positionally in the order of its inputs."""
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
