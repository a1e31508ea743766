"""A worker's LoRA adapters, in process: each a context of its own over the one loaded
model (real llama.cpp, a tiny GGUF and random adapters written here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelyard.errors import ErrorCode
from modelyard.runtimes.base import RuntimeSpec
from modelyard.runtimes.generation import GenerationJob
from modelyard.runtimes.llama_backend import SPARE_CONTEXT_OPTION
from modelyard.runtimes.llama_cpp import LlamaCppRuntime
from modelyard.workers.adapter_contexts import AdapterContexts
from modelyard.workers.messages import (
    AdapterAttached,
    AdapterDetached,
    AttachAdapter,
    DetachAdapter,
    Failed,
)
from tests.unit.generation.sinks import CollectingSink, greedy_job

pytest.importorskip("llama_cpp", reason="the llm extra runs GGUF models")
pytest.importorskip("gguf", reason="the llm extra writes the test models")

OPTIONS = {"n_ctx": "128", "n_threads": "1", "n_batch": "32"}
PROMPT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from modelyard.examples.gguf_llama import LlamaShape, write_llama_gguf
    from modelyard.examples.gguf_lora import write_lora_gguf

    root = tmp_path_factory.mktemp("adapters")
    shape = LlamaShape(layers=2, width=64, feed_forward=128, heads=4, kv_heads=2, merges=200)
    other = LlamaShape(layers=3, width=64, feed_forward=128, heads=4, kv_heads=2, merges=200)
    write_llama_gguf(root / "base" / "model.gguf", shape, seed=5)
    write_lora_gguf(root / "a" / "adapter.gguf", shape, seed=6)
    write_lora_gguf(root / "other" / "adapter.gguf", other, seed=7)
    (root / "junk").mkdir()
    (root / "junk" / "adapter.gguf").write_bytes(b"GGUF" + b"\0" * 60)
    return root


def _spec(root: Path, name: str) -> RuntimeSpec:
    return RuntimeSpec("llama_cpp", str(root / name), name, options=OPTIONS)


def _job(seq: int) -> GenerationJob:
    return greedy_job(seq, PROMPT)


def test_adapters_run_beside_the_model_and_go_without_it(root: Path) -> None:
    base = LlamaCppRuntime()
    base.load(_spec(root, "base"))
    sink = CollectingSink()
    base.start(sink)
    adapters = AdapterContexts(base, sink)
    try:
        attached = adapters.attach(AttachAdapter(1, _spec(root, "a")))
        assert isinstance(attached, AdapterAttached)
        adapters.start_attached()
        assert attached.kv_cache_bytes > 0
        # Its tensors and KV cache at least (both resident once attached).
        size = (root / "a" / "adapter.gguf").stat().st_size
        assert attached.private_bytes >= size + attached.kv_cache_bytes
        runtime = adapters.runtime("a")
        assert runtime is not None
        assert runtime is not base
        runtime.submit(_job(10))
        base.submit(_job(11))
        with_adapter, without = sink.wait(10), sink.wait(11)
        assert with_adapter.error is None
        assert without.error is None
        assert with_adapter.token_ids != without.token_ids  # the adapter is applied

        detached = adapters.detach(DetachAdapter(2, "a"))
        assert isinstance(detached, AdapterDetached)
        assert adapters.runtime("a") is None
        base.submit(_job(12))  # the model serves on, the same as before
        assert sink.wait(12).token_ids == without.token_ids
    finally:
        adapters.close_all()
        base.close()


@pytest.mark.parametrize("bad", ["other", "junk"])
def test_a_bad_adapter_fails_its_attach_and_the_model_serves_on(root: Path, bad: str) -> None:
    base = LlamaCppRuntime()
    base.load(_spec(root, "base"))
    sink = CollectingSink()
    base.start(sink)
    adapters = AdapterContexts(base, sink)
    try:
        reply = adapters.attach(AttachAdapter(1, _spec(root, bad)))
        assert isinstance(reply, Failed)
        assert reply.error.code == ErrorCode.MODEL_LOAD_FAILED.value
        assert bad in reply.error.message
        assert adapters.runtime(bad) is None
        base.submit(_job(3))
        report = sink.wait(3)
        assert report.error is None
        assert report.completion_tokens > 0
    finally:
        adapters.close_all()
        base.close()


def _run_adapter(
    root: Path, base_options: dict[str, str], adapter_options: dict[str, str]
) -> tuple[list[int], bool, bool]:
    """The adapter's greedy tokens, and whether the base had a spare context right after
    the attach and after the attach's follow-up."""
    base = LlamaCppRuntime()
    base.load(RuntimeSpec("llama_cpp", str(root / "base"), "base", options=base_options))
    sink = CollectingSink()
    base.start(sink)
    adapters = AdapterContexts(base, sink)
    try:
        spec = RuntimeSpec("llama_cpp", str(root / "a"), "a", options=adapter_options)
        assert isinstance(adapters.attach(AttachAdapter(1, spec)), AdapterAttached)
        after_attach = base.has_spare_context
        adapters.start_attached()
        after_start = base.has_spare_context
        runtime = adapters.runtime("a")
        assert runtime is not None
        runtime.submit(_job(5))
        report = sink.wait(5)
        assert report.error is None
        return list(report.token_ids), after_attach, after_start
    finally:
        adapters.close_all()
        base.close()


def test_an_adapter_takes_the_context_made_ahead_and_the_next_one_is_made(root: Path) -> None:
    fresh, _, _ = _run_adapter(root, OPTIONS, OPTIONS)
    spare_options = OPTIONS | {SPARE_CONTEXT_OPTION: "1"}
    tokens, after_attach, after_start = _run_adapter(root, spare_options, OPTIONS)
    assert not after_attach  # the adapter took the context made at the base's load
    assert after_start  # and the next adapter's was made after the attach's reply
    assert tokens == fresh  # applied over a context made ahead, as over a new one


def test_a_context_made_for_other_options_is_kept_for_an_adapter_that_fits(root: Path) -> None:
    spare_options = OPTIONS | {SPARE_CONTEXT_OPTION: "1"}
    _, after_attach, _ = _run_adapter(root, spare_options, OPTIONS | {"n_ctx": "64"})
    assert after_attach  # the adapter made its own context; the spare waits on
