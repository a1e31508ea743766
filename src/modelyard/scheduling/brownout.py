"""Brownout of a generative model: under overload, a shorter answer rather than a late one.

A generation request holds one of the model's ``parallel`` slots for as long as it
generates, so the time a queued request waits grows with the ``max_tokens`` of the
requests ahead of it. Under overload the model's ``brownout_max_tokens`` caps the
``max_tokens`` of each newly admitted request: every answer comes back shorter (and says
so), and the queue drains faster.

**Overload** is decided once, when a request arrives at the model's generation gate:
every slot is busy *and* at least ``brownout_queue_depth`` requests already wait (0: every
slot busy is enough). The rule is pure; the data plane applies the cap, marks the
answer and counts it.
"""

from __future__ import annotations

__all__ = ["brownout_cap", "is_overloaded"]


def is_overloaded(running: int, slots: int, queued: int, queue_depth: int) -> bool:
    """True when all ``slots`` are busy and at least ``queue_depth`` requests wait."""
    return running >= slots and queued >= queue_depth


def brownout_cap(
    max_tokens: int | None,
    brownout_max_tokens: int | None,
    *,
    running: int,
    slots: int,
    queued: int,
    queue_depth: int,
) -> int | None:
    """The ``max_tokens`` to impose on a request arriving now, or None to leave it as is.

    None when brownout is off (``brownout_max_tokens`` None), when the model is not
    overloaded, or when the request already asks for no more than the cap (it is not cut
    short, so it is not marked). ``max_tokens`` None (until the context is full) is capped.
    """
    if brownout_max_tokens is None:
        return None
    if not is_overloaded(running, slots, queued, queue_depth):
        return None
    if max_tokens is not None and max_tokens <= brownout_max_tokens:
        return None
    return brownout_max_tokens
