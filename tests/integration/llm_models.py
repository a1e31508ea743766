"""Tiny GGUF models for the generation tests, written once per session (no hub)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modelyard.examples.gguf_llama import LlamaShape, write_llama_gguf
from modelyard.protocol.generate import GenerateRequest, SamplingParams
from modelyard.runtimes.base import RuntimeSpec
from modelyard.workers.instance import GenerativeInstance

TINY = LlamaShape(layers=2, width=128, feed_forward=256, heads=4, kv_heads=2, merges=200)
"""About 1 MB: fast enough for every test; the example sizes are in ``SHAPES``."""
OTHER = LlamaShape(layers=3, width=128, feed_forward=256, heads=4, kv_heads=2, merges=200)

N_CTX = 256
PROMPT = "The quick brown fox jumps over the lazy dog. A model server keeps"
N_TOKENS = 24
"""Greedy tokens the ``expected`` fixture (tests/integration/conftest.py) holds."""


def build_llm_repository(root: Path) -> Path:
    """``<root>/llama-a/1/model.gguf`` and ``<root>/llama-b/1/model.gguf``; returns root."""
    write_llama_gguf(root / "llama-a" / "1" / "model.gguf", TINY, seed=1)
    write_llama_gguf(root / "llama-b" / "1" / "model.gguf", OTHER, seed=2)
    return root


def llm_model(name: str, **fields: Any) -> dict[str, Any]:
    """A ``models:`` entry for one of the test GGUFs."""
    generation = {"n_ctx": N_CTX, "parallel": 2, "n_threads": 1, "n_batch": 64}
    generation.update(fields.pop("generation", {}))
    return {
        "name": name,
        "path": name,
        "runtime": "llama_cpp",
        "timeout_s": 30.0,
        "generation": generation,
        **fields,
    }


def greedy_request(max_tokens: int | None) -> GenerateRequest:
    """``PROMPT`` to ``llama-a``, greedy (so its text is :func:`reference_tokens`')."""
    return GenerateRequest(
        model="llama-a",
        version=None,
        prompt=PROMPT,
        messages=None,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
    )


def reference_tokens(path: Path, prompt: str, n: int, lora: Path | None = None) -> list[int]:
    """Greedy tokens of llama-cpp-python run in-process on ``path`` (the peer's own code),
    with the LoRA adapter ``lora`` applied to its context if given."""
    from llama_cpp import Llama

    llm = Llama(
        model_path=str(path),
        lora_path=None if lora is None else str(lora),
        n_ctx=N_CTX,
        n_threads=1,
        n_batch=64,
        verbose=False,
        seed=0,
    )
    try:
        tokens = llm.tokenize(prompt.encode(), add_bos=True, special=True)
        out: list[int] = []
        for token in llm.generate(tokens, temp=0.0, top_k=0, top_p=1.0, min_p=0.0):
            if llm.token_eos() == token or len(out) >= n:
                break
            out.append(token)
        return out
    finally:
        llm.close()


def llama_spec(llm_root: Path, name: str = "llama-a") -> RuntimeSpec:
    """A worker's spec of one of :func:`build_llm_repository`'s GGUF models: ``N_CTX`` tokens
    of context, one thread."""
    options = {"n_ctx": str(N_CTX), "n_threads": "1", "n_batch": "64"}
    return RuntimeSpec("llama_cpp", str(llm_root / name / "1"), name, options=options)


async def greedy_ids(instance: GenerativeInstance) -> list[int]:
    """The token ids ``instance`` generates for :func:`greedy_request` of ``N_TOKENS``."""
    ids: list[int] = []
    async for chunk in instance.generate(greedy_request(N_TOKENS)):
        ids += chunk.token_ids
    return ids
