"""LoRA adapters over a base model: which records are adapters, and of which base.

An adapter (``base:`` in its config) is served inside its base's worker
(``workers/adapter_instance.py``), so the manager keeps three rules here:

* loading an adapter loads its base first (if it is not resident), as the one load of
  the weights; the adapter is placed on the base's device;
* a base that a resident adapter uses is never evicted before it: its adapters are
  candidates on their own (each with its own reservation); the base is one only when
  every adapter using it is a candidate too, and then comes after all of them (an
  eviction that needs the base's room takes its adapters first);
* unloading a base (on request, on removal, at shutdown) unloads its adapters first,
  each releasing its own reservation.
"""

from __future__ import annotations

from collections.abc import Iterable

from modelyard.manager.records import ModelRecord
from modelyard.manager.states import RESIDENT, ModelState
from modelyard.workers.adapter_instance import AdapterInstance

_USING = RESIDENT | {ModelState.UNLOADING}
"""An adapter in these states holds a context in its base's worker (or is loading one)."""


def is_adapter(record: ModelRecord) -> bool:
    """True for a LoRA adapter over another model."""
    return record.config.base is not None


def adapters_using(base: ModelRecord, records: Iterable[ModelRecord]) -> list[ModelRecord]:
    """The adapters among ``records`` that hold (or are loading) a context over ``base``
    (an attached one: in this version's worker, not another version's)."""
    name = base.key.name
    return [
        r
        for r in records
        if r.config.base == name
        and r.state in _USING
        and (not isinstance(r.instance, AdapterInstance) or r.instance.base is base.instance)
    ]


def bases_in_use(records: Iterable[ModelRecord]) -> set[str]:
    """The names of the models that resident (or loading) adapters among ``records`` use."""
    return {r.config.base for r in records if r.config.base is not None and r.state in _USING}


def adapters_first(
    candidates: list[ModelRecord], records: Iterable[ModelRecord]
) -> tuple[list[ModelRecord], list[ModelRecord]]:
    """``(others, bases)``: eviction ``candidates`` less the bases resident adapters use,
    and those bases whose every such adapter is among the candidates (to be taken
    after them, never before; a base with an adapter that may not go stays)."""
    records = list(records)
    in_use = bases_in_use(records)
    others = [r for r in candidates if r.key.name not in in_use]
    chosen = {id(r) for r in others}
    bases = [
        r
        for r in candidates
        if r.key.name in in_use and all(id(a) in chosen for a in adapters_using(r, records))
    ]
    return others, bases
