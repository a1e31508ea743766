"""Many LoRA adapters over one base model: resident memory and the cost of a switch.

Run from the repository root (the ``llm`` and ``bench`` extras installed)::

    .venv/bin/python bench/bench_lora.py                  # 20 adapters, ~2 minutes
    .venv/bin/python bench/bench_lora.py --adapters 5 --shape small

A random-weight llama GGUF (``--shape``, default the example's "medium", about 250 MB)
and ``--adapters`` random LoRA adapters for it (rank 8 on attention and feed-forward,
``modelyard.examples.gguf_lora``) are written at run time. One modelyard server serves
the base and every adapter (``base:`` in the YAML), each loaded by one request.

* **Memory**: the summed PSS of the server's workers (the base file's pages counted once
  among its mappers, as PSS divides shared pages) against ``base file + N x (adapter file
  + KV cache)``, and the budget's reservation against the same sum.
* **Switch**: the first token of a request that must load its model (unloaded first),
  an adapter against the base itself, medians over ``--rounds``, same run.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import _server
import httpx
import psutil

from modelyard.examples.gguf_llama import SHAPES, write_llama_gguf
from modelyard.examples.gguf_lora import write_lora_gguf

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


def main() -> None:
    """Write the files, serve them, measure, print and save."""
    parser = _server.arg_parser(__doc__)
    parser.add_argument("--adapters", type=int, default=20)
    parser.add_argument("--shape", default="medium", choices=sorted(SHAPES))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    shape = SHAPES[args.shape]
    with tempfile.TemporaryDirectory(prefix="bench-lora-") as tmp:
        root = Path(tmp)
        base = write_llama_gguf(root / "base" / "1" / "model.gguf", shape, seed=1)
        base_bytes = base.stat().st_size
        names = [f"lora-{i:02d}" for i in range(args.adapters)]
        adapter_bytes = sum(
            write_lora_gguf(root / n / "1" / "adapter.gguf", shape, seed=100 + i).stat().st_size
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
        cfg = _server.write_config(root, models, budget_mb=16384)
        with _server.Server(cfg, root / "server.log") as server:
            client = server.client
            for name in ["base", *names]:
                first_token_s(client, name)
            time.sleep(1.0)  # footprints committed
            kv = int(server.committed_stats(names[0])["worker"].get("kv_cache_bytes", 0))
            pss, workers = workers_pss(server.pid)
            budget = client.get("/v2/stats").json()
            reserved = sum(m["reserved_bytes"] for m in budget["models"])
            switches: dict[str, list[float]] = {"base": [], "adapter": []}
            for r in range(args.rounds):
                for kind, name in (("base", "base"), ("adapter", names[r % len(names)])):
                    server.post(f"/v2/repository/models/{name}/unload")
                    switches[kind].append(first_token_s(client, name))
    n = args.adapters
    # The base itself is served too: its own KV cache is in the workers' memory.
    expected = base_bytes + adapter_bytes + (n + 1) * kv
    result = {
        "adapters": n,
        "shape": args.shape,
        "base_file_mib": base_bytes / MIB,
        "adapter_file_mib": adapter_bytes / n / MIB,
        "kv_cache_mib": kv / MIB,
        "workers": workers,
        "workers_pss_mib": pss / MIB,
        "base_plus_n_adapter_and_context_mib": expected / MIB,
        "overhead_per_worker_mib": (pss - expected) / (n + 1) / MIB,
        "reserved_mib": reserved / MIB,
        "switch_base_ms": statistics.median(switches["base"]) * 1000,
        "switch_adapter_ms": statistics.median(switches["adapter"]) * 1000,
    }
    out = _server.write_results("lora", {"environment": _server.environment(), **result})
    for key, value in result.items():
        print(f"{key}: {value:.2f}" if isinstance(value, float) else f"{key}: {value}")
    print(
        f"adapter switch / base load: {result['switch_adapter_ms'] / result['switch_base_ms']:.2f}"
    )
    print(f"results: {out}")


if __name__ == "__main__":
    main()
