"""Generation takes the one request path: router lease → the leased replica's scheduler.

Real servers, real worker processes, the tiny GGUF llamas of ``llm_models.py``:

* a generative model with ``replicas: {min: 2}`` spreads concurrent streams over both of
  its replicas (each replica's scheduler ran streams; each worker generated tokens);
* a generative model whose worker keeps dying under its streams opens its circuit
  breaker as a tensor model does, and the next request gets the breaker's typed error
  (``CircuitOpenError``; 503 ``circuit_open`` over REST) without reaching the worker.
"""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest

from modelyard.app import App
from modelyard.errors import CircuitOpenError, WorkerCrashedError
from modelyard.manager.records import ReplicaState
from modelyard.protocol.generate import GenerateChunk
from modelyard.scheduling.breaker import BreakerState
from tests.integration.llm_models import PROMPT, greedy_request, llm_model
from tests.polling import wait_until
from tests.servers import running_server, write_config

pytest.importorskip("llama_cpp", reason="the llm extra runs GGUF models")
pytest.importorskip("gguf", reason="the llm extra writes the test models")


def _config(root: Path, model: dict[str, object], budget_mb: float = 1024) -> Path:
    return write_config(root, [model], devices=[{"name": "cpu", "memory_budget_mb": budget_mb}])


async def test_concurrent_streams_spread_over_both_replicas(llm_root: Path) -> None:
    model = llm_model("llama-a", replicas={"min": 2, "max": 2}, preload=True)
    async with running_server(_config(llm_root, model)) as (app, _client):
        record = app.manager.resolve("llama-a", None)
        await wait_until(lambda: record.is_ready, 60.0, what="the first replica")
        await wait_until(
            lambda: any(r.state is ReplicaState.READY for r in record.replicas),
            60.0,
            what="the second replica",
        )
        replicas = [record.first, *record.replicas]
        assert len(replicas) == 2
        # Four streams held open at once (each after its first chunk): the router leases
        # the less busy replica for each, so both run two.
        streams = [app.dataplane.generate(greedy_request(8)) for _ in range(4)]
        try:
            for stream in streams:
                first = await anext(stream)
                assert first.token_ids
            assert [r.leases for r in replicas] == [2, 2]
            assert [r.generation.running for r in replicas if r.generation] == [2, 2]
            for stream in streams:
                last = await _drain(stream)
                assert last.finish_reason == "length"
        finally:
            for stream in streams:
                await stream.aclose()
        assert [r.streams for r in replicas] == [2, 2]
        # Each replica's own worker generated tokens (its counters, read from the worker).
        pids = set()
        for r in replicas:
            assert r.info is not None
            pids.add(r.info.pid)
            counters = await r.instance.generation_counters()  # type: ignore[union-attr]
            assert counters.generated_tokens >= 2 * 8
        assert len(pids) == 2
        stats = [r.generation.counters for r in replicas if r.generation]
        assert [s["succeeded"] for s in stats] == [2, 2]


async def _drain(stream: object) -> GenerateChunk:
    last: GenerateChunk | None = None
    async for chunk in stream:  # type: ignore[attr-defined]
        last = chunk
    assert last is not None
    return last


async def _crash_mid_stream(app: App) -> None:
    """One stream whose worker is killed after its first chunk: WorkerCrashedError."""
    killed: list[int] = []

    async def run() -> None:
        async for _ in app.dataplane.generate(greedy_request(4000)):
            if not killed:
                record = app.manager.resolve("llama-a", None)
                assert record.info is not None
                assert record.info.pid is not None
                os.kill(record.info.pid, signal.SIGKILL)
                killed.append(record.info.pid)

    with pytest.raises(WorkerCrashedError):
        await run()
    assert killed


async def test_a_generative_model_that_keeps_failing_opens_its_breaker(llm_root: Path) -> None:
    breaker = {"window": 2, "min_calls": 2, "failure_ratio": 0.5, "cooldown_s": 600}
    model = llm_model("llama-a", generation={"n_ctx": 4096}, breaker=breaker, preload=True)
    async with running_server(_config(llm_root, model)) as (app, client):
        record = app.manager.resolve("llama-a", None)
        for _ in range(2):
            await wait_until(lambda: record.is_ready, 60.0, what="the (restarted) worker")
            await _crash_mid_stream(app)
        await wait_until(lambda: record.is_ready, 60.0, what="the restarted worker")
        assert record.scheduler is not None
        assert record.scheduler.breaker.state is BreakerState.OPEN
        generated = (await record.instance.generation_counters()).generated_tokens  # type: ignore[union-attr]

        # The data plane: the breaker's typed error before any chunk.
        with pytest.raises(CircuitOpenError):
            await anext(app.dataplane.generate(replace(greedy_request(4), model="llama-a")))
        # REST and OpenAI: 503 with the breaker's code and a Retry-After.
        r = await client.post(
            "/v2/models/llama-a/generate", json={"text_input": PROMPT, "max_tokens": 4}
        )
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"]
        r = await client.post(
            "/v1/completions", json={"model": "llama-a", "prompt": PROMPT, "max_tokens": 4}
        )
        assert r.status_code == 503, r.text
        # None of them reached the worker; the stats view shows the open breaker.
        after = (await record.instance.generation_counters()).generated_tokens  # type: ignore[union-attr]
        assert after == generated
        assert record.generation is not None
        assert record.generation.counters["rejected_circuit"] == 3
        stats = await client.get("/v2/stats")
        assert '"breaker_state":"open"' in stats.text.replace(" ", ""), stats.text
        # The generation scheduler's own reading, beside the tensor scheduler's.
        (view,) = [m for m in stats.json()["models"] if m["name"] == "llama-a"]
        assert view["generation"]["breaker_state"] == "open"
        assert view["generation"]["rejected_circuit"] == 3
        assert view["generation"]["failed"] == 2
        assert view["generation"]["running_streams"] == 0
