"""Transparent huge pages are requested for a model's large mapped weight file.

A real GGUF in a real worker: with ``huge_pages_min_mb`` below the file's size the
worker's mapping of the file carries the kernel's ``hg`` flag (``madvise(MADV_HUGEPAGE)``
took effect on that range, as ``/proc/<pid>/smaps`` shows); above it, it does not.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.llm_models import llm_model
from tests.servers import running_server, write_config

pytest.importorskip("llama_cpp", reason="the llm extra runs GGUF models")
pytest.importorskip("gguf", reason="the llm extra writes the test models")


def _vm_flags(pid: int, path: Path) -> list[set[str]]:
    """The VmFlags of each of ``pid``'s mappings of ``path``."""
    flags: list[set[str]] = []
    current = False
    target = str(path.resolve())
    with open(f"/proc/{pid}/smaps", encoding="utf-8") as smaps:
        for line in smaps:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                current = len(head) >= 6 and head[5] == target
            elif current and line.startswith("VmFlags:"):
                flags.append(set(line.split()[1:]))
    return flags


@pytest.mark.parametrize(("threshold_mb", "advised"), [(0.5, True), (10240.0, False)])
async def test_a_large_weight_file_gets_huge_pages(
    llm_root: Path, threshold_mb: float, advised: bool
) -> None:
    model = llm_model("llama-a", huge_pages_min_mb=threshold_mb)
    cfg = write_config(llm_root, [model], devices=[{"name": "cpu", "memory_budget_mb": 1024}])
    async with running_server(cfg) as (app, client):
        r = await client.post("/v2/repository/models/llama-a/load", json={})
        assert r.status_code == 200, r.text
        record = app.manager.resolve("llama-a", None)
        assert record.info is not None
        assert record.info.pid is not None
        flags = _vm_flags(record.info.pid, llm_root / "llama-a" / "1" / "model.gguf")
        assert flags, "llama.cpp maps its GGUF file"
        assert all(("hg" in f) is advised for f in flags)
