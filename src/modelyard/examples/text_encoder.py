"""Sentence embeddings from text: the packaged tokenizer in front of the MiniLM ONNX graph.

Served with ``runtime: python`` and ``class: modelyard.examples.text_encoder:TextEncoder``
from a version folder holding ``model.onnx`` (exported by
:func:`modelyard.examples.minilm.export_minilm_onnx`) and ``tokenizer.json``, so that
``POST /predict {"model": "minilm-text", "text": "..."}`` takes plain text.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np

from modelyard.runtimes.base import TensorSpec

MAX_TOKENS = 256


class TextEncoder:
    """BYTES ``text`` [batch] → FP32 ``embedding`` [batch, 384], L2-normalised, and
    INT64 ``tokens`` [batch], the tokens each text was read as (OpenAI's ``usage``)."""

    inputs = [TensorSpec("text", "BYTES", (-1,))]
    outputs = [TensorSpec("embedding", "FP32", (-1, 384)), TensorSpec("tokens", "INT64", (-1,))]

    def __init__(self) -> None:
        self._tokenizer: Any = None
        self._session: Any = None

    def load(self, version_dir: str) -> None:
        """Read the tokenizer and create the ONNX Runtime session."""
        import onnxruntime as ort

        folder = Path(version_dir)
        # tokenizers comes with the torch extra; imported by name so the core needs none.
        tokenizers = importlib.import_module("tokenizers")
        tokenizer = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        tokenizer.enable_truncation(max_length=MAX_TOKENS)
        tokenizer.enable_padding(pad_id=tokenizer.token_to_id("[PAD]"), pad_token="[PAD]")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self._tokenizer = tokenizer
        self._session = ort.InferenceSession(
            str(folder / "model.onnx"), sess_options=options, providers=["CPUExecutionProvider"]
        )

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Tokenise the batch (padded to its longest text) and encode it."""
        texts = [
            t.decode("utf-8", "replace") if isinstance(t, bytes) else str(t)
            for t in inputs["text"].reshape(-1)
        ]
        encodings = self._tokenizer.encode_batch(texts)
        feeds = {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        }
        (embedding,) = self._session.run(["embedding"], feeds)
        return {
            "embedding": np.asarray(embedding, dtype=np.float32),
            "tokens": feeds["attention_mask"].sum(axis=1),
        }
