"""Generative models in Ray mode: a GGUF model on a node of a local two-node cluster
streams tokens over the OpenAI API, the same tokens a single host gives; a stream the
client leaves is cancelled in the actor."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.ray.conftest import LocalCluster, ray_server
from tests.servers import write_config

ray = pytest.importorskip("ray", reason="Ray mode needs the 'ray' extra")
openai = pytest.importorskip("openai", reason="the stock OpenAI client")
pytest.importorskip("llama_cpp", reason="the llm extra serves GGUF models")

from tests.integration.llm_models import (  # noqa: E402
    N_TOKENS,
    PROMPT,
    build_llm_repository,
    llm_model,
    reference_tokens,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def llm_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_llm_repository(tmp_path_factory.mktemp("ray-llm"))


def _reference_text(llm_root: Path) -> str:
    from llama_cpp import Llama

    path = llm_root / "llama-a" / "1" / "model.gguf"
    tokens = reference_tokens(path, PROMPT, N_TOKENS)
    vocab = Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        text: str = vocab.detokenize(tokens).decode("utf-8", errors="replace")
        return text
    finally:
        vocab.close()


async def test_a_gguf_model_streams_the_single_hosts_tokens_from_a_node(
    cluster: LocalCluster, llm_root: Path
) -> None:
    config = write_config(llm_root, [llm_model("llama-a", preload=True)])
    async with ray_server(config) as (app, _):
        record = app.manager.record_for("llama-a", "1")
        assert record.info is not None
        assert record.info.details["ray_node"] in {"a", "b"}
        assert record.info.details["context_length"] > 0
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{app.http_port}/v1", api_key="unused", max_retries=0
        )
        try:
            stream = await client.completions.create(
                model="llama-a", prompt=PROMPT, max_tokens=N_TOKENS, temperature=0, stream=True
            )
            pieces = [choice.text async for chunk in stream for choice in chunk.choices]
        finally:
            await client.close()
    assert len(pieces) > 1  # streamed, not one answer
    assert "".join(pieces) == _reference_text(llm_root)


async def test_a_stream_the_client_leaves_is_cancelled_in_the_actor(
    cluster: LocalCluster, llm_root: Path
) -> None:
    model = llm_model("llama-a", preload=True, generation={"n_ctx": 1024})
    config = write_config(llm_root, [model])
    async with ray_server(config) as (app, client):
        body = {"model": "llama-a", "prompt": PROMPT, "max_tokens": 900, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    break  # the first token arrived: leave
        record = app.manager.record_for("llama-a", "1")
        instance = record.instance
        assert instance is not None
        for _ in range(100):
            counters = await instance.generation_counters()
            if counters.active == 0:
                break
            await asyncio.sleep(0.1)
        assert counters.active == 0
        assert counters.generated_tokens < 900
