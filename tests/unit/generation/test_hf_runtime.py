"""The ``transformers`` runtime in-process: greedy output equals ``model.generate``."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelyard.runtimes.base import RuntimeSpec
from modelyard.runtimes.generation import GenerationJob
from modelyard.runtimes.hf_causal_lm import CausalLMRuntime
from tests.unit.generation.sinks import CollectingSink

torch = pytest.importorskip("torch", reason="the torch extra runs transformers models")
pytest.importorskip("transformers", reason="the torch extra runs transformers models")

PROMPT = "The quick brown fox jumps over the lazy dog."

pytestmark = pytest.mark.slow  # training the tokenizer and importing transformers: ~10 s


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from modelyard.examples.hf_tiny_llama import write_tiny_causal_lm

    return write_tiny_causal_lm(tmp_path_factory.mktemp("hf") / "1")


def _job(seq: int, max_tokens: int, **kw: object) -> GenerationJob:
    fields: dict[str, object] = {
        "prompt": PROMPT,
        "messages": None,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 0,
        "seed": None,
        "stop": (),
    }
    fields.update(kw)
    return GenerationJob(seq, **fields)  # type: ignore[arg-type]


def test_greedy_equals_generate_and_chat_renders(hf_folder: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_folder)
    model = AutoModelForCausalLM.from_pretrained(hf_folder)
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    ref = model.generate(ids, max_new_tokens=12, do_sample=False, min_new_tokens=12)
    expected = [int(t) for t in ref[0, ids.shape[1] :]]

    runtime = CausalLMRuntime()
    runtime.load(RuntimeSpec("transformers", str(hf_folder), options={"n_ctx": "128"}))
    sink = CollectingSink()
    runtime.start(sink)
    try:
        runtime.submit(_job(1, 12))
        report = sink.wait(1)
        assert report.token_ids == expected
        assert report.finish_reason == "length"
        assert report.text == tok.decode(expected)
        runtime.submit(_job(2, 4, prompt=None, messages=(("user", "hello"),)))
        assert sink.wait(2).completion_tokens == 4
        runtime.submit(_job(3, 500))
        assert sink.wait(3).error is not None
        assert "context" in (sink.reports[3].error or ("", ""))[1]
        runtime.submit(_job(4, 8, temperature=0.8, top_k=20, top_p=0.9, seed=5))
        runtime.submit(_job(5, 8, temperature=0.8, top_k=20, top_p=0.9, seed=5))
        assert sink.wait(4).token_ids == sink.wait(5).token_ids
    finally:
        runtime.close()


def test_a_resumed_job_continues_where_it_stopped(hf_folder: Path) -> None:
    runtime = CausalLMRuntime()
    runtime.load(RuntimeSpec("transformers", str(hf_folder), options={"n_ctx": "128"}))
    sink = CollectingSink()
    runtime.start(sink)
    try:
        runtime.submit(_job(1, 10))
        whole = sink.wait(1).token_ids
        runtime.submit(_job(2, 10, resume_ids=tuple(whole[:4])))
        rest = sink.wait(2)
        assert rest.token_ids == whole[4:]
        assert rest.completion_tokens == 10
    finally:
        runtime.close()
