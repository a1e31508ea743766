"""A sink that collects what a generative runtime reports, for in-process runtime tests."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from modelyard.protocol.generate import TokenLogprob
from modelyard.runtimes.generation import GenerationJob


@dataclass
class Report:
    """Everything reported for one job."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    chunks: int = 0
    finish_reason: str | None = None
    completion_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    error: tuple[str, str] | None = None
    done: threading.Event = field(default_factory=threading.Event)


class CollectingSink:
    """Collects chunks and failures per job ``seq``."""

    def __init__(self) -> None:
        self.reports: dict[int, Report] = {}

    def _of(self, seq: int) -> Report:
        return self.reports.setdefault(seq, Report())

    def chunk(
        self,
        seq: int,
        text: str,
        token_ids: list[int],
        finish_reason: str | None,
        prompt_tokens: int,
        completion_tokens: int,
        logprobs: tuple[TokenLogprob, ...] = (),
    ) -> None:
        r = self._of(seq)
        r.text += text
        r.token_ids += token_ids
        r.logprobs += logprobs
        r.chunks += 1
        r.completion_tokens = completion_tokens
        if finish_reason is not None:
            r.finish_reason = finish_reason
            r.done.set()

    def failed(self, seq: int, code: str, message: str) -> None:
        r = self._of(seq)
        r.error = (code, message)
        r.done.set()

    def wait(self, seq: int, timeout_s: float = 60) -> Report:
        r = self._of(seq)
        assert r.done.wait(timeout_s), f"job {seq} did not end"
        return r


GREEDY: dict[str, Any] = {
    "messages": None,
    "max_tokens": 8,
    "temperature": 0.0,
    "top_p": 1.0,
    "top_k": 0,
    "seed": None,
    "stop": (),
}
"""A generation job's fields for 8 greedy tokens (override any by keyword)."""


def greedy_job(seq: int, prompt: str, **fields: Any) -> GenerationJob:
    """Job ``seq`` generating from ``prompt`` with :data:`GREEDY`'s fields and ``fields``."""
    return GenerationJob(seq, prompt, **(GREEDY | fields))
