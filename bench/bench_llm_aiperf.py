"""NVIDIA's ``aiperf`` against modelyard and ``llama_cpp.server``, beside this project's own
client, several models, one run. Not run in CI.

``aiperf`` is not a dependency of modelyard: install it in a virtual environment of its
own and give its command with ``--aiperf``::

    python3 -m venv /tmp/aiperf-venv && /tmp/aiperf-venv/bin/pip install aiperf
    .venv/bin/python bench/bench_llm_aiperf.py --aiperf /tmp/aiperf-venv/bin/aiperf

Three random-weight GGUF models (``modelyard.examples.gguf_llama``, ``--shape``) are served
by modelyard (a budget that holds ``--fit`` of them) and by ``llama_cpp.server`` (one at a
time). Each server is measured by ``aiperf profile`` (``completions``, streaming, the
models picked at random per request, synthetic prompts of ``--input-tokens`` tokens,
``--output-tokens`` out, ``--concurrency``) and by ``bench_llm.py``'s streaming client on
the same kind of mix. ``aiperf`` counts tokens with a Hugging Face tokenizer: the models'
own byte-level BPE is written as one (``tokenizer.json``) so that nothing is downloaded.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import _server
import bench_llm

from modelyard.examples.gguf_llama import SHAPES, vocabulary, write_llama_gguf

NAMES = ("llm-1", "llm-2", "llm-3")


def write_tokenizer(folder: Path) -> Path:
    """The example models' byte-level BPE as a Hugging Face tokenizer folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokens, merges, _, _ = vocabulary()
    vocab = {token: i for i, token in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs))  # type: ignore[arg-type]
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def run_aiperf(
    args: Any, url: str, tokenizer: Path, out: Path, extra: dict[str, Any]
) -> dict[str, Any]:
    """``aiperf profile`` against ``url``; its summary metrics (avg, p50, p99)."""
    cmd = [
        args.aiperf,
        "profile",
        "--url",
        url,
        "--endpoint-type",
        "completions",
        "--streaming",
        "--model",
        ",".join(NAMES),
        "--model-selection-strategy",
        "random",
        "--tokenizer",
        str(tokenizer),
        "--concurrency",
        str(args.concurrency),
        "--request-count",
        str(args.requests),
        "--warmup-request-count",
        "3",
        "--prompt-input-tokens-mean",
        str(args.input_tokens),
        "--prompt-input-tokens-stddev",
        "0",
        "--prompt-output-tokens-mean",
        str(args.output_tokens),
        "--prompt-output-tokens-stddev",
        "0",
        "--random-seed",
        "7",
        "--output-artifact-dir",
        str(out),
        "--no-server-metrics",
        "--no-gpu-telemetry",
        "--ui-type",
        "none",
    ]
    for key, value in {"temperature": 0, **extra}.items():
        cmd += ["--extra-inputs", f"{key}:{value}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        return {"error": f"aiperf rc {proc.returncode}: {(proc.stdout + proc.stderr)[-3000:]}"}
    exports = sorted(out.rglob("profile_export_aiperf.json"))
    if not exports:
        return {"error": f"no aiperf export under {out}: {proc.stdout[-2000:]}"}
    raw = exports[0].read_text(encoding="utf-8")
    (_server.RESULTS_DIR / f"aiperf_{out.name}.json").write_text(raw, encoding="utf-8")
    metrics = find_metrics(json.loads(raw))
    return {
        key: {k: metrics[key][k] for k in ("avg", "p50", "p99", "unit") if k in metrics[key]}
        for key in METRICS
        if isinstance(metrics.get(key), dict)
    }


METRICS = (
    "time_to_first_token",
    "inter_token_latency",
    "output_token_throughput",
    "request_throughput",
    "request_latency",
    "output_sequence_length",
    "request_count",
)


def find_metrics(data: Any) -> dict[str, Any]:
    """The dict in aiperf's export that holds ``time_to_first_token`` (wherever it nests)."""
    if isinstance(data, dict):
        if isinstance(data.get("time_to_first_token"), dict):
            return data
        for value in data.values():
            found = find_metrics(value)
            if found:
                return found
    elif isinstance(data, list):
        for value in data:
            found = find_metrics(value)
            if found:
                return found
    return {}


def run_own(args: Any, url: str, extra: dict[str, Any] | None) -> dict[str, float]:
    """This project's streaming client on a mix like aiperf's (random models, seeded)."""
    mix = random.Random(7).choices(NAMES, k=args.requests)

    async def main() -> tuple[list[bench_llm.Outcome], float]:
        import httpx

        todo = list(mix)
        outs: list[bench_llm.Outcome] = []
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:

            async def user() -> None:
                while todo:
                    model = todo.pop(0)
                    outs.append(
                        await bench_llm.stream_completion(
                            client, model, args.output_tokens, extra=extra
                        )
                    )

            started = time.perf_counter()
            await asyncio.gather(*(user() for _ in range(args.concurrency)))
            return outs, time.perf_counter() - started

    outs, wall = asyncio.run(main())
    ttfts = sorted(o.ttft_s * 1000 for o in outs)
    itl = [(o.total_s - o.ttft_s) * 1000 / (o.tokens - 1) for o in outs if o.tokens > 1]
    return {
        "ttft_avg_ms": statistics.fmean(ttfts),
        "ttft_p50_ms": statistics.median(ttfts),
        "ttft_p99_ms": bench_llm.percentile(ttfts, 99),
        "itl_avg_ms": statistics.fmean(itl) if itl else float("nan"),
        "output_tokens_per_s": sum(o.tokens for o in outs) / wall,
        "requests_per_s": len(outs) / wall,
    }


def main() -> None:
    """Write the models, start each server, measure it with aiperf and with our client."""
    parser = _server.arg_parser(__doc__)
    parser.add_argument("--aiperf", required=True, help="the aiperf command (its own venv)")
    parser.add_argument("--shape", default="small", choices=sorted(SHAPES))
    parser.add_argument("--fit", type=int, default=2, help="modelyard's budget holds this many")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--input-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timeout", type=int, default=900)
    args = parser.parse_args()
    bench_llm.THREADS = args.threads
    import llama_cpp

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-aiperf-") as tmp:
        root = Path(tmp)
        files = {
            name: write_llama_gguf(root / name / "1" / "model.gguf", SHAPES[args.shape], seed=i)
            for i, name in enumerate(NAMES, start=11)
        }
        bench_llm.TOKENIZER = llama_cpp.Llama(
            model_path=str(files[NAMES[0]]), vocab_only=True, verbose=False
        )
        tokenizer = write_tokenizer(root / "tokenizer")
        size_mb = files[NAMES[0]].stat().st_size / 2**20
        budget_mb = (args.fit + 0.5) * (size_mb + 64)
        models = bench_llm.modelyard_models(files, root, parallel=args.concurrency)
        cfg = _server.write_config(root, models, budget_mb=budget_mb)
        with _server.Server(cfg, root / "modelyard.log") as server:
            results["modelyard"] = {
                "aiperf": run_aiperf(args, server.url, tokenizer, root / "aiperf-modelyard", {}),
                "own": run_own(args, server.url, None),
            }
        print("modelyard", json.dumps(results["modelyard"]), flush=True)
        extra = bench_llm.PEER_EXTRA
        with bench_llm.Peer(files, root, bench_llm.sys.executable, None) as peer:
            results["llama_cpp.server"] = {
                "aiperf": run_aiperf(args, peer.url, tokenizer, root / "aiperf-peer", extra),
                "own": run_own(args, peer.url, extra),
            }
        print("llama_cpp.server", json.dumps(results["llama_cpp.server"]), flush=True)
    payload = {"environment": _server.environment(), "args": vars(args), **results}
    print(report(results))
    print("results:", _server.write_results("llm_aiperf", payload))


def report(results: dict[str, Any]) -> str:
    """aiperf's and our client's figures per server, side by side."""
    rows = []
    for system, r in results.items():
        a = r["aiperf"]
        if "time_to_first_token" not in a:
            a = {"error": str(a.get("error", f"no TTFT in aiperf's export: {sorted(a)}"))}
        if "error" in a:
            rows.append([system, "aiperf", a["error"][:200], "", "", ""])
        else:
            rows.append(
                [
                    system,
                    "aiperf",
                    f"{a['time_to_first_token']['avg']:.1f}",
                    f"{a['time_to_first_token']['p99']:.1f}",
                    f"{a['inter_token_latency']['avg']:.1f}",
                    f"{a['output_token_throughput']['avg']:.1f}",
                ]
            )
        o = r["own"]
        rows.append(
            [
                system,
                "bench_llm client",
                f"{o['ttft_avg_ms']:.1f}",
                f"{o['ttft_p99_ms']:.1f}",
                f"{o['itl_avg_ms']:.1f}",
                f"{o['output_tokens_per_s']:.1f}",
            ]
        )
    header = ["server", "client", "TTFT avg ms", "TTFT p99 ms", "ITL avg ms", "output tokens/s"]
    return _server.markdown_table(header, rows)


if __name__ == "__main__":
    main()
