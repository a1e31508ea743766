"""Prompt-prefix reuse and a repeated prompt's first token: modelyard, ``llama_cpp.server``
and bare llama-cpp-python in this process, in one run.

Run from the repository root (the ``llm`` and ``bench`` extras installed)::

    .venv/bin/python bench/bench_llm_prefix.py            # ~3 minutes on 2 cores
    .venv/bin/python bench/bench_llm_prefix.py --quick

Every client is the stock ``openai`` package, streaming ``completions.create``; TTFT is
the arrival of the first chunk that carries text. One random-weight GGUF of the example's
"small" shape (about 60 MB, ``modelyard.examples.gguf_llama``), written at run time; the
same file, ``n_ctx``, threads and greedy decoding everywhere.

(a) **A long shared prefix.** Each round writes a fresh header of about ``--prefix-tokens``
    tokens; the first request is the header and one question, the second the same header
    and another question. TTFT first / second on modelyard (``prefix_reuse`` on), on a
    second modelyard model of the same file with ``prefix_reuse: false`` (the control),
    and on the peer (llama-cpp-python's ``Llama`` keeps its last prompt's tokens). The
    second request's greedy text must be the same with and without reuse.
(b) **One prompt repeated** at one stream: every system has the prompt's tokens cached
    after the first request, so TTFT is what each spends around one token's evaluation
    (HTTP, the worker hop, the generation thread's wake-up, server-sent events).

Rounds interleave the systems (order rotated), medians reported; figures are ratios
measured in the same run.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _server
import bench_llm

from modelyard.examples.gguf_llama import CORPUS, SHAPES, write_llama_gguf

N_CTX = 2048
THREADS = 1
"""One decode thread everywhere (see ``bench_llm.THREADS``: two spin against each other on
a loaded 2-core machine)."""
PEER_URLS: set[str] = set()
QUESTIONS = (" Question: what is the capital of France?", " Question: count to ten.")


def openai_ttft(client: Any, model: str, prompt: str, max_tokens: int) -> tuple[float, str]:
    """One streamed completion with the stock client: (TTFT seconds, text)."""
    # The peer's default repeat penalty is 1.1; greedy on the others means none.
    extra = {"repeat_penalty": 1.0} if str(client.base_url) in PEER_URLS else None
    started = time.perf_counter()
    ttft = None
    parts = []
    stream = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        extra_body=extra,
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            if ttft is None:
                ttft = time.perf_counter() - started
            parts.append(chunk.choices[0].text)
    return (ttft if ttft is not None else time.perf_counter() - started), "".join(parts)


def bare_ttft(llm: Any, prompt: str, max_tokens: int) -> tuple[float, str]:
    """One streamed completion on a ``Llama`` in this process: (TTFT seconds, text)."""
    started = time.perf_counter()
    ttft = None
    parts = []
    for chunk in llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0, stream=True):
        text = chunk["choices"][0]["text"]
        if text and ttft is None:
            ttft = time.perf_counter() - started
        parts.append(text)
    return (ttft if ttft is not None else time.perf_counter() - started), "".join(parts)


def header(round_no: int, tokens: int, tokenizer: Any) -> str:
    """A header of at least ``tokens`` tokens that no earlier round used."""
    words = CORPUS.split()
    text = f"Round {round_no}."
    i = round_no
    while len(tokenizer.tokenize(text.encode(), add_bos=True)) < tokens:
        text += " " + " ".join(words[i % len(words) : i % len(words) + 40])
        i += 17
    return text


def part_a(args: Any, clients: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """TTFT of the first and second request sharing a fresh header, per system."""
    systems = ["modelyard", "modelyard (reuse off)", "llama_cpp.server"]
    model = {"modelyard": "llm", "modelyard (reuse off)": "llm-full", "llama_cpp.server": "llm"}
    ttfts: dict[str, list[tuple[float, float]]] = {s: [] for s in systems}
    same = 0
    for r in range(args.rounds):
        head = header(r, args.prefix_tokens, tokenizer)
        seconds: dict[str, str] = {}
        for system in systems[r % 3 :] + systems[: r % 3]:
            client = clients["llama_cpp.server" if system == "llama_cpp.server" else "modelyard"]
            first, _ = openai_ttft(client, model[system], head + QUESTIONS[0], args.max_tokens)
            second, text = openai_ttft(client, model[system], head + QUESTIONS[1], args.max_tokens)
            ttfts[system].append((first, second))
            seconds[system] = text
        same += seconds["modelyard"] == seconds["modelyard (reuse off)"]
    prefix = len(tokenizer.tokenize(header(0, args.prefix_tokens, tokenizer).encode()))
    return {
        "prefix_tokens": prefix,
        "same_greedy_text_rounds": same,
        "rounds": args.rounds,
        "systems": {
            s: {
                "first_ms": statistics.median(a for a, _ in v) * 1000,
                "second_ms": statistics.median(b for _, b in v) * 1000,
                "ratio": statistics.median(a / b for a, b in v),
            }
            for s, v in ttfts.items()
        },
    }


class InProcess:
    """modelyard's runtime in this process (no server, no worker hop): the layer under the
    HTTP path, for the breakdown of a first token's time."""

    def __init__(self, path: Path) -> None:
        import threading

        from modelyard.runtimes.base import RuntimeSpec
        from modelyard.runtimes.llama_cpp import LlamaCppRuntime

        self.runtime = LlamaCppRuntime()
        options = {"n_ctx": str(N_CTX), "n_threads": str(THREADS)}
        self.runtime.load(RuntimeSpec("llama_cpp", str(path.parent), "llm", options=options))
        self.first = threading.Event()
        self.done = threading.Event()
        self.first_at = 0.0
        self.runtime.start(self)
        self.seq = 0

    def chunk(self, seq: int, text: str, ids: list[int], finish: str | None, *_: int) -> None:
        """The sink: the first text's time, and the end."""
        if text and not self.first.is_set():
            self.first_at = time.perf_counter()
            self.first.set()
        if finish is not None:
            self.done.set()

    def failed(self, seq: int, code: str, message: str) -> None:
        """The sink: a failure ends the run."""
        raise SystemExit(message)

    def ttft(self, prompt: str, max_tokens: int) -> float:
        """Submit to first text, seconds."""
        from modelyard.runtimes.generation import GenerationJob

        self.seq += 1
        self.first.clear()
        self.done.clear()
        started = time.perf_counter()
        job = GenerationJob(self.seq, prompt, None, max_tokens, 0.0, 1.0, 0, None, ())
        self.runtime.submit(job)
        self.done.wait()
        return self.first_at - started


def raw_ttft(client: Any, prompt: str, max_tokens: int) -> float:
    """One streamed completion over a plain ``httpx.Client`` (no openai client): TTFT."""
    body = {"model": "llm", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    started = time.perf_counter()
    ttft = None
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if ttft is None and line.startswith("data: {") and '"text":""' not in line:
                ttft = time.perf_counter() - started
    return ttft if ttft is not None else time.perf_counter() - started


def part_b(args: Any, clients: dict[str, Any], bare: Any, extra: dict[str, Any]) -> dict[str, Any]:
    """TTFT of one prompt repeated at one stream, per system, rounds interleaved."""
    prompt = bench_llm.PROMPT
    systems = [*clients, "bare", "modelyard runtime in-process", "modelyard, raw httpx"]
    ttfts: dict[str, list[float]] = {s: [] for s in systems}
    clients = {**clients, **extra}
    for system in systems:  # the prompt cached everywhere first
        run_one(system, clients, bare, prompt, args.max_tokens)
    for r in range(args.rounds):
        k = r % len(systems)
        for system in systems[k:] + systems[:k]:
            for _ in range(args.requests):
                ttfts[system].append(run_one(system, clients, bare, prompt, args.max_tokens))
    return {
        s: {
            "ttft_p50_ms": statistics.median(v) * 1000,
            "ttft_min_ms": min(v) * 1000,
            "ttft_p90_ms": sorted(v)[int(0.9 * (len(v) - 1))] * 1000,
        }
        for s, v in ttfts.items()
    }


def run_one(system: str, clients: dict[str, Any], bare: Any, prompt: str, n: int) -> float:
    """One request's TTFT on ``system``."""
    if system == "bare":
        return bare_ttft(bare, prompt, n)[0]
    if system == "modelyard runtime in-process":
        return float(clients["_runtime"].ttft(prompt, n))
    if system == "modelyard, raw httpx":
        return raw_ttft(clients["_http"], prompt, n)
    return openai_ttft(clients[system], "llm", prompt, n)[0]


def report(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
    """Both parts as markdown tables."""
    lines = []
    if a is not None:
        lines.append(
            f"(a) shared prefix of {a['prefix_tokens']} tokens; second request's greedy "
            f"text the same with and without reuse in {a['same_greedy_text_rounds']} of "
            f"{a['rounds']} rounds (llama.cpp's sums depend on how a prompt is split into "
            "batches: on a random model's near-ties a different n_batch alone flips tokens)"
        )
        rows = [
            [s, f"{v['first_ms']:.1f}", f"{v['second_ms']:.1f}", f"{v['ratio']:.1f}x"]
            for s, v in a["systems"].items()
        ]
        header = ["system", "TTFT first (ms)", "TTFT second (ms)", "first / second"]
        lines.append(_server.markdown_table(header, rows))
    if b is not None:
        peer = b["llama_cpp.server"]["ttft_p50_ms"]
        rows = [
            [
                s,
                f"{v['ttft_p50_ms']:.2f}",
                f"{v['ttft_min_ms']:.2f}",
                f"{v['ttft_p90_ms']:.2f}",
                f"{v['ttft_p50_ms'] / peer:.2f}",
            ]
            for s, v in b.items()
        ]
        lines.append("(b) one prompt repeated, one stream, stock openai client")
        header = ["system", "TTFT p50 (ms)", "min", "p90", "p50 / peer"]
        lines.append(_server.markdown_table(header, rows))
    return "\n\n".join(lines)


def main() -> None:
    """Write the model, start both servers, run both parts, print and save the results."""
    parser = _server.arg_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=10, help="(b) requests per round")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--prefix-tokens", type=int, default=1000)
    parser.add_argument("--only", choices=["a", "b"], default=None)
    parser.add_argument("--peer-python", default=sys.executable)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.requests = 2, 4
    import llama_cpp
    import openai

    bench_llm.N_CTX, bench_llm.THREADS = N_CTX, THREADS
    with tempfile.TemporaryDirectory(prefix="bench-prefix-") as tmp:
        root = Path(tmp)
        path = write_llama_gguf(root / "llm" / "1" / "model.gguf", SHAPES["small"], seed=1)
        (root / "llm-full" / "1").mkdir(parents=True)
        os.link(path, root / "llm-full" / "1" / "model.gguf")
        gen = {"n_ctx": N_CTX, "n_threads": THREADS}
        models = [
            {"name": "llm", "path": "llm", "runtime": "llama_cpp", "generation": gen},
            {
                "name": "llm-full",
                "path": "llm-full",
                "runtime": "llama_cpp",
                "generation": {**gen, "prefix_reuse": False},
            },
        ]
        cfg = _server.write_config(root, models, budget_mb=4096)
        tokenizer = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        bare = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=N_CTX,
            n_threads=THREADS,
            n_threads_batch=THREADS,
            verbose=False,
        )
        with (
            _server.Server(cfg, root / "modelyard.log") as ours,
            bench_llm.Peer({"llm": path}, root, args.peer_python, None) as peer,
        ):
            PEER_URLS.add(peer.url + "/v1/")
            clients = {
                "modelyard": openai.OpenAI(base_url=ours.url + "/v1", api_key="-"),
                "llama_cpp.server": openai.OpenAI(base_url=peer.url + "/v1", api_key="-"),
            }
            for name in ("llm", "llm-full"):  # loaded and warm
                openai_ttft(clients["modelyard"], name, "Hello", 2)
            a = part_a(args, clients, tokenizer) if args.only in (None, "a") else None
            extra = {"_runtime": InProcess(path), "_http": ours.client}
            b = part_b(args, clients, bare, extra) if args.only in (None, "b") else None
    payload = {"environment": _server.environment(), "args": vars(args), "a": a, "b": b}
    out = _server.write_results("llm_prefix", payload)
    print(report(a, b))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
