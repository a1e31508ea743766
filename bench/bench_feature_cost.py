"""What each feature on the request path costs: the event loop's CPU per request with it
switched off, against all features on, in one process and one run.

Run from the repository root::

    .venv/bin/python bench/bench_feature_cost.py                 # c=50 and c=1, 5 repeats
    .venv/bin/python bench/bench_feature_cost.py --quick

One ``App`` serves the identity model (FP32 [1, 4], ``isolation: process``) in this
process; requests are handed to the same ``InferHandler`` the HTTP route calls (decode,
route, schedule, the worker hop, encode: no HTTP, whose cost ``bench_overhead.py``
measures), from ``--concurrency`` closed-loop clients. Each variant switches features off
by replacing the method that does them with the least that keeps requests answered, for
its phase only; the variants take turns in every repeat (order rotated), so each is
compared with the all-on phases of the same run. The switched-off pieces:

* **cache learning**: ``ModelManager.touch`` keeps only the LRU stamp and the request
  count (no demand, eviction-policy, prefetch, pre-warm or episode bookkeeping);
* **metrics**: ``Metrics.request_done`` does nothing (no histograms or counters);
* **admission estimate**: the scheduler's early refusal (``_refusal``) and the arrival
  record it reads (``_note_arrival``) do nothing;
* **input checks**: ``validate_inputs`` passes the decoded arrays on unchecked;
* **inference statistics** (Triton's statistics extension): ``DataPlane._infer_on``
  runs the request without counting it (no clock reads, no outcome counters) and the
  scheduler's batch hook counts nothing in ``InferStats``.

This measures; it is not a configuration: none of these can be switched off in the
server, and the numbers say what making each cheaper could win at most.
"""

from __future__ import annotations

import asyncio
import functools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import _server
from profile_hot_path import BODY, _config, _model, _requests

import modelyard.frontends.dataplane as dataplane_module
from modelyard.app import App
from modelyard.config.settings import load_settings
from modelyard.frontends.dataplane import DataPlane
from modelyard.frontends.http.fastpath import InferHandler
from modelyard.manager.infer_stats import InferStats
from modelyard.manager.manager import ModelManager
from modelyard.manager.records import ModelRecord
from modelyard.observability.metrics import Metrics
from modelyard.scheduling.scheduler_core import SchedulerCore


def _touch_lru_only(self: ModelManager, record: ModelRecord) -> None:
    record.stats.last_used = self.clock.monotonic()
    record.stats.requests += 1


def _unchecked(record: object, request: Any, specs: object) -> dict[str, Any]:
    return {t.name: t.array for t in request.inputs}


def _nothing(*_args: object, **_kwargs: object) -> None:
    return None


async def _uncounted(self: DataPlane, record: ModelRecord, request: Any, started: float) -> Any:
    # The data plane's own name for it: the input-checks variant replaces that one.
    check = vars(dataplane_module)["validate_inputs"]
    prepare = functools.partial(check, record.key.name, request)
    info, outputs = await self._submit(
        record, prepare, request.priority, started, request.timeout_s
    )
    return self._response(record, request, info, outputs, info.supports_batching)


PATCHES: dict[str, list[tuple[object, str, Callable[..., Any]]]] = {
    "cache learning": [(ModelManager, "touch", _touch_lru_only)],
    "metrics": [(Metrics, "request_done", _nothing)],
    "admission estimate": [
        (SchedulerCore, "_refusal", _nothing),
        (SchedulerCore, "_note_arrival", _nothing),
    ],
    "input checks": [(dataplane_module, "validate_inputs", _unchecked)],
    "inference statistics": [
        (DataPlane, "_infer_on", _uncounted),
        (InferStats, "executed", _nothing),
    ],
}
VARIANTS = ["all on", *PATCHES, "all off"]


@contextmanager
def _off(variant: str) -> Iterator[None]:
    names = list(PATCHES) if variant == "all off" else [variant] if variant in PATCHES else []
    with ExitStack() as stack:
        for name in names:
            for owner, attr, replacement in PATCHES[name]:
                old = getattr(owner, attr)
                setattr(owner, attr, replacement)
                stack.callback(setattr, owner, attr, old)
        yield


async def _phase(handler: InferHandler, calls: int, concurrency: int) -> float:
    """Event-loop CPU per request (µs) over ``calls`` requests."""
    cpu0 = time.thread_time()
    await _requests(handler, BODY, calls, concurrency)
    return (time.thread_time() - cpu0) / calls * 1e6


async def run(calls: int, repeats: int, concurrencies: list[int]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-feature-cost-") as tmp:
        root = Path(tmp)
        entry, _ = _model(root, "process", minilm=False)
        settings = load_settings(
            _config(root, entry), host="127.0.0.1", http_port=0, grpc_port=None
        )
        app = App(settings)
        await app.start()
        try:
            handler = InferHandler(app.dataplane, 1 << 20)
            for concurrency in concurrencies:
                n = calls - calls % concurrency
                await _requests(handler, BODY, 1000 - 1000 % concurrency, concurrency)
                samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
                for rep in range(repeats):
                    order = VARIANTS[rep % len(VARIANTS) :] + VARIANTS[: rep % len(VARIANTS)]
                    for variant in order:
                        with _off(variant):
                            samples[variant].append(await _phase(handler, n, concurrency))
                    print(
                        f"  c={concurrency} rep {rep + 1}: "
                        + ", ".join(f"{v} {samples[v][-1]:.0f}" for v in VARIANTS),
                        file=sys.stderr,
                    )
                results[f"c={concurrency}"] = samples
        finally:
            await app.stop()
    return results


def report(results: dict[str, Any]) -> str:
    """One table per concurrency: median CPU per request, and what switching off saved."""
    out = []
    for label, samples in results.items():
        base = statistics.median(samples["all on"])
        rows = []
        for variant in VARIANTS:
            med = statistics.median(samples[variant])
            # Paired by repeat: each off phase against the all-on phase of its repeat.
            saved = statistics.median(
                a - b for a, b in zip(samples["all on"], samples[variant], strict=True)
            )
            rows.append(
                [
                    variant if variant in ("all on", "all off") else f"without {variant}",
                    f"{med:.0f}",
                    "-" if variant == "all on" else f"{saved:.0f}",
                    "-" if variant == "all on" else f"{saved / base:.0%}",
                ]
            )
        header = [
            f"{label}: variant",
            "event-loop CPU per request (µs)",
            "saved vs all on (µs, paired)",
            "share of all on",
        ]
        out.append(_server.markdown_table(header, rows))
    return "\n\n".join(out)


def main() -> None:
    parser = _server.arg_parser(__doc__)
    parser.add_argument("--calls", type=int, default=6000, help="requests per phase")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[50, 1])
    parser.add_argument("--quick", action="store_true", help="2 repeats of 2,000 requests")
    args = parser.parse_args()
    if args.quick:
        args.calls, args.repeats = 2000, 2
    _server.install_uvloop()
    env = _server.environment()
    results = asyncio.run(run(args.calls, args.repeats, args.concurrency))
    print(f"\nmedians of {args.repeats} repeats; {env}\n")
    print(report(results))
    path = _server.write_results(
        "bench_feature_cost", {"args": vars(args), "environment": env, "samples": results}
    )
    print(f"\nwrote {path.relative_to(_server.REPO_ROOT)}")


if __name__ == "__main__":
    main()
