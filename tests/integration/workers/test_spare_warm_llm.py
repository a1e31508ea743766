"""A spare worker started ahead for llama.cpp (``Warm(("llama_cpp",))``: a throwaway GGUF
model loaded and freed while it idles) serves a real GGUF model token for token as
llama-cpp-python in-process does; a spare whose warm-up fails still serves it."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from modelyard.runtimes.llama_warm import gpu_backends_in
from modelyard.workers.factory import WorkerFactory
from modelyard.workers.forkserver import preload_for
from modelyard.workers.instance import StartRequest
from modelyard.workers.process import ProcessInstance
from tests.integration.llm_models import greedy_ids, llama_spec
from tests.polling import wait_until

from .conftest import FAKES_DIR, TEST_FACTORY_CONFIG

llama_cpp = pytest.importorskip("llama_cpp", reason="the llm extra runs GGUF models")
pytest.importorskip("gguf", reason="the llm extra writes the test models")

READY_S = 10.0


@pytest.mark.parametrize("warm_fails", [False, True], ids=["warmed", "warm-up-failed"])
async def test_a_spare_warmed_for_llama_cpp_serves_a_gguf_model_exactly(
    llm_root: Path, expected: list[int], warm_fails: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    preload = preload_for(["llama_cpp"])
    if warm_fails:
        # The fork server's workers find no temporary folder: the warm-up cannot write
        # its model; the spare must report nothing warmed and serve all the same.
        path = os.pathsep.join(filter(None, [str(FAKES_DIR), os.environ.get("PYTHONPATH")]))
        monkeypatch.setenv("PYTHONPATH", path)
        preload += ("fault_models:no_temp_dir",)
    config = dataclasses.replace(
        TEST_FACTORY_CONFIG, preload=preload, spare_workers=1, warm=("llama_cpp",)
    )
    factory = WorkerFactory(config)
    await factory.start()
    instance = ProcessInstance(factory)
    try:
        await wait_until(lambda: len(factory.spare_pids) == 1, READY_S, what="a spare")
        spare_pid = factory.spare_pids[0]
        # Its Warm is sent once no call waits for a first answer (spares.py: _QUIET_WAIT_S).
        await wait_until(lambda: factory.warm_spare_pids == [spare_pid], READY_S, what="warm")
        info = await instance.start(StartRequest(llama_spec(llm_root)))
        assert instance.pid == spare_pid, "the load took the spare"
        # A llama.cpp built with a GPU backend is never warmed (llama_warm.prewarm).
        warmable = not warm_fails and not gpu_backends_in(Path(llama_cpp.__file__).parent / "lib")
        assert info.details["warmed_runtimes"] == (["llama_cpp"] if warmable else [])
        assert await greedy_ids(instance) == expected
    finally:
        await instance.stop()
        await factory.close()
