"""Hugging Face ``transformers`` pipelines from a local folder (``save_pretrained``).

Needs the ``torch`` extra (torch and transformers); both are imported only when a model
with ``runtime: huggingface`` loads, inside its worker. Nothing is fetched from a hub:
the folder must hold the model's config, weights and tokenizer.

Tasks, from ``options: {task: ...}`` or else from the config's architecture:

- ``text-classification``: ``text`` [batch] BYTES in; ``label`` [batch] BYTES (the top
  label), ``score`` [batch] FP32 (its score) and ``scores`` [batch, labels] FP32 (every
  label's score, in label-id order) out.
- ``token-classification``: ``text`` in; ``entities`` [batch] BYTES out, one JSON list
  per text of the pipeline's entities (``aggregation_strategy`` option, default none).
- ``feature-extraction``: ``text`` in; ``embedding`` [batch, hidden] FP32 out, the
  pipeline's token features pooled (``pooling`` option: ``mean``, the default, or
  ``cls``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from modelyard.runtimes.base import DeclaredTensors, RuntimeSpec, TensorSpec

TASKS = ("text-classification", "token-classification", "feature-extraction")
"""The pipeline tasks this runtime serves."""


def task_for(architectures: list[str]) -> str:
    """The task of a model whose config lists ``architectures`` (feature-extraction else)."""
    for arch in architectures:
        if arch.endswith("ForSequenceClassification"):
            return "text-classification"
        if arch.endswith("ForTokenClassification"):
            return "token-classification"
    return "feature-extraction"


def _texts(values: np.ndarray) -> list[str]:
    return [
        v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in values.reshape(-1)
    ]


def _bytes(items: list[str]) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = [s.encode("utf-8") for s in items]
    return out


def _plain(value: Any) -> Any:
    # Entities carry numpy scalars; JSON wants Python numbers.
    return value.item() if isinstance(value, np.generic) else value


class HuggingFaceRuntime(DeclaredTensors):
    """One ``transformers.pipeline`` on a local folder; see the module doc for tensors."""

    def __init__(self) -> None:
        super().__init__()
        self._pipe: Any = None
        self.task = ""
        self._labels: list[str] = []
        self._pooling = "mean"
        self._aggregation = "none"

    def load(self, spec: RuntimeSpec) -> None:
        """Build the pipeline from ``spec.version_dir`` (no hub access)."""
        import torch
        import transformers

        # Logs, not progress bars: a worker's stderr goes to the server's log.
        hf_logging: Any = transformers.utils.logging  # untyped functions
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
        torch.set_num_threads(spec.intra_op_threads)
        folder = Path(spec.version_dir)
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
        self.task = spec.options.get("task") or task_for(list(config.architectures or []))
        if self.task not in TASKS:
            raise ValueError(f"task {self.task!r} is not one of {', '.join(TASKS)}")
        self._pooling = spec.options.get("pooling", "mean")
        if self._pooling not in ("mean", "cls"):
            raise ValueError(f"pooling {self._pooling!r} is not 'mean' or 'cls'")
        self._aggregation = spec.options.get("aggregation_strategy", "none")
        kwargs: dict[str, Any] = {}
        if self.task == "token-classification":
            kwargs["aggregation_strategy"] = self._aggregation
        # pipeline()'s overloads want a literal task; this one is checked against TASKS.
        build: Any = transformers.pipeline
        self._pipe = build(
            self.task,
            model=str(folder),
            tokenizer=str(folder),
            device=spec.device,
            **kwargs,
        )
        text = TensorSpec("text", "BYTES", (-1,))
        self._inputs = [text]
        if self.task == "text-classification":
            n = int(config.num_labels)
            self._labels = [str(config.id2label.get(i, f"LABEL_{i}")) for i in range(n)]
            self._outputs = [
                TensorSpec("label", "BYTES", (-1,)),
                TensorSpec("score", "FP32", (-1,)),
                TensorSpec("scores", "FP32", (-1, n)),
            ]
        elif self.task == "token-classification":
            self._outputs = [TensorSpec("entities", "BYTES", (-1,))]
        else:
            self._outputs = [TensorSpec("embedding", "FP32", (-1, int(config.hidden_size)))]

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the pipeline on the batch of texts."""
        texts = _texts(inputs["text"])
        if self.task == "text-classification":
            results = self._pipe(texts, top_k=None)
            index = {label: i for i, label in enumerate(self._labels)}
            scores = np.zeros((len(texts), len(self._labels)), dtype=np.float32)
            for row, ranked in enumerate(results):
                for item in ranked:
                    scores[row, index[item["label"]]] = item["score"]
            top = scores.argmax(axis=1)
            return {
                "label": _bytes([self._labels[i] for i in top]),
                "score": scores[np.arange(len(texts)), top],
                "scores": scores,
            }
        if self.task == "token-classification":
            results = self._pipe(texts)
            docs = [
                json.dumps([{k: _plain(v) for k, v in e.items()} for e in ents]) for ents in results
            ]
            return {"entities": _bytes(docs)}
        features = self._pipe(texts)
        pooled = [
            np.asarray(f[0], dtype=np.float32).mean(axis=0)
            if self._pooling == "mean"
            else np.asarray(f[0][0], dtype=np.float32)
            for f in features
        ]
        return {"embedding": np.stack(pooled)}

    def close(self) -> None:
        """Drop the pipeline."""
        self._pipe = None
