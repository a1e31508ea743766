"""Preemption of generation by priority: how long an urgent request waits behind a long one.

Run from the repository root (``PYTHONPATH=src``)::

    .venv/bin/python bench/bench_preemption.py [--long-tokens 400] [--urgent-tokens 16] [--rounds 3]

One GGUF model (the ``tiny`` example shape, random weights) with ``parallel: 1`` in a
real worker, served by an in-process server. Each round: a greedy priority-3 stream of
``--long-tokens``; after its 8th chunk, a greedy priority-1 request of
``--urgent-tokens``. Measured: the urgent request's latency (sent → last token) and the
long stream's total time, with ``generation.preempt`` on and off (one server each, same
file); with preemption the long stream's tokens are checked to be those of the run
without it. Medians of the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from modelyard.app import App
from modelyard.config.settings import load_settings
from modelyard.protocol.generate import GenerateRequest, SamplingParams

PROMPT = "The quick brown fox jumps over the lazy dog. A model server keeps"


def _request(max_tokens: int, priority: int) -> GenerateRequest:
    return GenerateRequest(
        model="llm",
        version=None,
        prompt=PROMPT,
        messages=None,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
        priority=priority,
        timeout_s=600.0,
    )


async def _round(app: App, long_tokens: int, urgent_tokens: int) -> tuple[float, float, list[int]]:
    urgent_s: list[float] = []

    async def urgent() -> None:
        t0 = time.perf_counter()
        async for _ in app.dataplane.generate(_request(urgent_tokens, 1)):
            pass
        urgent_s.append(time.perf_counter() - t0)

    ids: list[int] = []
    task: asyncio.Task[None] | None = None
    t0 = time.perf_counter()
    chunks = 0
    async for chunk in app.dataplane.generate(_request(long_tokens, 3)):
        ids += chunk.token_ids
        chunks += 1
        if chunks == 8:
            task = asyncio.create_task(urgent())
    long_s = time.perf_counter() - t0
    assert task is not None
    await task
    return urgent_s[0], long_s, ids


async def _mode(root: Path, preempt: bool, args: argparse.Namespace) -> dict[str, object]:
    model = {
        "name": "llm",
        "path": "llm",
        "timeout_s": 600.0,
        "generation": {"parallel": 1, "n_ctx": 1024, "n_threads": 1, "preempt": preempt},
    }
    cfg = root / f"preempt-{preempt}.yaml"
    cfg.write_text(yaml.safe_dump({"model_repository": ".", "models": [model]}), "utf-8")
    settings = load_settings(cfg, host="127.0.0.1", http_port=0, grpc_port="off")
    app = App(settings)
    await app.start()
    try:
        await _round(app, 16, 4)  # loads the model; not counted
        rows = [await _round(app, args.long_tokens, args.urgent_tokens) for _ in range(args.rounds)]
        alone = [
            i
            async for c in app.dataplane.generate(_request(args.long_tokens, 3))
            for i in c.token_ids
        ]
    finally:
        await app.stop()
    return {
        "urgent_s": statistics.median(r[0] for r in rows),
        "long_s": statistics.median(r[1] for r in rows),
        "identical": all(r[2] == alone for r in rows),
    }


async def main(args: argparse.Namespace) -> None:
    from modelyard.examples.gguf_llama import SHAPES, write_llama_gguf

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_llama_gguf(root / "llm" / "1" / "model.gguf", SHAPES["tiny"], seed=1)
        on = await _mode(root, True, args)
        off = await _mode(root, False, args)
    print(
        f"long stream {args.long_tokens} tokens (priority 3), urgent {args.urgent_tokens} "
        f"tokens (priority 1), parallel 1, median of {args.rounds}"
    )
    for name, row in (("preempt off", off), ("preempt on", on)):
        print(
            f"  {name:11}  urgent latency {float(str(row['urgent_s'])):.3f} s, "
            f"long stream {float(str(row['long_s'])):.3f} s, long output identical: "
            f"{row['identical']}"
        )
    ratio = float(str(off["urgent_s"])) / float(str(on["urgent_s"]))
    cost = float(str(on["long_s"])) / float(str(off["long_s"]))
    print(f"  urgent latency off/on: {ratio:.1f}x; long stream on/off: {cost:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long-tokens", type=int, default=400)
    parser.add_argument("--urgent-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
