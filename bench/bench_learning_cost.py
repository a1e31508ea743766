"""What a request's cache learning costs: ``ModelManager.touch`` and the learning it sets
off, per request, by how many requests a turn of the event loop holds.

Run from the repository root (``tests.fakes`` must be importable)::

    PYTHONPATH=src:. .venv/bin/python bench/bench_learning_cost.py
    PYTHONPATH=<other checkout>/src:. .venv/bin/python bench/bench_learning_cost.py

A manager on fake instances (no worker, no HTTP) with the server's defaults
(``arrival-cost``, prefetching and pre-warm windows on), two models READY; requests are
touched in batches of ``--batch`` (one model's, every 20th batch the other's), then
learnt (``manager.learning.flush``, what the end of the loop's turn does; a tree without
it learns inside ``touch``). Printed: the thread's CPU per request, median and best of
``--repeats``. Run it on two trees in the same minutes and compare (decision 0034).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from modelyard.config.model_config import ModelConfig
from modelyard.config.settings import DeviceConfig, ServerSettings
from modelyard.manager.manager import ModelManager
from tests.fakes.instance import FakeInstance

MIB = 1024 * 1024


async def measure(batch: int, requests: int, repeats: int) -> list[float]:
    """CPU µs per request of ``repeats`` runs of ``requests`` touches in ``batch``es."""
    with tempfile.TemporaryDirectory(prefix="bench-learning-cost-") as tmp:
        root = Path(tmp)
        names = ["m", "n"]
        for name in names:
            (root / name / "1").mkdir(parents=True)
            (root / name / "1" / "model.onnx").write_bytes(b"x" * 4096)
        settings = ServerSettings(
            model_repository=str(root),
            devices=[DeviceConfig(name="cpu", memory_budget_mb=1000)],
            models=[ModelConfig(name=n, path=n, memory_mb=40) for n in names],
        )
        manager = ModelManager(settings, lambda config: FakeInstance(40 * MIB))
        records = [manager.resolve(n, None) for n in names]
        for record in records:
            await manager.ensure_ready(record, deadline=None)
        learning = getattr(manager, "learning", None)
        samples = []
        for _ in range(repeats):
            cpu0 = time.thread_time()
            for i in range(requests // batch):
                record = records[i % 20 == 0]
                for _ in range(batch):
                    manager.touch(record)
                if learning is not None:
                    learning.flush()
            samples.append((time.thread_time() - cpu0) / (requests // batch * batch) * 1e6)
            await asyncio.sleep(0)
        await manager.close()
        return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 50])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    for batch in args.batch:
        samples = asyncio.run(measure(batch, args.requests, args.repeats))
        print(
            f"batches of {batch}: touch and learning per request, "
            f"median {statistics.median(samples):.2f} µs, best {min(samples):.2f} µs"
        )


if __name__ == "__main__":
    main()
