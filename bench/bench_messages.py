"""Cost of the worker control messages on the inference hot path.

Run from the repository root::

    .venv/bin/python bench/bench_messages.py            # 200,000 round trips, 5 repeats
    .venv/bin/python bench/bench_messages.py --quick    # 20,000, 3 repeats

Each inference crosses the process boundary as two messages: ``Infer`` (server → worker)
and ``InferDone`` (worker → server), each naming its tensors' places in the shared region.
Two figures, best of the repeats, per round trip:

- **codec**: encode ``Infer``, decode it, encode ``InferDone``, decode it (the CPU work
  the server and the worker add, both sides counted);
- **socket**: the same four steps plus one ``SOCK_SEQPACKET`` send and receive each way,
  through a socket pair in this one process (no scheduler noise from a second process);
- **region**: the tensor side of the same round trip through a :class:`SharedRegion`: the
  server writes the inputs, the worker reads them in place and writes the outputs after
  them, the server copies the outputs out (both ends in this one process).

Tensor data never travels in these messages, so the figures do not depend on tensor size;
two inputs and one output, as a small tabular model has.
"""

from __future__ import annotations

import argparse
import socket
import time

import numpy as np

from modelyard.workers.channel import SharedRegion
from modelyard.workers.messages import Infer, InferDone, TensorMeta, decode, encode

INPUTS = (TensorMeta("x", "<f4", (8, 4), 0, 128), TensorMeta("mask", "<i8", (8, 4), 128, 256))
OUTPUTS = (TensorMeta("y", "<f4", (8, 3), 0, 96),)


def codec(n: int) -> float:
    """Seconds per round trip of encode/decode only."""
    start = time.perf_counter()
    for seq in range(n):
        decode(encode(Infer(seq, 1 << 20, INPUTS)))
        decode(encode(InferDone(seq, 1 << 20, OUTPUTS)))
    return (time.perf_counter() - start) / n


def over_socket(n: int) -> float:
    """Seconds per round trip with a datagram each way through a socket pair."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    buf = bytearray(256 * 1024)
    view = memoryview(buf)
    try:
        start = time.perf_counter()
        for seq in range(n):
            a.send(encode(Infer(seq, 1 << 20, INPUTS)))
            decode(view[: b.recv_into(buf)])
            b.send(encode(InferDone(seq, 1 << 20, OUTPUTS)))
            decode(view[: a.recv_into(buf)])
        return (time.perf_counter() - start) / n
    finally:
        a.close()
        b.close()


def region_round_trip(n: int) -> float:
    """Seconds per round trip of the shared-region work (inputs and outputs as above)."""
    region = SharedRegion.create()
    inputs = {
        "x": np.ones((8, 4), dtype=np.float32),
        "mask": np.zeros((8, 4), dtype=np.int64),
    }
    outputs = {"y": np.ones((8, 3), dtype=np.float32)}
    try:
        start = time.perf_counter()
        for _ in range(n):
            metas, _ = region.write(inputs)
            region.read(metas, copy=False)
            out_metas, _ = region.write(outputs, start=region.end_of(metas))
            region.read(out_metas, copy=True)
        return (time.perf_counter() - start) / n
    finally:
        region.close()


def main() -> None:
    """Print the best codec and socket round trip in microseconds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20,000 round trips, 3 repeats")
    args = parser.parse_args()
    n, repeats = (20_000, 3) if args.quick else (200_000, 5)
    sizes = (len(encode(Infer(1, 1 << 20, INPUTS))), len(encode(InferDone(1, 1 << 20, OUTPUTS))))
    best_codec = min(codec(n) for _ in range(repeats))
    best_socket = min(over_socket(n) for _ in range(repeats))
    best_region = min(region_round_trip(n // 4) for _ in range(repeats))
    print(f"message bytes: Infer {sizes[0]}, InferDone {sizes[1]}")
    print(f"codec round trip:  {best_codec * 1e6:.2f} us")
    print(f"socket round trip: {best_socket * 1e6:.2f} us")
    print(f"region round trip: {best_region * 1e6:.2f} us")


if __name__ == "__main__":
    main()
