"""ONNX Runtime: the main runtime (CPU, and CUDA when its provider is present)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np

from modelyard.runtimes.base import (
    DeclaredTensors,
    RuntimeSpec,
    TensorSpec,
    cuda_index,
    find_model_file,
)

_CUDA = "CUDAExecutionProvider"

# ONNX Runtime's type strings to protocol datatypes.
_ORT_TYPES: dict[str, str] = {
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(float16)": "FP16",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(bool)": "BOOL",
    "tensor(string)": "BYTES",
}


def _dims(shape: list[object]) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) and d >= 0 else -1 for d in shape)


def _spec(arg: object) -> TensorSpec:
    name: str = arg.name  # type: ignore[attr-defined]  # onnxruntime NodeArg is untyped
    ort_type: str = arg.type  # type: ignore[attr-defined]
    shape: list[object] = list(arg.shape or [])  # type: ignore[attr-defined]
    return TensorSpec(name, _ORT_TYPES.get(ort_type, "BYTES"), _dims(shape))


def _strings(name: str, arr: np.ndarray) -> np.ndarray:
    """A BYTES tensor as ORT's Python API takes string tensors: an array of ``str``.

    ORT's binding encodes each ``str`` as UTF-8 and turns any other object (``bytes``
    included) into its ``repr``-like ``str()``, so bytes that are not UTF-8 cannot reach
    the graph unchanged: they are refused by name rather than altered (Triton's C API
    passes them raw; see docs/protocol.md).
    """
    out = np.empty(arr.shape, dtype=object)
    flat = out.reshape(-1)
    for i, v in enumerate(arr.reshape(-1)):
        if isinstance(v, bytes):
            try:
                flat[i] = v.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(
                    f"input {name!r}: element {i} is not valid UTF-8; ONNX Runtime's Python "
                    "API carries string tensors as UTF-8 text only"
                ) from None
        else:
            flat[i] = str(v)
    return out


def _cuda_options(spec: RuntimeSpec, index: int) -> dict[str, str]:
    """The CUDA provider's options: the GPU, and the model's cap on device memory."""
    options = {"device_id": str(index)}
    if spec.gpu_memory_limit_bytes:
        # The arena then grows by what is asked, not by doubling past the cap.
        options["gpu_mem_limit"] = str(spec.gpu_memory_limit_bytes)
        options["arena_extend_strategy"] = "kSameAsRequested"
    return options


_WARM_GRAPH = (
    b'\x08\x07\x12\tmodelyard::\n\x10\n\x01x\x12\x01y"\x08Identity\x12\x04warmZ\x0f'
    b"\n\x01x\x12\n\n\x08\x08\x01\x12\x04\n\x02\x08\x01b\x0f\n\x01y\x12\n\n\x08\x08\x01"
    b"\x12\x04\n\x02\x08\x01B\x04\n\x00\x10\r"
)
"""A serialized one-node model (``y = Identity(x)``, FP32 [1], opset 13), written by
``onnx.helper`` once: building it here would import ``onnx`` into every spare."""


def prewarm() -> None:
    """Create and run a throwaway session, in a spare worker before any model is known.

    A process's first ``InferenceSession`` builds ONNX Runtime's environment and the CPU
    provider's kernel registry: 6-10 ms on a 2-core VM, against 0.5-3 ms for each later
    session, which is most of a tiny model's load. One thread, no pool: nothing lingers
    but that process-wide state.
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    cpu = ["CPUExecutionProvider"]
    session = ort.InferenceSession(_WARM_GRAPH, sess_options=opts, providers=cpu)
    session.run(None, {"x": np.zeros(1, dtype=np.float32)})


class OnnxRuntime(DeclaredTensors):
    """Runs one ``.onnx`` file with an ONNX Runtime ``InferenceSession``."""

    def __init__(self) -> None:
        super().__init__()
        self._session: object | None = None
        self._output_names: list[str] = []
        self._run: Callable[[list[str], dict[str, np.ndarray], None], list[object]] | None = None
        """The session's run: on the CPU, the compiled session's own (see :meth:`load`)."""
        self._checked_run = self._run
        """``InferenceSession.run``, which checks the feed's names first."""

    def load(self, spec: RuntimeSpec) -> None:
        """Create the session; the model file is ``model.onnx`` or the only ``.onnx``."""
        import onnxruntime as ort

        path = find_model_file(Path(spec.version_dir), (".onnx",), spec.model_file)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = spec.intra_op_threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        if spec.share_weights:
            # Pre-packing copies weights into private buffers; without it ORT keeps the
            # external-data file memory-mapped, so replicas share it in the page cache.
            opts.add_session_config_entry("session.disable_prepacking", "1")
        index = cuda_index(spec)
        providers: list[str | tuple[str, dict[str, str]]] = ["CPUExecutionProvider"]
        if index is not None:
            providers = [("CUDAExecutionProvider", _cuda_options(spec, index))]
            available = ort.get_available_providers()
            if _CUDA not in available:
                raise RuntimeError(
                    f"device {spec.device} needs ONNX Runtime's CUDA execution provider, "
                    f"which this onnxruntime build lacks (it has {', '.join(available)}); "
                    "install modelyard's 'gpu' extra (onnxruntime-gpu)"
                )
        session = ort.InferenceSession(str(path), sess_options=opts, providers=providers)
        if index is not None and session.get_providers()[:1] != [_CUDA]:
            # ORT falls back to the CPU when the CUDA provider cannot start (driver,
            # libraries): never serve a CUDA model from the CPU without saying so.
            raise RuntimeError(
                f"ONNX Runtime could not start its CUDA execution provider on {spec.device} "
                f"(the session runs on {', '.join(session.get_providers())}); see the "
                "worker's log for the CUDA error"
            )
        self._session = session
        # ``InferenceSession.run`` checks the feed's names in Python, then calls its
        # compiled session, which reports an unknown name, type or rank itself
        # (InvalidArgument: an input error, as before); the wrapper's other work is
        # falling back from a failed GPU provider. A CPU session with a feed of every
        # input calls it directly: about 2 µs less per call, 6 µs on a worker just woken
        # (BENCHMARKS.md §5, session 9). A feed short of an input still goes through the
        # wrapper, whose message names the missing inputs.
        compiled = getattr(session, "_sess", None) if index is None else None
        self._run = compiled.run if compiled is not None else session.run
        self._checked_run = session.run
        self._inputs = [_spec(a) for a in session.get_inputs()]
        # Initialisers that are also graph inputs have a default a request may override:
        # optional inputs (ORT feeds the initialiser when the request leaves them out).
        self._inputs += [
            dataclasses.replace(_spec(a), optional=True)
            for a in session.get_overridable_initializers()
        ]
        self._outputs = [_spec(a) for a in session.get_outputs()]
        self._output_names = [o.name for o in self._outputs]

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the session on every output."""
        run = self._run
        if run is None:
            raise RuntimeError("model not loaded")
        feeds = {k: (_strings(k, v) if v.dtype == object else v) for k, v in inputs.items()}
        if len(feeds) != len(self._inputs):
            run = self._checked_run or run
        results = run(self._output_names, feeds, None)
        return {
            name: np.asarray(value) for name, value in zip(self._output_names, results, strict=True)
        }

    def close(self) -> None:
        """Drop the session."""
        self._session = None
        self._run = self._checked_run = None
