"""The job inbox, cancellations and thread every generative runtime runs its model on.

A runtime (``llama_cpp``, ``transformers``) subclasses :class:`GenerationThread` and
writes :meth:`GenerationThread._run`, the loop that takes jobs from ``_inbox`` (a None
there wakes the loop: on close, and, where the loop sleeps between steps, on a cancel).
"""

from __future__ import annotations

import queue
import threading
from abc import ABC, abstractmethod
from typing import ClassVar

from modelyard.errors import ServerError
from modelyard.runtimes.generation import GenerationJob, GenerationSink


class GenerationThread(ABC):
    """``start``, ``submit`` and ``cancel`` of a generative runtime, on its own thread."""

    _thread_name: ClassVar[str] = "generate"
    _wake_on_cancel: ClassVar[bool] = False
    """Whether a cancel wakes an idle loop (one that holds jobs between its steps)."""

    def __init__(self) -> None:
        self._sink: GenerationSink | None = None
        self._inbox: queue.SimpleQueue[GenerationJob | None] = queue.SimpleQueue()
        self._cancelled: set[int] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    def start(self, sink: GenerationSink) -> None:
        """Start the generation thread."""
        self._sink = sink
        self._thread = threading.Thread(target=self._run, name=self._thread_name, daemon=True)
        self._thread.start()

    def submit(self, job: GenerationJob) -> None:
        """Queue ``job`` for the generation thread."""
        self._inbox.put(job)

    def cancel(self, seq: int) -> None:
        """Stop job ``seq`` at the thread's next step."""
        with self._lock:
            self._cancelled.add(seq)
        if self._wake_on_cancel:
            self._inbox.put(None)

    def _stop_thread(self) -> None:
        self._closed = True
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _fail(self, seq: int, exc: ServerError) -> None:
        if self._sink is not None:
            self._sink.failed(seq, exc.code.value, exc.message)

    @abstractmethod
    def _run(self) -> None:
        """The generation loop, until ``_closed``."""
