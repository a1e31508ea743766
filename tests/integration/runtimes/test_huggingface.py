"""Hugging Face pipelines from a local folder: tiny BERT models created from a config with
random weights, a WordPiece tokenizer trained on scikit-learn's bundled data set
descriptions, all saved with ``save_pretrained``; results equal the pipeline's own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra (CI installs it)")
transformers = pytest.importorskip("transformers", reason="needs the huggingface extra")

import sklearn.datasets  # noqa: E402
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

from modelyard.repository.runtime_guess import guess_runtime  # noqa: E402
from tests.integration.runtimes.served import (  # noqa: E402
    infer,
    load_inline,
    serving,
    tensors_of,
    triton_metadata,
)

# Importing transformers and starting a worker that imports it take seconds: CI runs these.
pytestmark = pytest.mark.slow

TEXTS = ["The iris data set has three classes.", "Housing prices in California."]
LABELS = {0: "negative", 1: "neutral", 2: "positive"}
TASKS = {
    "text-classification": transformers.BertForSequenceClassification,
    "token-classification": transformers.BertForTokenClassification,
    "feature-extraction": transformers.BertModel,
}


def _tokenizer() -> Any:
    descr = Path(sklearn.datasets.__file__).parent / "descr"
    corpus = [p.read_text(encoding="utf-8") for p in sorted(descr.glob("*.rst"))]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(
        corpus, trainers.WordPieceTrainer(vocab_size=600, special_tokens=special)
    )
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return transformers.BertTokenizerFast(tokenizer_object=tok)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One model folder per task (version 1), random weights from a fixed seed."""
    root = tmp_path_factory.mktemp("hf")
    tokenizer = _tokenizer()
    config = transformers.BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        id2label=LABELS,
        label2id={v: k for k, v in LABELS.items()},
    )
    for task, cls in TASKS.items():
        torch.manual_seed(0)
        folder = root / task / "1"
        cls(config).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return root


def _pipeline(repo: Path, task: str) -> Any:
    return transformers.pipeline(task, model=str(repo / task / "1"))


def _texts() -> np.ndarray:
    arr = np.empty(len(TEXTS), dtype=object)
    arr[:] = [t.encode() for t in TEXTS]
    return arr


def test_text_classification_equals_the_pipeline(repo: Path) -> None:
    runtime = load_inline("huggingface", repo / "text-classification" / "1")
    out = runtime.infer({"text": _texts()})
    reference = _pipeline(repo, "text-classification")(TEXTS, top_k=None)
    for row, ranked in enumerate(reference):
        assert out["label"][row] == ranked[0]["label"].encode()
        assert out["score"][row] == pytest.approx(ranked[0]["score"], rel=1e-6)
        by_label = {r["label"]: r["score"] for r in ranked}
        expected = [by_label[LABELS[i]] for i in range(3)]
        np.testing.assert_allclose(out["scores"][row], expected, rtol=1e-6)
    assert [(t.name, t.datatype, t.shape) for t in runtime.outputs] == [
        ("label", "BYTES", (-1,)),
        ("score", "FP32", (-1,)),
        ("scores", "FP32", (-1, 3)),
    ]
    assert guess_runtime(repo / "text-classification") == "huggingface"


def test_token_classification_equals_the_pipeline(repo: Path) -> None:
    runtime = load_inline("huggingface", repo / "token-classification" / "1")
    out = runtime.infer({"text": _texts()})
    reference = _pipeline(repo, "token-classification")(TEXTS)
    for row, entities in enumerate(reference):
        got = json.loads(out["entities"][row])
        assert [e["word"] for e in got] == [e["word"] for e in entities]
        assert [e["entity"] for e in got] == [e["entity"] for e in entities]
        np.testing.assert_allclose(
            [e["score"] for e in got], [float(e["score"]) for e in entities], rtol=1e-6
        )


def test_feature_extraction_equals_the_pipeline_mean_pooled(repo: Path) -> None:
    runtime = load_inline("huggingface", repo / "feature-extraction" / "1")
    out = runtime.infer({"text": _texts()})
    reference = _pipeline(repo, "feature-extraction")(TEXTS)
    expected = np.stack([np.asarray(f[0], dtype=np.float32).mean(axis=0) for f in reference])
    np.testing.assert_allclose(out["embedding"], expected, rtol=1e-5, atol=1e-6)
    assert runtime.outputs[0].shape == (-1, 32)


async def test_served_pipeline_answers_like_transformers(repo: Path, tmp_path: Path) -> None:
    models = [
        {
            "name": "classify",
            "path": "text-classification",
            "runtime": "huggingface",
            "preload": True,
        }
    ]
    async with serving(repo, models, tmp_path) as (app, client):
        out = await infer(client, "classify", {"text": _texts()})
        meta = await triton_metadata(app, "classify")
    reference = _pipeline(repo, "text-classification")(TEXTS)
    assert [str(v) for v in out["label"]] == [r["label"] for r in reference]
    np.testing.assert_allclose(
        out["score"].astype(np.float32), [r["score"] for r in reference], rtol=1e-6
    )
    assert tensors_of(meta, "inputs") == [("text", "BYTES", [-1])]
    assert tensors_of(meta, "outputs") == [
        ("label", "BYTES", [-1]),
        ("score", "FP32", [-1]),
        ("scores", "FP32", [-1, 3]),
    ]
