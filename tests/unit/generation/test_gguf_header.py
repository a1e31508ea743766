"""The server's own GGUF header reader agrees with the file the gguf package wrote."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelyard.config.model_config import GenerationConfig
from modelyard.examples.gguf_llama import CHAT_TEMPLATE, SHAPES, LlamaShape, write_llama_gguf
from modelyard.manager.llm_memory import estimate_gguf
from modelyard.repository.gguf import GGUFError, llama_dims, read_metadata

pytest.importorskip("gguf", reason="the llm extra writes the test models")

_SHAPE = LlamaShape(layers=2, width=64, feed_forward=128, heads=4, kv_heads=2, merges=50)


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama_gguf(tmp_path_factory.mktemp("gguf") / "m.gguf", _SHAPE)


def test_metadata_and_dims(small_gguf: Path) -> None:
    meta = read_metadata(small_gguf)
    assert meta["tokenizer.chat_template"] == CHAT_TEMPLATE
    dims = llama_dims(meta)
    assert (dims.layers, dims.width, dims.heads, dims.kv_heads) == (2, 64, 4, 2)
    assert dims.head_dim_k == dims.head_dim_v == 16
    assert dims.context_length == _SHAPE.context_length
    assert dims.vocab_size > 256


def test_same_arguments_same_bytes(tmp_path: Path, small_gguf: Path) -> None:
    again = write_llama_gguf(tmp_path / small_gguf.name, _SHAPE)
    assert again.read_bytes() == small_gguf.read_bytes()


def test_kv_cache_arithmetic(small_gguf: Path) -> None:
    est = estimate_gguf(small_gguf, GenerationConfig(n_ctx=512, parallel=3))
    # n_ctx x parallel x layers x kv_heads x (K + V head size) x 2 bytes
    assert est.kv_cache_bytes == 512 * 3 * 2 * 2 * (16 + 16) * 2
    assert est.file_bytes == small_gguf.stat().st_size
    text = est.arithmetic()
    assert "n_ctx 512 x parallel 3 x 2 layers x 2 KV heads" in text
    default = estimate_gguf(small_gguf, GenerationConfig())
    assert default.n_ctx == _SHAPE.context_length


def test_not_a_gguf_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"ONNX" + b"\0" * 64)
    with pytest.raises(GGUFError, match="not a GGUF file"):
        read_metadata(bad)
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(b"GGUF\x03\0\0\0")
    with pytest.raises(GGUFError, match="truncated"):
        read_metadata(truncated)


def test_example_sizes_are_declared() -> None:
    assert set(SHAPES) == {"tiny", "small", "medium"}


def test_repacked_weights_are_a_private_copy(small_gguf: Path) -> None:
    mapped = estimate_gguf(small_gguf, GenerationConfig(n_ctx=512))
    repacked = estimate_gguf(small_gguf, GenerationConfig(n_ctx=512, weights="repacked"))
    size = small_gguf.stat().st_size
    # Mapped: the file is charged apart (once per file), not in the worker's own bytes.
    assert repacked.private_bytes == mapped.private_bytes + size
    assert repacked.total_bytes == mapped.total_bytes
    assert "a repacked copy" in repacked.arithmetic()
