"""Client-side load generator for KServe v2 / Open Inference Protocol servers.

``modelyard bench`` on the command line (:mod:`modelyard.bench.cli`), or from Python::

    results = await run_bench(BenchConfig(url="http://127.0.0.1:8080", concurrency=(1, 8)))
"""

from modelyard.bench.config import BenchConfig
from modelyard.bench.errors import BenchConfigError, BenchError, EngineUnavailableError, TargetError
from modelyard.bench.results import BenchResult
from modelyard.bench.runner import run_bench
from modelyard.bench.workload import MixSpec, trace, uniform, zipf

__all__ = [
    "BenchConfig",
    "BenchConfigError",
    "BenchError",
    "BenchResult",
    "EngineUnavailableError",
    "MixSpec",
    "TargetError",
    "run_bench",
    "trace",
    "uniform",
    "zipf",
]
