"""A stopping llama.cpp worker closes its runtime and says what that gave back before it
exits (``Released``): its GGUF file unmapped, its buffers' pages measured; the stop still
returns only once the process has gone."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelyard.workers.factory import WorkerFactory
from modelyard.workers.instance import ReleasesEarly, StartRequest
from modelyard.workers.process import ProcessInstance
from tests.integration.llm_models import N_TOKENS, greedy_request, llama_spec

from .conftest import llama_factory_config

pytest.importorskip("llama_cpp", reason="the llm extra runs GGUF models")
pytest.importorskip("gguf", reason="the llm extra writes the test models")


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _exited(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        # Reaped before the open (no file) or between the open and the read (ESRCH).
        return True
    # A zombie, or dead (X): being reaped by its parent, the fork server, right now.
    return "\nState:\tZ" in status or "\nState:\tX" in status


async def test_a_stopping_llama_worker_releases_its_model_before_it_exits(
    llm_root: Path,
) -> None:
    factory = WorkerFactory(llama_factory_config())
    await factory.start()
    instance = ProcessInstance(factory)
    spec = llama_spec(llm_root)
    released: list[tuple[int, bool]] = []
    try:
        await instance.start(StartRequest(spec))
        async for _ in instance.generate(greedy_request(N_TOKENS)):
            pass  # its KV cache and buffers are resident now
        pid = instance.pid
        assert pid is not None
        gguf = str((llm_root / "llama-a" / "1" / "model.gguf").resolve())
        assert gguf in _maps(pid), "the worker maps its model while it serves"

        async def on_released(freed: int, unmapped: bool) -> None:
            # Told before the exit: the file is unmapped already (or the process gone).
            assert gguf not in _maps(pid)
            released.append((freed, unmapped))

        assert isinstance(instance, ReleasesEarly)
        instance.set_release_callback(on_released)
        await instance.stop()
        assert len(released) == 1, "the worker reported its release, once"
        freed, unmapped = released[0]
        assert unmapped, "the GGUF file is no longer mapped once the runtime is closed"
        assert freed >= 0
        # stop() still returned only once the process had exited (its parent, the fork
        # server, may not have reaped it yet).
        assert _exited(pid)
    finally:
        await instance.stop()
        await factory.close()
