"""Element budgets of inference requests: counted from shapes, before allocation.

Both decoders (REST JSON or binary, gRPC) call :func:`count_elements` once per input
tensor with its declared shape, before building the array, so a request whose shapes
ask for more than the server allows costs no memory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from modelyard.errors import PayloadTooLargeError


def count_elements(name: str, shape: Sequence[int], so_far: int, limit: int | None) -> int:
    """``so_far`` plus the elements of ``shape``; PayloadTooLargeError once over ``limit``.

    ``limit`` None counts without bounding.
    """
    total = so_far + math.prod(shape)
    if limit is not None and total > limit:
        raise PayloadTooLargeError(
            f"input {name!r} brings the request to {total} tensor elements; "
            f"the server accepts at most {limit} per request (limits.max_request_elements)"
        )
    return total
