"""A llama.cpp worker whose load a request waits for leaves its warm-up decode to that
request's prompt (decoded next, doing the same allocations); one loaded with nobody
waiting warms up, so that a footprint measured before any request includes the compute
buffers. Either way the output is llama.cpp's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelyard.workers.factory import WorkerFactory
from modelyard.workers.instance import StartRequest
from modelyard.workers.process import ProcessInstance
from tests.integration.llm_models import greedy_ids, llama_spec

from .conftest import llama_factory_config

pytest.importorskip("llama_cpp", reason="the llm extra runs GGUF models")
pytest.importorskip("gguf", reason="the llm extra writes the test models")


@pytest.mark.parametrize("awaited", [True, False])
async def test_a_llama_worker_warms_up_only_when_no_request_waits_for_its_load(
    llm_root: Path, expected: list[int], awaited: bool
) -> None:
    factory = WorkerFactory(llama_factory_config())
    await factory.start()
    instance = ProcessInstance(factory)
    spec = llama_spec(llm_root)
    try:
        info = await instance.start(StartRequest(spec, awaited=awaited))
        if awaited:
            assert info.warmup_s == 0.0, "the waiting request's prompt is the first decode"
        else:
            assert info.warmup_s > 0.0, "nobody waits: the worker decoded one token"
        assert await greedy_ids(instance) == expected
    finally:
        await instance.stop()
        await factory.close()
