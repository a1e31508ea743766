"""The design notes' two memory techniques, measured: heap trimming and huge pages.

Run from the repository root (``PYTHONPATH=src``)::

    .venv/bin/python bench/bench_seed_memory.py trim [--cycles 20] [--size-mb 64]
    .venv/bin/python bench/bench_seed_memory.py thp  [--layers 12] [--tokens 32] [--rounds 2]

``trim``: RSS of a process that lives on (as the server does with inline models) after N
load/unload cycles of an ONNX model, with ``trim_heap()`` (glibc ``malloc_trim(0)``) after
each unload and without; one fresh process per mode, the same model file.

``thp``: a random-weight llama GGUF of about ``--layers`` x 100 MiB, loaded by
llama-cpp-python with its file memory-mapped, with ``advise_huge_pages`` on the mapping
(``madvise(MADV_HUGEPAGE)``) and without, alternating, each in a fresh process with the
file already in the page cache: load seconds, greedy decode tokens/s, and how much of the
mapping the kernel put on huge pages (``FilePmdMapped`` in ``/proc/self/smaps_rollup``).
The kernel's THP mode is printed first: with ``never`` the advice is a no-op.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MIB = 1024 * 1024


def _rss() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _rollup(field: str) -> int:
    with open("/proc/self/smaps_rollup", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _child_trim(model_dir: str, cycles: int, trim: bool) -> dict[str, object]:
    import numpy as np

    from modelyard.runtimes import RuntimeSpec, create_runtime
    from modelyard.runtimes.warmup import make_warmup_inputs
    from modelyard.workers.huge_pages import trim_heap

    start = _rss()
    after: list[int] = []
    for _ in range(cycles):
        runtime = create_runtime("onnx")
        runtime.load(RuntimeSpec("onnx", model_dir, "mlp"))
        for _ in range(4):
            runtime.infer(make_warmup_inputs(runtime.inputs))
        # What a server keeps between loads: small objects made while this model served.
        np.zeros(8)
        runtime.close()
        del runtime
        if trim:
            trim_heap()
        after.append(_rss())
    return {"start_mb": start / MIB, "after_mb": [round(a / MIB, 1) for a in after]}


def _child_thp(path: str, tokens: int, advise: bool) -> dict[str, object]:
    from llama_cpp import Llama

    from modelyard.workers.huge_pages import advise_huge_pages

    t0 = time.perf_counter()
    llm = Llama(model_path=path, n_ctx=256, n_threads=2, n_batch=64, use_mmap=True, verbose=False)
    advised = advise_huge_pages(Path(path).parent, 0) if advise else 0
    load_s = time.perf_counter() - t0
    prompt = llm.tokenize(b"The quick brown fox jumps over the lazy dog.", add_bos=True)
    t1 = time.perf_counter()
    for n, _ in enumerate(llm.generate(prompt, temp=0.0, top_k=0, top_p=1.0, min_p=0.0), 1):
        if n == 1:
            t1 = time.perf_counter()  # decode only: the prompt's evaluation is not counted
        if n > tokens:
            break
    decode_s = time.perf_counter() - t1
    pmd = _rollup("FilePmdMapped")
    llm.close()
    return {
        "advised_mb": advised / MIB,
        "load_s": load_s,
        "tokens_per_s": tokens / decode_s,
        "file_pmd_mapped_mb": pmd / MIB,
    }


def _run_child(*args: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", *args], capture_output=True, text=True, check=True
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def bench_trim(cycles: int, size_mb: int) -> None:
    from modelyard.examples.mlp import build_mlp_onnx

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "mlp" / "1" / "model.onnx"
        build_mlp_onnx(model, size_mb)
        rows = {}
        for trim in (False, True):
            rows[trim] = _run_child("trim", str(model.parent), str(cycles), str(int(trim)))
    off, on = rows[False], rows[True]
    print(f"ONNX MLP of {size_mb} MiB, {cycles} load/unload cycles in one process")
    for name, row in (("without trim", off), ("with trim", on)):
        after = row["after_mb"]
        assert isinstance(after, list)
        print(
            f"  {name:13} RSS start {row['start_mb']:.0f} MiB, after cycle 1 {after[0]:.0f}, "
            f"after cycle {cycles} {after[-1]:.0f} MiB"
        )
    off_after, on_after = off["after_mb"], on["after_mb"]
    assert isinstance(off_after, list)
    assert isinstance(on_after, list)
    print(
        f"  ratio RSS after the last cycle, with/without trim: {on_after[-1] / off_after[-1]:.2f}"
    )


def bench_thp(layers: int, tokens: int, rounds: int) -> None:
    from modelyard.examples.gguf_llama import LlamaShape, write_llama_gguf

    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
    print(f"THP mode (transparent_hugepage/enabled): {mode}")
    shape = LlamaShape(layers=layers, width=2048, feed_forward=5632, heads=16, kv_heads=4)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big" / "model.gguf"
        t0 = time.perf_counter()
        write_llama_gguf(path, shape)
        size = path.stat().st_size
        print(f"GGUF {size / MIB:.0f} MiB written in {time.perf_counter() - t0:.0f} s")
        path.read_bytes()  # in the page cache for every run
        results: dict[bool, list[dict[str, object]]] = {False: [], True: []}
        for _ in range(rounds):
            for advise in (False, True):
                results[advise].append(_run_child("thp", str(path), str(tokens), str(int(advise))))
    for advise in (False, True):
        for r in results[advise]:
            print(
                f"  madvise={'on ' if advise else 'off'} load {r['load_s']:.2f} s, "
                f"{r['tokens_per_s']:.2f} tokens/s, FilePmdMapped {r['file_pmd_mapped_mb']:.0f} MiB"
            )

    def best(advise: bool, key: str) -> float:
        values = [float(str(r[key])) for r in results[advise]]
        return max(values) if key == "tokens_per_s" else min(values)

    decode = best(True, "tokens_per_s") / best(False, "tokens_per_s")
    load = best(True, "load_s") / best(False, "load_s")
    print(
        f"  ratio on/off: decode tokens/s {decode:.2f}, load s {load:.2f} (best of {rounds} each)"
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, *rest = sys.argv[2:]
        if kind == "trim":
            print(json.dumps(_child_trim(rest[0], int(rest[1]), rest[2] == "1")))
        else:
            print(json.dumps(_child_thp(rest[0], int(rest[1]), rest[2] == "1")))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    trim = sub.add_parser("trim")
    trim.add_argument("--cycles", type=int, default=20)
    trim.add_argument("--size-mb", type=int, default=64)
    thp = sub.add_parser("thp")
    thp.add_argument("--layers", type=int, default=12)
    thp.add_argument("--tokens", type=int, default=32)
    thp.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.what == "trim":
        bench_trim(args.cycles, args.size_mb)
    else:
        bench_thp(args.layers, args.tokens, args.rounds)


if __name__ == "__main__":
    main()
