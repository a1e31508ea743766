"""Cost of decoding a v2 REST infer body (JSON parse + tensor build + checks), per request.

Run from the repository root::

    .venv/bin/python bench/bench_decode.py            # FP32 and INT64, 4 to 262,144 elements
    .venv/bin/python bench/bench_decode.py --quick    # fewer rounds

Times :func:`modelyard.frontends.http.codec.decode_request` on bodies built once per case
(the same path the server runs for every JSON infer request, without sockets or models),
and :func:`encode_response` of the same tensor as an FP32 output. Each figure is the
thread's CPU time per call, the best of ``--repeats`` rounds, so that other load on the
machine inflates it as little as possible. Compare two checkouts by running the script in each.
"""

from __future__ import annotations

import argparse
import json
import time
import timeit

import numpy as np
import orjson

from modelyard.frontends.http.codec import decode_request, encode_response
from modelyard.protocol.tensors import output_from_array
from modelyard.protocol.types import InferResponse

SIZES = (4, 64, 4096, 262_144)
DATATYPES = ("FP32", "INT64")


def _body(datatype: str, n: int) -> bytes:
    rng = np.random.default_rng(0)
    data = rng.random(n).tolist() if datatype == "FP32" else rng.integers(-1000, 1000, n).tolist()
    doc = {"inputs": [{"name": "x", "shape": [1, n], "datatype": datatype, "data": data}]}
    return orjson.dumps(doc)


def _best_us(fn: object, number: int, repeats: int) -> float:
    # CPU time of this thread, not wall time: other load on the machine then changes
    # the figure much less (it still shares caches and memory bandwidth).
    times = timeit.repeat(fn, number=number, repeat=repeats, timer=time.thread_time)  # type: ignore[arg-type]
    return min(times) / number * 1e6


def main() -> None:
    """Print one JSON line per case: datatype, elements, decode and encode microseconds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--repeats", type=int, default=7, help="rounds; the best is kept")
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    for datatype in DATATYPES:
        for n in SIZES:
            body = _body(datatype, n)
            number = max(1, 200_000 // (n + 50))
            req = decode_request(body, None, "m", None)
            decode_us = _best_us(lambda b=body: decode_request(b, None, "m", None), number, repeats)
            out = output_from_array("y", req.inputs[0].array.astype(np.float32))
            resp = InferResponse("m", "1", [out])
            encode_us = _best_us(lambda r=resp, q=req: encode_response(r, q), number, repeats)
            print(
                json.dumps(
                    {
                        "datatype": datatype,
                        "elements": n,
                        "decode_us": round(decode_us, 2),
                        "encode_us": round(encode_us, 2),
                    }
                )
            )


if __name__ == "__main__":
    main()
