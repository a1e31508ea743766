"""The throwaway GGUF model a spare warms llama.cpp with (``runtimes/llama_warm.py``),
written in plain Python, reads back as the llama it claims to be: with the ``gguf``
package's own reader and with the server's header reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelyard.repository.gguf import llama_dims, read_metadata, tensor_sizes
from modelyard.runtimes.llama_warm import gpu_backends_in, warm_model_bytes

gguf = pytest.importorskip("gguf", reason="the llm extra reads GGUF files")


@pytest.fixture(scope="module")
def warm_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("warm") / "warm.gguf"
    path.write_bytes(warm_model_bytes())
    return path


def test_the_gguf_package_reads_a_one_layer_llama(warm_gguf: Path) -> None:
    reader = gguf.GGUFReader(str(warm_gguf))
    tensors = {t.name: (tuple(int(d) for d in t.shape), t.tensor_type) for t in reader.tensors}
    f16, f32 = gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F32
    assert tensors["token_embd.weight"] == ((32, 260), f16)
    assert tensors["blk.0.attn_k.weight"] == ((32, 16), f16)
    assert tensors["blk.0.ffn_down.weight"] == ((64, 32), f16)
    assert tensors["output_norm.weight"] == ((32,), f32)
    assert len(tensors) == 12
    tokens = reader.fields["tokenizer.ggml.tokens"]
    assert len(tokens.data) == 260
    assert bytes(tokens.parts[tokens.data[-1]]).decode() == "<|im_end|>"


def test_the_servers_reader_sizes_it(warm_gguf: Path) -> None:
    meta = read_metadata(warm_gguf)
    dims = llama_dims(meta)
    assert (dims.layers, dims.width, dims.heads, dims.kv_heads, dims.vocab_size) == (
        1,
        32,
        2,
        1,
        260,
    )
    assert "im_start" in str(meta["tokenizer.chat_template"])
    sizes = tensor_sizes(warm_gguf)
    assert sizes["token_embd.weight"] == 32 * 260 * 2
    assert sizes["output_norm.weight"] == 32 * 4


def test_gpu_backends_are_found_by_their_library_names(tmp_path: Path) -> None:
    """A llama.cpp built with a GPU backend is not warmed in a spare (its load would start
    the GPU API before the worker knows its device): found without loading anything."""
    cpu_only = tmp_path / "cpu"
    cpu_only.mkdir()
    for name in ("libggml-base.so", "libggml-cpu.so", "libggml.so", "libllama.so"):
        (cpu_only / name).touch()
    assert gpu_backends_in(cpu_only) == []
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    for name in ("libggml-base.so", "libggml-cpu.so", "libggml-cuda.so.0", "libllama.so"):
        (gpu / name).touch()
    assert gpu_backends_in(gpu) == ["cuda"]
    assert gpu_backends_in(tmp_path / "missing") == []
