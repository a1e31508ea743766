"""JSON-schema-constrained decoding against free decoding, same model, same server, same run.

Run from the repository root (the ``llm`` extra installed)::

    .venv/bin/python bench/bench_openai_constrained.py            # ~1-2 minutes on 2 cores
    .venv/bin/python bench/bench_openai_constrained.py --quick    # smoke run

One ``modelyard serve`` process serves one GGUF file written at run time (random
weights, ``modelyard.examples.gguf_llama``). Each round sends the same chat twice,
non-streamed at concurrency 1, greedy, ``max_tokens`` new tokens: once free, once with
``response_format: json_schema`` (an object with one string field, so that a random
model writes inside the string up to ``max_tokens``, as the free one does). Rounds
alternate which goes first. The figure is the ratio of the median tokens per second
(completion tokens over the request's wall time) of the constrained requests to the
free ones; the target is >= 0.8.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _server

from modelyard.examples.gguf_llama import SHAPES, write_llama_gguf

TARGET_RATIO = 0.8
SCHEMA = {
    "type": "object",
    "properties": {"story": {"type": "string"}},
    "required": ["story"],
    "additionalProperties": False,
}
MESSAGES = [
    {"role": "system", "content": "You write short stories as JSON."},
    {"role": "user", "content": "Tell me a story about the sea."},
]


def one(server: _server.Server, max_tokens: int, constrained: bool) -> tuple[int, float]:
    """``(completion tokens, seconds)`` of one chat request."""
    body: dict[str, Any] = {
        "model": "llm",
        "messages": MESSAGES,
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if constrained:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "story", "schema": SCHEMA},
        }
    started = time.perf_counter()
    answer = server.post("/v1/chat/completions", body)
    elapsed = time.perf_counter() - started
    answer.raise_for_status()
    return int(answer.json()["usage"]["completion_tokens"]), elapsed


def main() -> int:
    """Run the rounds; print the medians and the ratio; exit 1 below the target."""
    parser = _server.arg_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="4 rounds of 32 tokens")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.max_tokens = 4, 32
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_llama_gguf(root / "llm" / "1" / "model.gguf", SHAPES[args.shape])
        model = {
            "name": "llm",
            "path": "llm",
            "runtime": "llama_cpp",
            "generation": {"n_ctx": 1024, "n_threads": 1, "parallel": 1},
            "timeout_s": 120,
        }
        cfg = _server.write_config(root, [model])
        rates: dict[bool, list[float]] = {False: [], True: []}
        tokens: dict[bool, list[int]] = {False: [], True: []}
        with _server.Server(cfg, root / "server.log") as server:
            one(server, 8, False)  # load and warm
            one(server, 8, True)
            for i in range(args.rounds):
                for constrained in (i % 2 == 1, i % 2 == 0):
                    n, seconds = one(server, args.max_tokens, constrained)
                    rates[constrained].append(n / seconds)
                    tokens[constrained].append(n)
    free, constrained = statistics.median(rates[False]), statistics.median(rates[True])
    ratio = constrained / free
    print(f"model {args.shape}, {args.rounds} rounds, max_tokens {args.max_tokens}")
    print(f"free:        {free:8.1f} tokens/s (median; tokens {statistics.median(tokens[False])})")
    print(
        f"constrained: {constrained:8.1f} tokens/s (median; tokens "
        f"{statistics.median(tokens[True])})"
    )
    print(f"ratio constrained/free: {ratio:.2f} (target >= {TARGET_RATIO})")
    return 0 if ratio >= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
