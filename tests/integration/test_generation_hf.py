"""The ``transformers`` runtime in a worker process: greedy text over the generate
extension equals ``model.generate`` run in-process on the same folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.servers import running_server, write_config

pytest.importorskip("torch", reason="the torch extra runs transformers models")
pytest.importorskip("transformers", reason="the torch extra runs transformers models")

PROMPT = "Once upon a time there was a little model"


@pytest.mark.slow
async def test_transformers_greedy_over_generate_equals_in_process(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from modelyard.examples.hf_tiny_llama import write_tiny_causal_lm

    folder = write_tiny_causal_lm(tmp_path / "tiny-hf" / "1")
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    ref = model.generate(ids, max_new_tokens=10, min_new_tokens=10, do_sample=False)
    expected = tok.decode(ref[0, ids.shape[1] :])

    entry = {
        "name": "tiny-hf",
        "path": "tiny-hf",
        "runtime": "transformers",
        "timeout_s": 60.0,
        "generation": {"n_ctx": 256, "n_threads": 1},
    }
    config = write_config(tmp_path, [entry])
    async with running_server(config) as (_, client):
        body = {"text_input": PROMPT, "parameters": {"max_tokens": 10, "temperature": 0}}
        # The first request waits for the load (importing transformers in the worker
        # takes tens of seconds on a busy 2-core machine).
        r = await client.post("/v2/models/tiny-hf/generate", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["text_output"] == expected
        assert r.json()["completion_tokens"] == 10
