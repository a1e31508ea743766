"""Many LoRA adapters over one base model: resident memory and the cost of a switch.

Run from the repository root (the ``llm`` and ``bench`` extras installed)::

    .venv/bin/python bench/bench_lora.py                  # 20 adapters, ~1 minute
    .venv/bin/python bench/bench_lora.py --adapters 5 --shape small
    .venv/bin/python bench/bench_lora.py --size 7b --adapters 2 --rounds 3 --no-cold

A random-weight llama GGUF (``--shape``, default the example's "medium", about 250 MB)
and ``--adapters`` random LoRA adapters for it (rank 8 on attention and feed-forward, F16
unless ``--adapter-type f32``, ``modelyard.examples.gguf_lora``) are written at run
time (``--size``: a real model's shape, ``bench/write_llama_sizes.py``). One modelyard
server serves the base and every adapter (``base:`` in the YAML); each adapter is a
context inside the base's worker process.

* **Switch**: a request that must load its model, interleaved per round: the base
  itself (unloaded first, which unloads its adapters too) with its file in the page
  cache and with it dropped; the same file as ``plain``, a model no adapter names (so
  its load makes no spare context: a base load as any model's); then an adapter over
  the resident base (its tensors read and applied to the context its base made ahead,
  ``spare_context``). Two levels: the server's load
  (``last_load.total_s``) and the request's first token (which adds the prompt's
  decode, the same for both). Medians over ``--rounds``, same run.
* **Memory**: with every adapter loaded, the summed PSS of the server's workers (one
  process: the base's) against ``base file + N x (adapter file + KV cache) + the base's
  own KV cache``; the difference is the overhead, split into the worker's fixed part
  (its PSS with the base alone, less the file and the base's KV cache) and the part per
  adapter (the growth per adapter less its file and its KV cache: llama.cpp's compute
  buffers of its context). The budget's reservation against the same sum.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import _server
import httpx
import psutil
import write_llama_sizes

from modelyard.examples.gguf_llama import SHAPES, LlamaShape, write_llama_gguf
from modelyard.examples.gguf_lora import write_lora_gguf
from modelyard.repository import page_cache

N_CTX = 512
MIB = 1024 * 1024


def first_token_s(client: httpx.Client, model: str) -> float:
    """Seconds to the first streamed text of a one-token completion."""
    body = {"model": model, "prompt": "Hello world", "max_tokens": 1, "temperature": 0}
    started = time.perf_counter()
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and '"text"' in line:
                return time.perf_counter() - started
    return time.perf_counter() - started


def workers_pss(pid: int) -> tuple[int, int]:
    """``(summed PSS of the workers, their count)``: children of the server that map a GGUF."""
    total = count = 0
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if not any(m.path.endswith(".gguf") for m in child.memory_maps(grouped=True)):
                continue
            total += child.memory_full_info().pss
            count += 1
        except psutil.Error:
            continue
    return total, count


def link_or_copy(source: Path, target: Path) -> None:
    """``target`` as a hard link to ``source`` (a copy across file systems)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def write_base(path: Path, shape_name: str, size: str | None) -> tuple[Path, LlamaShape]:
    """The base model's file and the shape its adapters are made for: an example shape
    (F16), or with ``size`` a real model's (Q4_0, ``write_llama_sizes.py``)."""
    if size is None:
        shape = SHAPES[shape_name]
        return write_llama_gguf(path, shape, seed=1), shape
    path.parent.mkdir(parents=True, exist_ok=True)
    s = write_llama_sizes.SIZES[size]
    shape = LlamaShape(s.layers, s.width, s.feed_forward, s.heads, s.kv_heads, s.context)
    return write_llama_sizes.write(s, path, seed=1), shape


def main() -> None:
    """Write the files, serve them, measure, print and save."""
    parser = _server.arg_parser(__doc__)
    parser.add_argument("--adapters", type=int, default=20)
    parser.add_argument("--shape", default="medium", choices=sorted(SHAPES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--size",
        choices=sorted(write_llama_sizes.SIZES),
        help="a real model's shape instead (bench/write_llama_sizes.py: Q4_0, 0.6-7.3 GB)",
    )
    parser.add_argument("--no-cold", action="store_true", help="skip the cold base loads")
    parser.add_argument("--adapter-type", choices=("f16", "f32"), default="f16")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-lora-") as tmp:
        root = Path(tmp)
        base, shape = write_base(root / "base" / "1" / "model.gguf", args.shape, args.size)
        base_bytes = base.stat().st_size
        names = [f"lora-{i:02d}" for i in range(args.adapters)]
        adapter_bytes = sum(
            write_lora_gguf(
                root / n / "1" / "adapter.gguf", shape, seed=100 + i, dtype=args.adapter_type
            )
            .stat()
            .st_size
            for i, n in enumerate(names)
        )
        gen = {"n_ctx": N_CTX, "n_threads": 1}
        models: list[dict[str, Any]] = [
            {"name": "base", "path": "base", "runtime": "llama_cpp", "generation": gen}
        ]
        models += [
            {"name": n, "path": n, "runtime": "llama_cpp", "base": "base", "generation": gen}
            for n in names
        ]
        # The same weights as a model no adapter names: its worker keeps no spare context,
        # so its load is a base load without the context made ahead for adapters.
        link_or_copy(base, root / "plain" / "1" / "model.gguf")
        models.append({"name": "plain", "path": "plain", "runtime": "llama_cpp", "generation": gen})
        cfg = _server.write_config(root, models, budget_mb=16384)
        with _server.Server(cfg, root / "server.log") as server:
            client = server.client
            first_token_s(client, "base")
            time.sleep(1.0)  # footprint committed
            base_pss, _ = workers_pss(server.pid)
            kinds = ("base_warm", "base_cold", "plain_warm", "adapter")
            ttft: dict[str, list[float]] = {k: [] for k in kinds}
            load: dict[str, list[float]] = {k: [] for k in kinds}
            for r in range(args.rounds):
                # Unloading the base takes its adapters with it. The base is loaded with
                # its file in the page cache, then with it dropped (read from disk by the
                # first decode); an adapter is loaded over the resident base, once the
                # base's load has settled (its footprint measured).
                for kind in ("base_warm",) if args.no_cold else ("base_warm", "base_cold"):
                    server.post("/v2/repository/models/base/unload")
                    if kind == "base_cold":
                        page_cache.drop(base)
                    ttft[kind].append(first_token_s(client, "base"))
                    load[kind].append(server.committed_stats("base")["last_load"]["total_s"])
                server.post("/v2/repository/models/plain/unload")
                ttft["plain_warm"].append(first_token_s(client, "plain"))
                load["plain_warm"].append(server.committed_stats("plain")["last_load"]["total_s"])
                server.post("/v2/repository/models/plain/unload")
                name = names[r % len(names)]
                ttft["adapter"].append(first_token_s(client, name))
                load["adapter"].append(server.committed_stats(name)["last_load"]["total_s"])
            for name in names:
                first_token_s(client, name)
            time.sleep(1.0)  # footprints committed
            stats = server.committed_stats(names[0])
            kv = int(stats["worker"].get("kv_cache_bytes", 0))
            pss, workers = workers_pss(server.pid)
            budget = client.get("/v2/stats").json()
            reserved = sum(m["reserved_bytes"] for m in budget["models"])
    n = args.adapters
    # The base itself is served too: its own KV cache is in the workers' memory.
    expected = base_bytes + adapter_bytes + (n + 1) * kv
    result: dict[str, Any] = {
        "adapters": n,
        "shape": args.size or args.shape,
        "base_file_mib": base_bytes / MIB,
        "adapter_type": args.adapter_type,
        "adapter_file_mib": adapter_bytes / n / MIB,
        "kv_cache_mib": kv / MIB,
        "workers": workers,
        "workers_pss_mib": pss / MIB,
        "base_plus_n_adapter_and_context_mib": expected / MIB,
        "overhead_mib": (pss - expected) / MIB,
        "base_worker_alone_pss_mib": base_pss / MIB,
        "fixed_overhead_mib": (base_pss - base_bytes - kv) / MIB,
        "overhead_per_adapter_mib": ((pss - base_pss) - adapter_bytes - n * kv) / n / MIB,
        "reserved_mib": reserved / MIB,
    }
    result["rounds_ms"] = {
        f"{level}_{kind}": [round(x * 1000, 1) for x in series[kind]]
        for level, series in (("load", load), ("ttft", ttft))
        for kind in series
    }
    for kind in (k for k in ("base_warm", "base_cold", "plain_warm", "adapter") if ttft[k]):
        result[f"ttft_{kind}_ms"] = statistics.median(ttft[kind]) * 1000
        result[f"load_{kind}_ms"] = statistics.median(load[kind]) * 1000
    for key, value in result.items():
        print(f"{key}: {value:.2f}" if isinstance(value, float) else f"{key}: {value}")
    for level, series in (("load", load), ("ttft", ttft)):
        for base_kind in ("base_warm", "base_cold", "plain_warm"):
            if not series[base_kind]:
                continue
            ratio = result[f"{level}_adapter_ms"] / result[f"{level}_{base_kind}_ms"]
            # Each round's adapter against the same round's base: less of the machine's
            # drift than a ratio of medians.
            pairs = [a / b for a, b in zip(series["adapter"], series[base_kind], strict=True)]
            paired = statistics.median(pairs)
            result[f"{level}_adapter_over_{base_kind}_paired"] = paired
            print(
                f"adapter switch / {base_kind.replace('_', ' ')} load ({level}): {ratio:.2f} "
                f"(median of per-round ratios {paired:.2f})"
            )
    out = _server.write_results("lora", {"environment": _server.environment(), **result})
    print(f"results: {out}")


if __name__ == "__main__":
    main()
