"""The layer-by-layer memory of a GGUF model, from a file the gguf package wrote here:
tensor sizes read from the header's offsets, and what ``n_gpu_layers = n`` puts on the
device and leaves on the host."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelyard.config.model_config import GenerationConfig
from modelyard.examples.gguf_llama import LlamaShape, vocabulary, write_llama_gguf
from modelyard.manager.llm_memory import RUNTIME_OVERHEAD_BYTES, split_layers
from modelyard.repository.gguf import GGUFError, tensor_sizes

pytest.importorskip("gguf", reason="the llm extra writes the test models")

SHAPE = LlamaShape(layers=4, width=128, feed_forward=256, heads=4, kv_heads=2, merges=50)
CONFIG = GenerationConfig(n_ctx=256, parallel=2, n_batch=8)


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama_gguf(tmp_path_factory.mktemp("split") / "m.gguf", SHAPE)


def block_bytes(shape: LlamaShape) -> int:
    """One block's weights as the example writer lays them out: F16 matrices, F32 norms."""
    w, kv = shape.width, shape.kv_heads * shape.head_dim
    matrices = 2 * w * w + 2 * kv * w + 3 * shape.feed_forward * w
    return matrices * 2 + 2 * w * 4


def test_tensor_sizes_come_from_the_offsets(gguf_file: Path) -> None:
    sizes = tensor_sizes(gguf_file)
    vocab = len(vocabulary(SHAPE.merges)[0])
    assert sizes["token_embd.weight"] == vocab * SHAPE.width * 2
    assert sizes["blk.0.attn_q.weight"] == SHAPE.width * SHAPE.width * 2
    assert sizes["blk.3.ffn_down.weight"] == SHAPE.feed_forward * SHAPE.width * 2
    assert sizes["output_norm.weight"] == SHAPE.width * 4
    assert len(sizes) == 2 + 9 * SHAPE.layers + 1
    # Every byte of the data section belongs to one tensor (padding included).
    assert sum(sizes.values()) <= gguf_file.stat().st_size
    assert gguf_file.stat().st_size - sum(sizes.values()) < 64 * 1024, "only the header"


def test_a_truncated_file_is_refused(tmp_path: Path, gguf_file: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(gguf_file.read_bytes()[:2000])
    with pytest.raises(GGUFError):
        tensor_sizes(cut)


def test_device_and_host_parts_per_layer(gguf_file: Path) -> None:
    split = split_layers(gguf_file, CONFIG)
    est = split.estimate
    layers = SHAPE.layers
    assert split.layers == layers
    assert split.most == layers + 1, "n_gpu_layers counts the output as one more"
    assert split.layer_bytes == (block_bytes(SHAPE),) * layers
    # KV per block: n_ctx x parallel x KV heads x (K + V head size) x 2 bytes.
    assert split.kv_layer_bytes == 256 * 2 * 2 * (32 + 32) * 2
    assert split.kv_layer_bytes * layers == est.kv_cache_bytes
    step = est.compute_bytes - RUNTIME_OVERHEAD_BYTES
    assert split.step_bytes == step

    assert split.device_bytes(0) == 0, "nothing on the device"
    weights = split.input_bytes + sum(split.layer_bytes) + split.output_bytes
    assert split.host_bytes(0) == weights + est.kv_cache_bytes + est.compute_bytes
    one = split.device_bytes(1)
    assert one == block_bytes(SHAPE) + split.kv_layer_bytes + step
    assert split.device_bytes(2) - one == block_bytes(SHAPE) + split.kv_layer_bytes
    # All blocks, then the output too; the embeddings never leave the host.
    assert split.device_bytes(layers + 1) - split.device_bytes(layers) == split.output_bytes
    assert split.host_bytes(layers + 1) == split.input_bytes + est.compute_bytes
    for n in range(0, layers + 2):
        # What moves to the device leaves the host (the step's buffers exist on both).
        both = split.device_bytes(n) + split.host_bytes(n)
        assert both == weights + est.kv_cache_bytes + est.compute_bytes + (step if n else 0)
    assert split.device_bytes(99) == split.device_bytes(layers + 1)


def test_most_layers_that_fit(gguf_file: Path) -> None:
    split = split_layers(gguf_file, CONFIG)
    assert split.most_that_fit(0) == 0
    assert split.most_that_fit(split.device_bytes(1) - 1) == 0
    assert split.most_that_fit(split.device_bytes(1)) == 1
    assert split.most_that_fit(split.device_bytes(3) + 1) == 3
    assert split.most_that_fit(10 * split.device_bytes(split.most)) == split.most
    text = split.describe(3)
    assert text.startswith("3 of 4 layers on the device")
    assert "1 layers and the embeddings and the output on the host" in text
    assert "and the output on the device" in split.describe(5)


def test_n_gpu_layers_is_auto_by_default_or_a_number() -> None:
    from pydantic import ValidationError

    assert GenerationConfig().n_gpu_layers == "auto"
    assert GenerationConfig(n_gpu_layers=12).n_gpu_layers == 12
    for bad in ("many", -1):
        with pytest.raises(ValidationError, match="n_gpu_layers"):
            GenerationConfig(n_gpu_layers=bad)
