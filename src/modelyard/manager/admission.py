"""Admission: how many bytes a load reserves, and whom it evicts to get them.

A load reserves its private bytes (and its mapped weight files, once per file) before
its worker starts; if they do not fit, the eviction policy names victims among the
READY, unpinned models of no higher priority, and the load waits on :attr:`changed`
until their memory is back. A load that cannot fit even then is refused with the
reason (pinned and higher-priority models named).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable

from modelyard.clock import Clock
from modelyard.errors import DeadlineExceededError, MemoryBudgetError
from modelyard.manager.budget import MemoryBudget, SharedFile
from modelyard.manager.eviction import EvictionPolicy, select_victims
from modelyard.manager.llm_memory import GgufEstimate, estimate_gguf
from modelyard.manager.records import ModelKey, ModelRecord
from modelyard.manager.states import RESIDENT, ModelState
from modelyard.repository.gguf import GGUFError
from modelyard.repository.layout import dir_size_bytes
from modelyard.runtimes.base import find_model_file
from modelyard.workers.footprint import MappedFile, weight_files

_MIB = 1024 * 1024
# A loaded ONNX model holds roughly its file size plus the runtime's buffers; the
# guess only has to be in the right range until the measured footprint replaces it.
_SIZE_GUESS_FACTOR = 1.2
_SIZE_GUESS_BASE_BYTES = 4 * _MIB


class Admission:
    """Reservations against the device budgets, with eviction to make room."""

    def __init__(
        self,
        budget: MemoryBudget,
        policy: EvictionPolicy,
        records: Callable[[], Iterable[ModelRecord]],
        evict: Callable[[ModelRecord, str], None],
        clock: Clock,
    ) -> None:
        self.budget = budget
        self.policy = policy
        self._records = records
        self._evict = evict
        """Starts evicting a victim in the background (the manager owns the task)."""
        self._clock = clock
        self.changed = asyncio.Condition()
        """Notified whenever memory is released or a model's state settles."""

    def records(self) -> Iterable[ModelRecord]:
        """Every known model version (the registry's)."""
        return self._records()

    def estimate_bytes(self, record: ModelRecord) -> int:
        """Private reservation before a load: max of declared, last measured and size guess.

        A ``share_weights`` model's mapped weight files are not part of it: ``admit``
        charges them through the budget's shared-file ledger, once per file however many
        models map it (see :meth:`mapped_files`).
        """
        files = self.mapped_files(record)
        weights = sum(f.size for f in files)
        declared = max(0, int((record.config.memory_mb or 0) * _MIB) - weights)
        measured = record.measured_bytes or 0
        gguf = self.gguf_estimate(record)
        if gguf is not None:
            # KV cache and compute buffers from the header; the file is charged apart.
            return max(declared, measured, gguf.private_bytes)
        private_files = max(0, dir_size_bytes(record.path) - weights)
        guess = int(private_files * _SIZE_GUESS_FACTOR) + _SIZE_GUESS_BASE_BYTES
        return max(declared, measured, guess)

    def gguf_estimate(self, record: ModelRecord) -> GgufEstimate | None:
        """The header-based estimate of a ``llama_cpp`` model (None for other runtimes, or
        when the file cannot be read: the load then fails with the reason)."""
        if record.config.runtime != "llama_cpp":
            return None
        try:
            path = find_model_file(record.path, (".gguf",), record.model_file)
            return estimate_gguf(path, record.config.generation)
        except (OSError, GGUFError):
            return None

    def mapped_files(self, record: ModelRecord) -> list[SharedFile]:
        """The weight files ``record``'s replica will memory-map: ``share_weights`` ONNX
        external data, or a ``llama_cpp`` model's GGUF file (always mapped)."""
        cfg = record.config
        if cfg.runtime == "llama_cpp":
            try:
                return [MappedFile.of(find_model_file(record.path, (".gguf",), record.model_file))]
            except OSError:
                return []
        if not (cfg.share_weights and cfg.runtime == "onnx"):
            return []
        return weight_files(record.path)

    def candidates(self, loader: ModelRecord, *, loading: bool = False) -> list[ModelRecord]:
        """Models ``loader`` may evict: READY ones (or, with ``loading``, those on the way)."""
        states = (ModelState.LOADING, ModelState.WARMING) if loading else (ModelState.READY,)
        return [
            r
            for r in self.records()
            if r is not loader
            and r.config.device == loader.config.device
            and r.state in states
            and not r.pinned
            and r.config.priority >= loader.config.priority
        ]

    def refusal(self, record: ModelRecord, need: int) -> MemoryBudgetError:
        dev = self.budget.device(record.config.device)
        pinned = [str(r.key) for r in self.records() if r.pinned and r.state in RESIDENT]
        higher = [
            str(r.key)
            for r in self.records()
            if r.state in RESIDENT and r.config.priority < record.config.priority
        ]
        return MemoryBudgetError(
            f"cannot load {record.key}: needs {need / _MIB:.1f} MiB on {dev.name}, budget "
            f"{dev.budget_bytes / _MIB:.1f} MiB with {dev.reserved_bytes / _MIB:.1f} MiB reserved; "
            f"pinned: {', '.join(pinned) or 'none'}; "
            f"higher priority: {', '.join(higher) or 'none'}",
            retry_after_s=5.0,
        )

    async def admit(
        self,
        record: ModelRecord,
        need: int,
        deadline: float | None,
        *,
        may_evict: bool = True,
    ) -> None:
        """Reserve ``need`` bytes for ``record``, evicting allowed victims to make room.

        With ``may_evict`` False (prefetches) it only takes free room, or refuses.
        """
        device = record.config.device
        dev = self.budget.device(device)
        # ``need`` is the private part; mapped weight files are charged once per file.
        files = self.mapped_files(record)
        whole = need + sum(f.size for f in set(files))
        if whole > dev.budget_bytes:
            gguf = self.gguf_estimate(record)
            why = "" if gguf is None else f" ({gguf.arithmetic()}): lower n_ctx or parallel"
            raise MemoryBudgetError(
                f"model {record.key} needs {whole / _MIB:.1f} MiB, more than the whole "
                f"{dev.budget_bytes / _MIB:.1f} MiB budget of {device}{why}"
            )
        while True:
            if self.budget.try_reserve(device, record.key, need, files):
                record.reserved_bytes = self.budget.reserved(device, record.key)
                return
            current = dev.reservations.get(record.key, 0)
            missing = need - current + dev.uncharged_bytes(files) - dev.free_bytes
            # What models already on their way out will give back, counted by the
            # budget: a file they share with models that stay is not freed by them.
            leaving_keys = [
                r.key
                for r in self.records()
                if r.config.device == device
                and r.state in (ModelState.DRAINING, ModelState.UNLOADING)
            ]
            leaving = self.budget.freed_by(device, leaving_keys, files)
            if not may_evict:
                raise self.refusal(record, need + dev.uncharged_bytes(files))
            if leaving < missing:
                victims = self.victims(record, missing, files, leaving_keys)
                if victims is None:
                    # Models still loading become evictable once READY: wait for them
                    # rather than refuse, unless even they could not make room.
                    others = self.candidates(record) + self.candidates(record, loading=True)
                    keys = leaving_keys + [r.key for r in others]
                    if self.budget.freed_by(device, keys, files) < missing:
                        raise self.refusal(record, need + dev.uncharged_bytes(files))
                else:
                    for victim in victims:
                        self._evict(victim, f"making room for {record.key}")
            remaining = None if deadline is None else deadline - self._clock.monotonic()
            if remaining is not None and remaining <= 0:
                raise DeadlineExceededError(
                    f"model {record.key} waited for memory past the request's deadline"
                )
            async with self.changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), remaining)

    def victims(
        self,
        record: ModelRecord,
        missing: int,
        files: list[SharedFile],
        leaving: list[ModelKey],
    ) -> list[ModelRecord] | None:
        """The shortest prefix of the policy's order that, with ``leaving``, frees ``missing``.

        Counted by the budget, not by each victim's own reservation: a weight file
        several models share is freed only when all of them go, and one ``record``
        will map anyway is not freed at all.
        """
        device = record.config.device
        candidates = self.candidates(record)
        if not files and not self.budget.device(device).shared:
            # No shared files: each victim frees exactly its own reservation.
            return select_victims(
                self.policy, candidates, missing - self.budget.freed_by(device, leaving)
            )
        chosen: list[ModelRecord] = []
        if self.budget.freed_by(device, leaving, files) >= missing:
            return chosen
        for victim in self.policy.order(candidates):
            chosen.append(victim)
            keys = leaving + [r.key for r in chosen]
            if self.budget.freed_by(device, keys, files) >= missing:
                return chosen
        return None

    def release(self, record: ModelRecord) -> None:
        self.budget.release(record.config.device, record.key)
        record.reserved_bytes = 0
