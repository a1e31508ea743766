"""What a llama.cpp load does on a switch's path, and what it leaves for later: the chat
template is compiled when a chat request first needs it, the dimensions come from the
metadata llama.cpp has read (not a second parse of the file's header), and the warm-up
decode is the caller's choice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from modelyard.repository.gguf import llama_dims, read_metadata
from modelyard.runtimes import chat_template
from modelyard.runtimes import llama_cpp as llama_runtime
from modelyard.runtimes import llama_dims as llama_dims_module
from modelyard.runtimes.base import RuntimeSpec
from modelyard.runtimes.generation import GenerationJob
from tests.unit.generation.sinks import CollectingSink

pytest.importorskip("llama_cpp", reason="the llm extra runs GGUF models")
pytest.importorskip("gguf", reason="the llm extra writes the test models")

_OPTIONS = {"n_ctx": "128", "n_threads": "1", "n_batch": "32"}


@pytest.fixture(scope="module")
def gguf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from modelyard.examples.gguf_llama import LlamaShape, write_llama_gguf

    folder = tmp_path_factory.mktemp("llama") / "1"
    shape = LlamaShape(layers=2, width=64, feed_forward=128, heads=4, kv_heads=2, merges=50)
    write_llama_gguf(folder / "model.gguf", shape, seed=3)
    return folder


def _job(seq: int, **fields: Any) -> GenerationJob:
    base: dict[str, Any] = {
        "prompt": "hello there",
        "messages": None,
        "max_tokens": 3,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 0,
        "seed": None,
        "stop": (),
    }
    base.update(fields)
    return GenerationJob(seq, **base)


def test_the_load_compiles_no_chat_template_until_a_chat_request(
    gguf_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled: list[str] = []
    real = chat_template.compile_chat_template

    def counting(source: str) -> Any:
        compiled.append(source)
        return real(source)

    monkeypatch.setattr(llama_runtime, "compile_chat_template", counting)
    runtime = llama_runtime.LlamaCppRuntime()
    runtime.load(RuntimeSpec("llama_cpp", str(gguf_folder), "m", options=_OPTIONS))
    sink = CollectingSink()
    runtime.start(sink)
    try:
        assert compiled == [], "a load compiles no template"
        runtime.submit(_job(1))
        assert sink.wait(1).error is None
        assert compiled == [], "nor does a completion"
        runtime.submit(_job(2, prompt=None, messages=(("user", "hi"),)))
        runtime.submit(_job(3, prompt=None, messages=(("user", "hello"),)))
        assert sink.wait(2).error is None
        assert sink.wait(3).error is None
        assert len(compiled) == 1, "the first chat request compiles it, once"
    finally:
        runtime.close()


def test_the_load_reads_the_dimensions_from_llama_cpp_not_the_header(
    gguf_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from_header = llama_dims(read_metadata(gguf_folder / "model.gguf"))

    def no_parse(path: Path) -> Any:
        raise AssertionError(f"{path} parsed again")

    monkeypatch.setattr(llama_dims_module, "read_metadata", no_parse)
    runtime = llama_runtime.LlamaCppRuntime()
    runtime.load(RuntimeSpec("llama_cpp", str(gguf_folder), "m", options={"n_threads": "1"}))
    try:
        stats = runtime.stats()
        # The trained context (no n_ctx set) and the KV cache as the header gives them.
        assert stats.context_length == from_header.context_length
        assert stats.kv_cache_bytes == from_header.context_length * from_header.kv_bytes_per_token()
    finally:
        runtime.close()


def test_a_resumed_job_continues_where_it_stopped(gguf_folder: Path) -> None:
    runtime = llama_runtime.LlamaCppRuntime()
    runtime.load(RuntimeSpec("llama_cpp", str(gguf_folder), "m", options=_OPTIONS))
    sink = CollectingSink()
    runtime.start(sink)
    try:
        runtime.submit(_job(1, max_tokens=12))
        whole = sink.wait(1).token_ids
        assert len(whole) == 12
        runtime.submit(_job(2, max_tokens=12, resume_ids=tuple(whole[:5])))
        rest = sink.wait(2)
        assert rest.token_ids == whole[5:], "the same greedy tokens, none sent twice"
        assert rest.completion_tokens == 12, "the resumed tokens count as generated"
    finally:
        runtime.close()


def test_an_unknown_weights_choice_is_refused(gguf_folder: Path) -> None:
    runtime = llama_runtime.LlamaCppRuntime()
    opts = {"n_ctx": "128", "n_threads": "1", "weights": "copied"}
    try:
        with pytest.raises(ValueError, match="'weights' must be"):
            runtime.load(RuntimeSpec("llama_cpp", str(gguf_folder), "m", options=opts))
    finally:
        runtime.close()
