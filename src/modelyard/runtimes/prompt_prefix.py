"""Prompt-prefix reuse: which sequence slot's KV cache already holds a new prompt's start.

A llama.cpp context keeps one KV cache region per sequence slot (``n_ctx`` tokens each).
When a job ends, its slot keeps what it evaluated (prompt and generated tokens) instead of
clearing it; the next job whose prompt starts with those tokens (a shared system prompt, a
few-shot header, a conversation's earlier turns, the same prompt again) takes that slot,
drops only the tail that differs and evaluates the rest. llama.cpp's own server and
llama-cpp-python's ``Llama`` object do the same with their one cached prompt.

The cache is bounded by what it lives in: the slots' KV cache, ``n_ctx x parallel`` tokens,
which the budget already charges in full (``manager/llm_memory.py``). Nothing is copied
and no byte is added.
"""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class SlotPrefixes:
    """The tokens each slot's KV cache holds, and the choice of a slot for a new prompt."""

    def __init__(self, slots: int, *, enabled: bool = True) -> None:
        self._held: list[list[int]] = [[] for _ in range(slots)]
        self._last_used = [0] * slots
        self._uses = 0
        self.enabled = enabled

    def choose(self, free: Sequence[int], prompt: Sequence[int]) -> tuple[int, int]:
        """``(slot, reusable)``: the free slot that keeps the most of what the slots hold,
        and how many of its cached tokens the job may keep.

        A slot scores the tokens it shares with ``prompt`` less those it would drop (its
        cache past the shared start), so that a prompt sharing only a BOS token does not
        wipe another prompt's header while an empty slot is free; ties go to the slot
        used longest ago, so that the prefixes used lately stay. At least the prompt's
        last token is evaluated again: its logits give the first sampled token, and the
        cache keeps no logits.
        """
        best, best_score, best_shared = free[0], None, 0
        for slot in free:
            shared = common_prefix(self._held[slot], prompt) if self.enabled else 0
            score = 2 * shared - len(self._held[slot])
            if (
                best_score is None
                or score > best_score
                or (score == best_score and self._last_used[slot] < self._last_used[best])
            ):
                best, best_score, best_shared = slot, score, shared
        self._uses += 1
        self._last_used[best] = self._uses
        return best, min(best_shared, len(prompt) - 1)

    def keep(self, slot: int, tokens: list[int]) -> None:
        """``tokens`` are in ``slot``'s cache now (positions 0…)."""
        self._held[slot] = tokens if self.enabled else []

    def held(self, slot: int) -> list[int]:
        """The tokens ``slot``'s cache holds."""
        return self._held[slot]

    def forget(self, slot: int) -> None:
        """``slot``'s cache was cleared (or its content is unknown)."""
        self._held[slot] = []
