"""Generative models at real sizes (1B / 7B / 13B shapes), written locally: mapped weights
against llama.cpp's repacked buffers, and a 7B <-> 13B switch against bare llama.cpp's
own load. Not run in CI; needs ~12 GB of disk under ``--folder`` and as much page cache.

    .venv/bin/python bench/bench_llm_sizes.py weights --size 7b --folder /tmp/sizes
    .venv/bin/python bench/bench_llm_sizes.py switch --folder /tmp/sizes

``weights``: each variant runs in a fresh process, twice, alternating (page cache warm
after the first), on the same file and prompt (a fresh ~17-token prompt), greedy:

* ``modelyard``: the server's own runtime (``LlamaCppRuntime``, ``weights: mapped``);
* ``bare-mapped``: llama.cpp through llama-cpp-python's low-level API, mapped weights;
* ``bare-repacked``: the same with llama.cpp's default extra (AMX / repacked) buffers.
  On CPUs where llama.cpp's AMX kernels crash on quantized batches (ggml-org/llama.cpp
  #20824; the 2-core VMs here), its prompt is fed one token per decode.

Load seconds, TTFT, decode tokens/s (after the first token) and the process's RSS / USS.

``switch``: a modelyard server with the 7B and 13B files under a budget that holds one,
asked in turn (one generated token, a short prompt): each request loads its model. The
switch's cost is that TTFT less the model's warm TTFT, against a fresh process's
``Llama(model_path=…)`` (llama.cpp's own load, its defaults) of the incoming file, page
cache warm (both files read once before).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _server
import psutil
import write_llama_sizes

PROMPT = "Once upon a time there was a little model that wanted to write stories"
N_CTX = 512


def _usage() -> dict[str, float]:
    info = psutil.Process().memory_full_info()
    return {"rss_mib": info.rss / 2**20, "uss_mib": info.uss / 2**20}


def run_bare(path: Path, threads: int, tokens: int, repacked: bool, serial: int) -> dict[str, Any]:
    """llama.cpp through the low-level API: load, prompt, greedy tokens."""
    import llama_cpp as ll

    ll.llama_backend_init()
    t0 = time.perf_counter()
    mp = ll.llama_model_default_params()
    mp.use_extra_bufts = repacked
    model = ll.llama_model_load_from_file(str(path).encode(), mp)
    cp = ll.llama_context_default_params()
    cp.n_ctx, cp.n_threads, cp.n_threads_batch = N_CTX, threads, threads
    ctx = ll.llama_init_from_model(model, cp)
    load_s = time.perf_counter() - t0
    vocab = ll.llama_model_get_vocab(model)
    text = f"{serial}. {PROMPT}".encode()
    buf = (ll.llama_token * 256)()
    n = ll.llama_tokenize(vocab, text, len(text), buf, 256, True, True)
    prompt = list(buf[:n])
    sampler = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
    ll.llama_sampler_chain_add(sampler, ll.llama_sampler_init_greedy())
    t1 = time.perf_counter()
    step = 1 if repacked else len(prompt)
    for i in range(0, len(prompt), step):
        part = (ll.llama_token * step)(*prompt[i : i + step])
        assert ll.llama_decode(ctx, ll.llama_batch_get_one(part, len(prompt[i : i + step]))) == 0
    stamps = []
    token = ll.llama_sampler_sample(sampler, ctx, -1)
    stamps.append(time.perf_counter())
    for _ in range(tokens - 1):
        one = (ll.llama_token * 1)(token)
        assert ll.llama_decode(ctx, ll.llama_batch_get_one(one, 1)) == 0
        token = ll.llama_sampler_sample(sampler, ctx, -1)
        stamps.append(time.perf_counter())
    return {
        "load_s": load_s,
        "ttft_s": stamps[0] - t1,
        "tokens_per_s": (len(stamps) - 1) / (stamps[-1] - stamps[0]),
        "prompt_tokens": len(prompt),
        **_usage(),
    }


def run_modelyard(path: Path, threads: int, tokens: int, serial: int) -> dict[str, Any]:
    """The server's own runtime in this process: load, one job, the chunks' times."""
    import threading

    from modelyard.runtimes.base import RuntimeSpec
    from modelyard.runtimes.generation import GenerationJob
    from modelyard.runtimes.llama_cpp import LlamaCppRuntime, prepare_fork_server

    # What the fork server does before any worker (the bare runs import it untimed too).
    prepare_fork_server()
    stamps: list[float] = []
    done = threading.Event()

    class Sink:
        def chunk(self, seq: int, text: str, ids: list[int], finish: str | None, *_: int) -> None:
            stamps.extend([time.perf_counter()] * max(1, len(ids)))
            if finish is not None:
                done.set()

        def failed(self, seq: int, code: str, message: str) -> None:
            raise SystemExit(message)

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "model.gguf").symlink_to(path)
        runtime = LlamaCppRuntime()
        t0 = time.perf_counter()
        options = {"n_ctx": str(N_CTX), "n_threads": str(threads)}
        runtime.load(RuntimeSpec("llama_cpp", folder, "m", options=options))
        load_s = time.perf_counter() - t0
        runtime.start(Sink())
        job = GenerationJob(1, f"{serial}. {PROMPT}", None, tokens, 0.0, 1.0, 0, None, ())
        t1 = time.perf_counter()
        runtime.submit(job)
        done.wait()
        stats = runtime.stats()
        usage = _usage()
        runtime.close()
    return {
        "load_s": load_s,
        "ttft_s": stamps[0] - t1,
        "tokens_per_s": (len(stamps) - 1) / (stamps[-1] - stamps[0]),
        "prompt_tokens": stats.prompt_tokens,
        **usage,
    }


def variant_main(argv: list[str]) -> None:
    """``_variant NAME PATH THREADS TOKENS SERIAL``: one run, JSON on stdout."""
    name, path, threads, tokens, serial = argv[0], Path(argv[1]), *map(int, argv[2:5])
    if name == "modelyard":
        out = run_modelyard(path, threads, tokens, serial)
    else:
        out = run_bare(path, threads, tokens, name == "bare-repacked", serial)
    print("RESULT " + json.dumps(out), flush=True)


def in_fresh_process(*args: object) -> dict[str, Any]:
    """One variant run in a new interpreter."""
    cmd = [sys.executable, __file__, "_variant", *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[7:])
            return result
    return {"error": f"rc {proc.returncode}: {proc.stderr[-400:]}"}


def weights(args: Any) -> dict[str, Any]:
    """Mapped against repacked, in fresh processes, rounds alternating."""
    path = ensure(args.size, Path(args.folder))
    path.read_bytes()  # page cache warm for everyone
    variants = ["modelyard", "bare-mapped", "bare-repacked"]
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    serial = 0
    for r in range(args.rounds):
        for v in variants[r % 3 :] + variants[: r % 3]:
            serial += 1
            runs[v].append(in_fresh_process(v, path, args.threads, args.tokens, serial))
            print(v, runs[v][-1], flush=True)
    return {"size": args.size, "file_gb": path.stat().st_size / 1e9, "runs": runs}


def median_of(rows: list[dict[str, Any]], key: str) -> float:
    """The median of ``key`` over the rows that have it."""
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else float("nan")


def switch(args: Any) -> dict[str, Any]:
    """A 7B <-> 13B switch in modelyard against llama.cpp's own load of the file."""
    folder = Path(args.folder)
    files = {name: ensure(name, folder) for name in ("7b", "13b")}
    root = folder / "repo"
    for name, path in files.items():
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        link = root / name / "1" / "model.gguf"
        if not link.exists():
            link.symlink_to(path)
        path.read_bytes()
    gen = {"n_ctx": N_CTX, "n_threads": args.threads}
    models = [
        {
            "name": n,
            "path": n,
            "runtime": "llama_cpp",
            "generation": gen,
            "load_timeout_s": 600,
            "timeout_s": 600,
        }
        for n in files
    ]
    budget_mb = 8.6 * 1024  # the 13B file and its context, not both models
    cfg = _server.write_config(root, models, budget_mb=budget_mb)
    ttft: dict[str, list[float]] = {n: [] for n in files}
    warm: dict[str, list[float]] = {n: [] for n in files}
    loads: dict[str, list[float]] = {n: [] for n in files}
    with _server.Server(cfg, root / "server.log") as server:
        for _ in range(args.rounds):
            for name in files:
                ttft[name].append(one_token_s(server, name))
                # The server's own account of the load (worker start, runtime load).
                loads[name].append(server.model_stats(name)["last_load"]["total_s"])
                warm[name].append(one_token_s(server, name))
                print(name, ttft[name][-1], warm[name][-1], flush=True)
    rounds = range(args.rounds)
    bare = {n: [bare_load_s(p) for _ in rounds] for n, p in files.items()}
    mapped = {n: [bare_load_s(p, mapped=True) for _ in rounds] for n, p in files.items()}
    return {
        n: {
            "switch_s": statistics.median(t - w for t, w in zip(ttft[n], warm[n], strict=True)),
            "warm_ttft_s": statistics.median(warm[n]),
            "load_s": statistics.median(loads[n]),
            "switch_ttft_s": statistics.median(ttft[n]),
            "bare_load_s": statistics.median(bare[n]),
            "bare_mapped_load_s": statistics.median(mapped[n]),
        }
        for n in files
    }


def one_token_s(server: _server.Server, model: str) -> float:
    """Seconds for a one-token completion of a short prompt."""
    started = time.perf_counter()
    body = {"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
    r = server.client.post("/v1/completions", json=body, timeout=900)
    r.raise_for_status()
    return time.perf_counter() - started


def bare_load_s(path: Path, *, mapped: bool = False) -> float:
    """``Llama(model_path=…)`` in a fresh process: seconds to load (its defaults, which
    repack); ``mapped``: the low-level load without extra buffers, and a context."""
    code = (
        "import time, llama_cpp; t = time.perf_counter(); "
        f"llama_cpp.Llama(model_path={str(path)!r}, n_ctx={N_CTX}, verbose=False); "
        "print(time.perf_counter() - t)"
    )
    if mapped:
        code = (
            "import time, llama_cpp as ll; ll.llama_backend_init(); t = time.perf_counter(); "
            "p = ll.llama_model_default_params(); p.use_extra_bufts = False; "
            f"m = ll.llama_model_load_from_file({str(path)!r}.encode(), p); "
            f"c = ll.llama_context_default_params(); c.n_ctx = {N_CTX}; "
            "ll.llama_init_from_model(m, c); print(time.perf_counter() - t)"
        )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    return float(out.stdout.strip().splitlines()[-1])


def ensure(size: str, folder: Path) -> Path:
    """The file of ``size`` in ``folder``, written if missing."""
    path = folder / f"llama-{size}.gguf"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        write_llama_sizes.write(write_llama_sizes.SIZES[size], path)
    return path


def main() -> None:
    """Parse, run, print, save."""
    if len(sys.argv) > 1 and sys.argv[1] == "_variant":
        variant_main(sys.argv[2:])
        return
    parser = _server.arg_parser(__doc__)
    parser.add_argument("part", choices=["weights", "switch"])
    parser.add_argument("--size", default="7b", choices=sorted(write_llama_sizes.SIZES))
    parser.add_argument("--folder", required=True, help="where the multi-GB files go")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args()
    result = weights(args) if args.part == "weights" else switch(args)
    if args.part == "weights":
        for v, rows in result["runs"].items():
            cells = [f"{k} {median_of(rows, k):.2f}" for k in ("load_s", "ttft_s", "tokens_per_s")]
            print(v, *cells, f"rss_mib {median_of(rows, 'rss_mib'):.0f}")
    else:
        print(json.dumps(result, indent=1))
    payload = {"environment": _server.environment(), "args": vars(args), **result}
    print("results:", _server.write_results(f"llm_sizes_{args.part}", payload))


if __name__ == "__main__":
    main()
