"""The server reads a GGUF header once per file, not on every question a switch asks of
it (context, estimate, placement, offload plan); a file rewritten is read again."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from modelyard.config.model_config import GenerationConfig
from modelyard.manager import llm_memory
from modelyard.repository import gguf

pytest.importorskip("gguf", reason="the llm extra writes the test models")


def test_a_header_is_read_once_per_file_until_the_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from modelyard.examples.gguf_llama import LlamaShape, write_llama_gguf

    path = tmp_path / "model.gguf"
    small = LlamaShape(layers=2, width=64, feed_forward=128, heads=4, kv_heads=2, merges=50)
    write_llama_gguf(path, small, seed=1)
    reads: list[Path] = []

    def counting(p: Path) -> Any:
        reads.append(p)
        return gguf.read_metadata(p)

    monkeypatch.setattr(llm_memory, "read_metadata", counting)
    config = GenerationConfig()
    first = llm_memory.estimate_gguf(path, config)
    for _ in range(4):
        assert llm_memory.estimate_gguf(path, config) == first
    assert len(reads) == 1

    write_llama_gguf(path, LlamaShape(layers=3, width=64, feed_forward=128, heads=4), seed=2)
    os.utime(path, ns=(1, 1))  # a different modification time, whatever the clock's grain
    again = llm_memory.estimate_gguf(path, config)
    assert len(reads) == 2
    assert again.dims.layers == 3
    assert again.file_bytes == path.stat().st_size
