"""Prompt-prefix reuse in the llama.cpp runtime: a prompt that starts with tokens a slot
already evaluated evaluates only the rest, and greedy output is the same as without reuse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from modelyard.examples.gguf_llama import CORPUS
from modelyard.runtimes.base import RuntimeSpec
from modelyard.runtimes.generation import GenerationJob
from modelyard.runtimes.llama_cpp import LlamaCppRuntime
from modelyard.runtimes.prompt_prefix import SlotPrefixes, common_prefix
from tests.unit.generation.sinks import CollectingSink, greedy_job

pytest.importorskip("llama_cpp", reason="the llm extra runs GGUF models")
pytest.importorskip("gguf", reason="the llm extra writes the test models")

PREFIX = " ".join(CORPUS.split()[:150])
"""A shared header of a few hundred tokens (a system prompt, a few-shot preamble)."""
QUESTIONS = (" Question: what is the capital?", " Question: one, two, three?")


@pytest.fixture(scope="module")
def gguf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from modelyard.examples.gguf_llama import LlamaShape, write_llama_gguf

    folder = tmp_path_factory.mktemp("llama") / "1"
    shape = LlamaShape(layers=2, width=64, feed_forward=128, heads=4, kv_heads=2, merges=200)
    write_llama_gguf(folder / "model.gguf", shape, seed=5)
    return folder


def _job(seq: int, prompt: str) -> GenerationJob:
    return greedy_job(seq, prompt)


def _serve(folder: Path, prompts: list[str], **options: str) -> tuple[list[list[int]], Any]:
    """Each prompt in turn (one job at a time); the generated ids and the final counters."""
    runtime = LlamaCppRuntime()
    opts = {"n_ctx": "1024", "n_threads": "1", "n_batch": "128", **options}
    runtime.load(RuntimeSpec("llama_cpp", str(folder), "m", options=opts))
    sink = CollectingSink()
    runtime.start(sink)
    try:
        outputs = []
        for seq, prompt in enumerate(prompts, start=1):
            runtime.submit(_job(seq, prompt))
            report = sink.wait(seq)
            assert report.error is None, report.error
            outputs.append(report.token_ids)
        return outputs, runtime.stats()
    finally:
        runtime.close()


def test_a_shared_prefix_is_evaluated_once_with_the_same_greedy_output(gguf_folder: Path) -> None:
    prompts = [PREFIX + q for q in QUESTIONS] + [PREFIX + QUESTIONS[0]]
    plain, plain_stats = _serve(gguf_folder, prompts, prefix_reuse="false")
    reused, stats = _serve(gguf_folder, prompts)

    assert reused == plain, "reusing the cached prefix changes no greedy token"
    assert plain_stats.reused_prompt_tokens == 0
    assert stats.prompt_tokens == plain_stats.prompt_tokens, "usage counts the whole prompt"
    # The second prompt shares the header; the third repeats the first after it ran.
    header = len(prompts[0]) // 8  # far fewer tokens than characters, far more than 0
    assert stats.reused_prompt_tokens > 2 * header
    evaluated = stats.prompt_tokens - stats.reused_prompt_tokens
    assert evaluated < plain_stats.prompt_tokens / 2


def test_parallel_slots_each_keep_their_own_prefix(gguf_folder: Path) -> None:
    other = " ".join(CORPUS.split()[150:])
    prompts = [PREFIX + QUESTIONS[0], other, PREFIX + QUESTIONS[1], other + " Again."]
    _, stats = _serve(gguf_folder, prompts, parallel="2")
    # Two headers alternate; with two slots neither pushes the other out.
    _, one_slot = _serve(gguf_folder, prompts, parallel="1")
    # One slot reuses no more than the BOS token each time; two keep both headers.
    assert one_slot.reused_prompt_tokens <= len(prompts)
    assert stats.reused_prompt_tokens > one_slot.reused_prompt_tokens + 100


def test_the_slot_choice_takes_the_longest_start_and_evaluates_the_last_token() -> None:
    slots = SlotPrefixes(3)
    slots.keep(0, [1, 2])
    slots.keep(1, [1, 2, 3, 4, 5])
    assert slots.choose([0, 1, 2], [1, 2, 3, 4, 9]) == (1, 4)
    # A prompt the slot holds entirely still evaluates its last token (for its logits).
    assert slots.choose([0, 2], [1, 2]) == (0, 1)
    # No match: the empty slot, not one whose cache it would drop.
    assert slots.choose([0, 1, 2], [7, 8])[0] == 2
    # A BOS-only match does not wipe a held header while an empty slot is free.
    slots.forget(2)
    assert slots.choose([1, 2], [1, 7, 8]) == (2, 0)
    assert common_prefix([1, 2], [1, 2, 3]) == 2


def test_an_unreadable_prefix_reuse_option_is_refused(gguf_folder: Path) -> None:
    runtime = LlamaCppRuntime()
    opts = {"n_ctx": "128", "n_threads": "1", "prefix_reuse": "maybe"}
    try:
        with pytest.raises(ValueError, match="prefix_reuse"):
            runtime.load(RuntimeSpec("llama_cpp", str(gguf_folder), "m", options=opts))
    finally:
        runtime.close()
