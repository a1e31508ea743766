"""A model's YAML and tensor metadata rendered in Triton's model configuration shape.

``GET /v2/models/{m}/config`` answers this dict as JSON and gRPC ``ModelConfig`` parses
it into the ``ModelConfig`` message: the keys are that message's field names. Only what
modelyard has is rendered, faithfully:

- ``max_batch_size``: the YAML's when the model batches (every tensor's first dimension
  free), else 0; with batching the tensors' ``dims`` leave out the batch dimension, as
  in Triton.
- ``dynamic_batching``: present when the model batches more than one row per call.
- ``version_policy``: the YAML's ``latest``, ``all`` or ``specific``.
- An input is ``optional`` when the model gives it a default (ONNX initialisers that
  are also graph inputs). An output with a ``labels.txt`` (classification) names it.
"""

from __future__ import annotations

from typing import Any

from modelyard.config.model_config import ModelConfig, VersionPolicy
from modelyard.frontends.classification import LABELS_FILE
from modelyard.protocol.types import ModelMetadata
from modelyard.runtimes.base import TensorSpec
from modelyard.service.views import InstanceInfo

BACKENDS = {
    "onnx": "onnxruntime",
    "sklearn": "sklearn",
    "python": "python",
    "torch": "pytorch",
    "llama_cpp": "llama_cpp",
    "transformers": "transformers",
}
"""Triton's ``backend`` field for each runtime (Triton's own names where it has one)."""


def data_type(datatype: str) -> str:
    """Triton's config data type of a protocol datatype (``FP32`` → ``TYPE_FP32``)."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def _version_policy(policy: VersionPolicy) -> dict[str, object]:
    if policy.all:
        return {"all": {}}
    if policy.specific is not None:
        return {"specific": {"versions": list(policy.specific)}}
    return {"latest": {"num_versions": policy.latest or 1}}


def _dims(spec: TensorSpec, batched: bool) -> list[int]:
    return list(spec.shape[1:] if batched else spec.shape)


def triton_config(
    config: ModelConfig, meta: ModelMetadata, info: InstanceInfo | None, has_labels: bool
) -> dict[str, Any]:
    """The ``ModelConfig`` of one model version as a dict of its proto field names:
    ``meta`` gives its platform, ``info`` (None: never loaded) its tensors."""
    inputs = [] if info is None else info.inputs
    outputs = [] if info is None else info.outputs
    batched = info is not None and info.supports_batching and config.max_batch_size > 0
    doc: dict[str, Any] = {
        "name": config.name,
        "platform": meta.platform,
        "backend": BACKENDS.get(config.runtime, config.runtime),
        "version_policy": _version_policy(config.version_policy),
        "max_batch_size": config.max_batch_size if batched else 0,
        "input": [
            {
                "name": s.name,
                "data_type": data_type(s.datatype),
                "dims": _dims(s, batched),
                "optional": s.optional,
            }
            for s in inputs
        ],
        "output": [
            {
                "name": s.name,
                "data_type": data_type(s.datatype),
                "dims": _dims(s, batched),
                "label_filename": LABELS_FILE if has_labels else "",
            }
            for s in outputs
        ],
    }
    if batched and config.max_batch_size > 1:
        doc["dynamic_batching"] = {
            "preferred_batch_size": list(config.preferred_batch_sizes),
            "max_queue_delay_microseconds": round(config.max_queue_delay_s * 1e6),
        }
    return doc
