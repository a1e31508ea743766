"""An inline model's unload gives its heap memory back to the system, not only to malloc.

The server process lives on after an unload. A model whose memory is many mid-sized
blocks, each followed by a small block that outlives it (what a long-lived process's heap
looks like), leaves holes glibc keeps; the unload trims them (``malloc_trim(0)``), so the
server's resident memory falls by about what the model held.
"""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from modelyard.runtimes.base import RuntimeSpec
from modelyard.workers.huge_pages import trim_heap
from modelyard.workers.inline import InlineInstance
from modelyard.workers.instance import StartRequest

MODEL = """
import numpy as np
from modelyard.runtimes.base import TensorSpec

KEPT = []  # small blocks that outlive the model (the module stays imported)


class Holes:
    inputs = [TensorSpec("x", "FP32", (-1, 1))]
    outputs = [TensorSpec("y", "FP32", (-1, 1))]

    def load(self, version_dir: str) -> None:
        self.blocks = []
        for _ in range(3000):  # about 190 MiB in 64 KiB blocks
            self.blocks.append(bytearray(b"x" * (64 * 1024)))
            KEPT.append(bytearray(b"y" * 1024))

    def predict(self, inputs):
        return {"y": inputs["x"].astype(np.float32)}
"""


@pytest.mark.skipif(not trim_heap(), reason="malloc_trim is glibc's")
async def test_an_inline_unload_returns_the_models_heap(tmp_path: Path) -> None:
    folder = tmp_path / "holes" / "1"
    folder.mkdir(parents=True)
    (folder / "holes_model.py").write_text(MODEL, encoding="utf-8")
    spec = RuntimeSpec("python", str(folder), "holes", python_class="holes_model:Holes")
    instance = InlineInstance()
    await instance.start(StartRequest(spec))
    proc = psutil.Process()
    loaded = proc.memory_info().rss
    await instance.stop()
    freed = loaded - proc.memory_info().rss
    assert freed > 120 * 1024 * 1024, f"the unload gave back only {freed >> 20} MiB"
