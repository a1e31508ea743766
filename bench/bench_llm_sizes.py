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

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _server
import bench_llm
import httpx
import psutil
import write_llama_sizes
import yaml
from prometheus_client.parser import text_string_to_metric_families

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


def page_cache_share(path: Path) -> float:
    """The share of ``path``'s bytes in the page cache (util-linux ``fincore``; NaN without it)."""
    try:
        out = subprocess.run(
            ["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return float("nan")
    return int(out) / path.stat().st_size


def drop_from_page_cache(path: Path) -> float:
    """Ask the kernel to drop ``path``'s clean pages (``POSIX_FADV_DONTNEED``, no root
    needed; pages some process maps stay). Returns the share still cached after."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return page_cache_share(path)


def size_repo(folder: Path, names: tuple[str, ...] = ("7b", "13b")) -> tuple[Path, dict[str, Path]]:
    """The files of ``names`` (written if missing) linked as ``repo/<name>/1/model.gguf``."""
    files = {name: ensure(name, folder) for name in names}
    root = folder / "repo"
    for name, path in files.items():
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        link = root / name / "1" / "model.gguf"
        if not link.exists():
            link.symlink_to(path)
    return root, files


def size_models(
    files: dict[str, Path], threads: int, parallel: int = 1, n_ctx: int = N_CTX
) -> list[dict[str, Any]]:
    """The ``models:`` entries of the size files (long timeouts: loads take seconds)."""
    gen = {"n_ctx": n_ctx, "n_threads": threads, "parallel": parallel}
    return [
        {
            "name": n,
            "path": n,
            "runtime": "llama_cpp",
            "generation": gen,
            "load_timeout_s": 600,
            "timeout_s": 900,
            "max_queue_size": 64,
        }
        for n in files
    ]


def with_settings(cfg: Path, **fields: Any) -> Path:
    """Add top-level settings to a written server YAML."""
    doc = yaml.safe_load(cfg.read_text(encoding="utf-8"))
    doc.update(fields)
    cfg.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return cfg


def switch_metrics(server: _server.Server) -> dict[str, dict[str, float]]:
    """Per model: the seed histogram ``model_switch_latency`` (a request's wait for a
    non-resident model) and ``modelyard_model_switch_latency_seconds`` (a load, admission
    to ready): their sums and counts, from ``/metrics``."""
    text = server.client.get("/metrics").text
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in ("model_switch_latency", "modelyard_model_switch_latency_seconds"):
            continue
        for sample in family.samples:
            if not sample.name.endswith(("_sum", "_count")):
                continue
            model = sample.labels.get("model_id") or sample.labels.get("model", "")
            key = f"{family.name}{sample.name[len(family.name) :]}"
            row = out.setdefault(model, {})
            row[key] = row.get(key, 0.0) + sample.value
    return out


def switch(args: Any) -> dict[str, Any]:
    """A 7B <-> 13B switch in modelyard against llama.cpp's own load of the file, with
    the incoming file in the page cache (``warm``) or dropped from it (``cold``)."""
    root, files = size_repo(Path(args.folder))
    for path in files.values():
        path.read_bytes()
    budget_mb = 8.6 * 1024  # the 13B file and its context, not both models
    cfg = _server.write_config(root, size_models(files, args.threads), budget_mb=budget_mb)
    with_settings(cfg, metrics={"seed_names": True}, prefetch={"enabled": False})
    caches = args.cache.split(",")
    rows: dict[str, dict[str, list[float]]] = {}

    def add(cache: str, name: str, key: str, value: float) -> None:
        rows.setdefault(f"{name} {cache}", {}).setdefault(key, []).append(value)

    with _server.Server(cfg, root / "server.log") as server:
        one_token_s(server, "13b")  # the 13B resident: the first 7B request is a switch
        for r in range(args.rounds):
            for cache in caches[r % len(caches) :] + caches[: r % len(caches)]:
                for name in files:
                    if cache == "cold":
                        add(cache, name, "cached_share", drop_from_page_cache(files[name]))
                    add(cache, name, "switch_ttft_s", one_token_s(server, name))
                    # The server's own account of the load (worker start, runtime load).
                    add(cache, name, "load_s", server.model_stats(name)["last_load"]["total_s"])
                    add(cache, name, "warm_ttft_s", one_token_s(server, name))
                    print(name, cache, {k: v[-1] for k, v in rows[f"{name} {cache}"].items()})
        metrics = switch_metrics(server)
    for r in range(args.rounds):
        for cache in caches:
            for name, path in files.items():
                if cache == "cold":
                    drop_from_page_cache(path)
                else:
                    path.read_bytes()
                bare = bare_mapped_switch(path, args.threads)
                for key, value in bare.items():
                    add(cache, name, f"bare_{key}", value)
                print("bare", name, cache, bare, flush=True)
                if args.repacked and r == 0:
                    if cache == "cold":
                        drop_from_page_cache(path)
                    add(cache, name, "bare_repacked_load_s", bare_load_s(path))
    summary = {}
    for key, cols in rows.items():
        med = {k: statistics.median(v) for k, v in cols.items()}
        med["switch_s"] = statistics.median(
            t - w for t, w in zip(cols["switch_ttft_s"], cols["warm_ttft_s"], strict=True)
        )
        med["ratio_vs_bare_mapped"] = med["switch_s"] / med["bare_switch_s"]
        summary[key] = med
    return {"summary": summary, "rows": rows, "metrics": metrics, "budget_mb": budget_mb}


def one_token_s(server: _server.Server, model: str, prompt: str = "Hello") -> float:
    """Seconds for a one-token completion of a short prompt."""
    started = time.perf_counter()
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    r = server.client.post("/v1/completions", json=body, timeout=900)
    r.raise_for_status()
    return time.perf_counter() - started


_BARE_SWITCH = """
import json, sys, time, llama_cpp as ll
ll.llama_backend_init()
t = time.perf_counter()
p = ll.llama_model_default_params(); p.use_extra_bufts = False
m = ll.llama_model_load_from_file(sys.argv[1].encode(), p)
c = ll.llama_context_default_params(); c.n_ctx = int(sys.argv[2])
c.n_threads = c.n_threads_batch = int(sys.argv[3])
ctx = ll.llama_init_from_model(m, c)
load = time.perf_counter() - t
vocab = ll.llama_model_get_vocab(m)
def first_token(text):
    buf = (ll.llama_token * 64)()
    n = ll.llama_tokenize(vocab, text, len(text), buf, 64, True, True)
    ll.llama_memory_clear(ll.llama_get_memory(ctx), True)
    t = time.perf_counter()
    assert ll.llama_decode(ctx, ll.llama_batch_get_one(buf, n)) == 0
    ll.llama_get_logits_ith(ctx, -1)
    return time.perf_counter() - t
first = first_token(b"Hello")
warm = first_token(b"Hello")
print(json.dumps({"load_s": load, "first_s": first, "warm_s": warm,
                  "switch_s": load + first - warm}))
"""


def bare_mapped_switch(path: Path, threads: int) -> dict[str, float]:
    """llama.cpp's own mapped load of ``path`` in a fresh process and its first token, less
    the same prompt's warm time: what a switch to the file costs bare llama.cpp (a mapped
    load reads nothing until a token touches the weights)."""
    out = subprocess.run(
        [sys.executable, "-c", _BARE_SWITCH, str(path), str(N_CTX), str(threads)],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


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


TABLE_BUDGETS_MB = {"one": 8.6 * 1024, "both": 13 * 1024}
"""``one``: the 13B file and its context, not both models; ``both``: the two with room."""


def table_system(name: str) -> tuple[str, dict[str, Any]]:
    """A table system's budget key and settings: ``one``, ``one-nopred``, ``both``,
    ``both-p1`` (one sequence slot per model)..."""
    budget, _, flag = name.partition("-")
    settings: dict[str, Any] = {"metrics": {"seed_names": True}}
    if flag == "nopred":
        settings["prefetch"] = {"enabled": False, "page_cache": False, "prewarm": False}
    return budget, settings


def table_mix(level: int) -> list[str]:
    """The requests of one concurrency level: 7B and 13B alternating (at least 4)."""
    return ["7b" if i % 2 == 0 else "13b" for i in range(max(4, level))]


async def timed_stream(
    url: str, models: list[str], level: int, tokens: int, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``models`` as streamed completions, ``level`` at a time, through bench_llm's client;
    each outcome with its start and end on one clock."""
    todo = list(enumerate(models))
    rows: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=url, timeout=1800) as client:

        async def user() -> None:
            while todo:
                _, model = todo.pop(0)
                start = time.perf_counter()
                o = await bench_llm.stream_completion(client, model, tokens, extra=extra)
                # The peer sends no usage in its stream and its text, tokenized again,
                # counts a filler token of these random models as several: at most
                # ``tokens`` were generated.
                rows.append(
                    {
                        "model": o.model,
                        "start": start,
                        "ttft_s": o.ttft_s,
                        "total_s": o.total_s,
                        "tokens": min(o.tokens, tokens),
                    }
                )

        started = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(level)))
        wall = time.perf_counter() - started
    return {"rows": rows, "wall_s": wall}


def level_summary(run: dict[str, Any]) -> dict[str, Any]:
    """TTFT, inter-token latency and tokens/s of one level's requests."""
    rows = run["rows"]
    ttfts = sorted(r["ttft_s"] for r in rows)
    itl = [(r["total_s"] - r["ttft_s"]) / (r["tokens"] - 1) for r in rows if r["tokens"] > 1]
    return {
        "requests": len(rows),
        "ttft_p50_s": statistics.median(ttfts),
        "ttft_mean_s": statistics.fmean(ttfts),
        "ttft_max_s": ttfts[-1],
        "itl_mean_s": statistics.fmean(itl) if itl else float("nan"),
        "tokens_per_s": sum(r["tokens"] for r in rows) / run["wall_s"],
        "wall_s": run["wall_s"],
    }


def tree_memory(pid: int) -> dict[str, float]:
    """RSS and PSS (MiB) of a process and its descendants."""
    root = psutil.Process(pid)
    rss = pss = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            info = proc.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss += info.rss
        pss += getattr(info, "pss", info.rss)
    return {"rss_mib": rss / 2**20, "pss_mib": pss / 2**20}


def _switch_totals(server: _server.Server) -> dict[str, float]:
    """Loads so far and both switch histograms' sums and counts, over the two models."""
    totals: dict[str, float] = {}
    for row in switch_metrics(server).values():
        for key, value in row.items():
            totals[key] = totals.get(key, 0.0) + value
    body = server.client.get("/v2/stats").json()
    totals["loads"] = float(sum(int(m.get("loads") or 0) for m in body["models"]))
    return totals


def table_modelyard(args: Any, root: Path, files: dict[str, Path], name: str) -> dict[str, Any]:
    """One modelyard configuration through the levels."""
    budget, settings = table_system(name)
    parallel = 1 if name.endswith("-p1") else args.parallel  # e.g. both-p1: one slot
    models = size_models(files, args.threads, parallel=parallel, n_ctx=args.n_ctx)
    cfg = _server.write_config(
        root, models, name=f"{name}.yaml", budget_mb=TABLE_BUDGETS_MB[budget]
    )
    with_settings(cfg, **settings)
    out: dict[str, Any] = {}
    with _server.Server(cfg, root / f"{name}.log") as server:
        asyncio.run(timed_stream(server.url, ["7b", "13b", "7b", "13b"], 1, 2))  # warm-up
        for level in args.levels:
            before = _switch_totals(server)
            run = asyncio.run(timed_stream(server.url, table_mix(level), level, args.tokens))
            after = _switch_totals(server)
            delta = {k: after[k] - before.get(k, 0.0) for k in after}
            out[f"c{level}"] = {
                **level_summary(run),
                "switches": delta["loads"],
                "switch_s_seed_metric": delta.get("model_switch_latency_sum", 0.0),
                "switch_waits_seed_metric": delta.get("model_switch_latency_count", 0.0),
                "switch_s_load_metric": delta.get(
                    "modelyard_model_switch_latency_seconds_sum", 0.0
                ),
                **tree_memory(server.pid),
            }
            print(name, level, out[f"c{level}"], flush=True)
    return out


def table_peer(args: Any, root: Path, files: dict[str, Path]) -> dict[str, Any]:
    """``llama_cpp.server`` with both files (it holds one model at a time), mapped weights."""
    out: dict[str, Any] = {}
    launcher = [str(Path(__file__).with_name("llama_mapped.py"))]
    with bench_llm.Peer(files, root, sys.executable, None, launcher=launcher) as peer:
        extra = bench_llm.PEER_EXTRA
        asyncio.run(timed_stream(peer.url, ["7b", "13b", "7b", "13b"], 1, 2, extra))
        for level in args.levels:
            mix = table_mix(level)
            run = asyncio.run(timed_stream(peer.url, mix, level, args.tokens, extra))
            # It serves one request at a time in arrival order: a switch at every change.
            order = [r["model"] for r in sorted(run["rows"], key=lambda r: r["start"])]
            changes = sum(1 for a, b in zip(["13b", *order], order, strict=False) if a != b)
            assert peer.proc is not None
            out[f"c{level}"] = {
                **level_summary(run),
                "switches": changes,
                **tree_memory(peer.proc.pid),
            }
            print("peer", level, out[f"c{level}"], flush=True)
    return out


def table_bare(args: Any, files: dict[str, Path]) -> dict[str, Any]:
    """Both files in this process (mapped, no switch): one request at a time."""
    import llama_mapped

    llama_mapped.use_mapped_weights()
    llms = {name: bench_llm.Bare(path) for name, path in files.items()}
    for llm in llms.values():
        llm.run(2)
    out: dict[str, Any] = {}
    for level in args.levels:
        rows = []
        started = time.perf_counter()
        for model in table_mix(level):
            start = time.perf_counter()
            o = llms[model].run(args.tokens)
            rows.append(
                {
                    "model": model,
                    "start": start,
                    "ttft_s": o.ttft_s,
                    "total_s": o.total_s,
                    "tokens": min(o.tokens, args.tokens),
                }
            )
        run = {"rows": rows, "wall_s": time.perf_counter() - started}
        out[f"c{level}"] = {**level_summary(run), "switches": 0, **_usage()}
        print("bare", level, out[f"c{level}"], flush=True)
    return out


def table(args: Any) -> dict[str, Any]:
    """The seeds' table: a 7B/13B mix at concurrency levels, modelyard under a budget of
    one and of both (with and without prediction), llama_cpp.server and bare llama.cpp."""
    import llama_cpp

    root, files = size_repo(Path(args.folder))
    for path in files.values():
        path.read_bytes()
    bench_llm.N_CTX, bench_llm.THREADS = args.n_ctx, args.threads
    bench_llm.TOKENIZER = llama_cpp.Llama(
        model_path=str(files["7b"]), vocab_only=True, verbose=False
    )
    results: dict[str, Any] = {"file_mib": sum(p.stat().st_size for p in files.values()) / 2**20}
    for i, system in enumerate(args.systems.split(",")):
        if system in results:  # a system named twice (an A/B): its runs kept apart
            system = f"{system}#{i}"
        if system.startswith("peer"):
            results[system] = table_peer(args, root, files)
        elif system.startswith("bare"):
            results[system] = table_bare(args, files)
        else:
            results[system] = table_modelyard(args, root, files, system.split("#")[0])
    return results


def report_table(result: dict[str, Any]) -> str:
    """The table as markdown."""
    rows = []
    for system, levels in result.items():
        if not isinstance(levels, dict):
            continue
        for level, r in levels.items():
            rows.append(
                [
                    system,
                    level,
                    r["requests"],
                    f"{r['ttft_p50_s']:.2f}",
                    f"{r['ttft_mean_s']:.2f}",
                    f"{r['itl_mean_s']:.2f}",
                    f"{r['tokens_per_s']:.2f}",
                    r["switches"],
                    f"{r.get('switch_s_seed_metric', float('nan')):.2f}",
                    f"{r.get('rss_mib', float('nan')):.0f}",
                    f"{r.get('pss_mib', float('nan')):.0f}",
                ]
            )
    header = [
        "system",
        "level",
        "requests",
        "TTFT p50 s",
        "TTFT mean s",
        "ITL s",
        "tokens/s",
        "switches",
        "switch s (metric)",
        "RSS MiB",
        "PSS MiB",
    ]
    return _server.markdown_table(header, rows) + f"\nfiles: {result['file_mib']:.0f} MiB"


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
    parser.add_argument("part", choices=["weights", "switch", "table"])
    parser.add_argument("--size", default="7b", choices=sorted(write_llama_sizes.SIZES))
    parser.add_argument("--folder", required=True, help="where the multi-GB files go")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument(
        "--levels",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[1, 4, 16],
        help="table: concurrency levels",
    )
    parser.add_argument(
        "--systems",
        default="one,one-nopred,both,peer,bare",
        help="table: modelyard budgets (one, both; -nopred), peer, bare",
    )
    parser.add_argument("--parallel", type=int, default=4, help="table: modelyard's slots")
    parser.add_argument("--n-ctx", type=int, default=64, help="table: context per sequence")
    parser.add_argument("--cache", default="warm,cold", help="switch: warm, cold or both")
    parser.add_argument(
        "--repacked", action="store_true", help="switch: also llama.cpp's default load, once"
    )
    args = parser.parse_args()
    parts = {"weights": weights, "switch": switch, "table": table}
    result = parts[args.part](args)
    if args.part == "table":
        print(report_table(result))
    elif args.part == "weights":
        for v, rows in result["runs"].items():
            cells = [f"{k} {median_of(rows, k):.2f}" for k in ("load_s", "ttft_s", "tokens_per_s")]
            print(v, *cells, f"rss_mib {median_of(rows, 'rss_mib'):.0f}")
    else:
        print(json.dumps(result, indent=1))
    payload = {"environment": _server.environment(), "args": vars(args), **result}
    print("results:", _server.write_results(f"llm_sizes_{args.part}", payload))


if __name__ == "__main__":
    main()
