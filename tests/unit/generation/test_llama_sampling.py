"""llama.cpp's own samplers for one sequence, in process: grammars from JSON Schemas,
logit biases, penalties, logprobs aligned with the reported tokens, tokenize and
detokenize jobs, and refusals that leave the generation thread serving."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from modelyard.errors import InvalidInputError
from modelyard.runtimes.base import RuntimeSpec
from modelyard.runtimes.generation import GenerationJob
from modelyard.runtimes.llama_sampling import check_schema, schema_grammar
from tests.unit.generation.sinks import CollectingSink, greedy_job

pytest.importorskip("llama_cpp", reason="the llm extra runs GGUF models")
pytest.importorskip("gguf", reason="the llm extra writes the test models")
pytest.importorskip("jsonschema", reason="validates the constrained answers")
import jsonschema  # type: ignore[import-untyped]

from modelyard.runtimes.llama_cpp import LlamaCppRuntime

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, CollectingSink]]:
    from modelyard.examples.gguf_llama import LlamaShape, write_llama_gguf

    folder = tmp_path_factory.mktemp("llama") / "1"
    shape = LlamaShape(layers=2, width=64, feed_forward=128, heads=4, kv_heads=2, merges=50)
    write_llama_gguf(folder / "model.gguf", shape, seed=3)
    rt = LlamaCppRuntime()
    options = {"n_ctx": "256", "n_threads": "1", "n_batch": "32", "parallel": "2"}
    rt.load(RuntimeSpec("llama_cpp", str(folder), "tiny", options=options))
    sink = CollectingSink()
    rt.start(sink)
    try:
        yield rt, sink
    finally:
        rt.close()


_SEQ = iter(range(1, 10_000))


def _run(runtime: tuple[Any, CollectingSink], **fields: Any) -> Any:
    rt, sink = runtime
    seq = next(_SEQ)
    prompt = fields.pop("prompt", "hello there")
    rt.submit(greedy_job(seq, prompt, **fields))
    return sink.wait(seq)


def test_a_schema_constrains_every_draw(runtime: tuple[Any, CollectingSink]) -> None:
    for seed in range(4):
        report = _run(
            runtime,
            json_schema=json.dumps(SCHEMA),
            temperature=1.0,
            seed=seed,
            max_tokens=60,
        )
        assert report.error is None
        assert report.finish_reason == "stop", report.text
        jsonschema.validate(json.loads(report.text), SCHEMA)
    free = _run(runtime, max_tokens=12)
    with pytest.raises(json.JSONDecodeError):
        json.loads(free.text)


def test_logprobs_are_one_per_token_even_across_stop_strings(
    runtime: tuple[Any, CollectingSink],
) -> None:
    plain = _run(runtime, max_tokens=10)
    report = _run(runtime, max_tokens=10, logprobs=3)
    assert report.text == plain.text  # asking for logprobs changes nothing else
    assert len(report.logprobs) == len(report.token_ids) == report.completion_tokens
    assert [lp.token_id for lp in report.logprobs] == report.token_ids
    for lp in report.logprobs:
        assert lp.logprob <= 0.0
        assert len(lp.top) == 3
        assert lp.top[0][0] == lp.token_id  # greedy: the best is the one taken
    cut = plain.text[len(plain.text) // 2 :][:3]
    if cut.strip():
        stopped = _run(runtime, max_tokens=10, logprobs=0, stop=(cut,))
        assert len(stopped.logprobs) == len(stopped.token_ids)


def test_logit_bias_and_penalties_are_llama_cpp_samplers(
    runtime: tuple[Any, CollectingSink],
) -> None:
    plain = _run(runtime, max_tokens=6)
    first = plain.token_ids[0]
    banned = _run(runtime, max_tokens=6, logit_bias=((first, -100.0),))
    assert banned.token_ids[0] != first
    forced = _run(runtime, max_tokens=3, logit_bias=((7, 100.0),))
    assert forced.token_ids == [7, 7, 7]
    penalised = _run(runtime, max_tokens=3, logit_bias=((7, 5.0),), frequency_penalty=2.0)
    assert penalised.token_ids != forced.token_ids


def test_bad_jobs_fail_alone_and_the_thread_keeps_serving(
    runtime: tuple[Any, CollectingSink],
) -> None:
    bad_bias = _run(runtime, logit_bias=((10**7, 1.0),))
    assert bad_bias.error is not None
    assert "logit_bias" in bad_bias.error[1]
    bad_schema = _run(runtime, json_schema='{"type": "array", "minItems": 100000000}')
    assert bad_schema.error is not None
    assert "response_format" in bad_schema.error[1]
    assert _run(runtime).finish_reason == "length"


def test_tokenize_and_detokenize_jobs_round_trip(runtime: tuple[Any, CollectingSink]) -> None:
    text = "hello there, general"
    tokens = _run(runtime, prompt=text, task="tokenize")
    assert tokens.finish_reason == "stop"
    assert len(tokens.token_ids) > 1
    assert b"".join(p.piece for p in tokens.logprobs).decode() == text
    with_bos = _run(runtime, prompt=text, task="tokenize", add_special=True)
    assert with_bos.token_ids[1:] == tokens.token_ids
    back = _run(runtime, prompt=None, task="detokenize", token_ids=tuple(tokens.token_ids))
    assert back.text == text
    bad = _run(runtime, prompt=None, task="detokenize", token_ids=(10**7,))
    assert bad.error is not None


def test_schemas_that_would_blow_up_the_grammar_are_refused() -> None:
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(40):
        deep = {"type": "array", "items": deep}
    with pytest.raises(InvalidInputError, match="nests deeper"):
        check_schema(deep)
    with pytest.raises(InvalidInputError, match="maxLength"):
        schema_grammar(json.dumps({"type": "string", "maxLength": 10**6}))
    with pytest.raises(InvalidInputError, match="response_format"):
        schema_grammar(json.dumps({"$ref": "https://example.com/schema.json"}))
    assert "root ::=" in schema_grammar(json.dumps(SCHEMA))


def test_a_chat_with_tools_tells_a_template_without_tools_about_them(
    runtime: tuple[Any, CollectingSink],
) -> None:
    tools = [{"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}]
    context = json.dumps({"messages": [{"role": "user", "content": "time?"}], "tools": tools})
    rt, _ = runtime
    job = GenerationJob(1, None, (("user", "time?"),), 4, 0.0, 1.0, 0, None, ())
    without = rt._render(job)
    with_tools = rt._render(GenerationJob(**{**_fields(job), "chat_context": context}))
    assert '"name": "now"' in with_tools
    assert '"name": "now"' not in without


def _fields(job: GenerationJob) -> dict[str, Any]:
    return {name: getattr(job, name) for name in job.__dataclass_fields__}
