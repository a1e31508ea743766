"""Aliases, blue-green switches, rollback, and the old version's grace period.

A switch never leaves an alias pointing at a version that is not serving: the new
version is verified (manifest), loaded and warmed up first; only then is the alias
route replaced, in one assignment. Requests already routed to the old version finish
there; it stays loaded for ``rollback_grace_s`` so that a rollback is instant.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping

from modelyard.errors import InvalidInputError, ModelStateConflictError
from modelyard.manager.manager import ModelManager
from modelyard.manager.records import DEFAULT_ALIAS, AliasRoute, ModelEntry
from modelyard.manager.states import ModelState
from modelyard.repository.version_labels import is_version_label, newest_version

log = logging.getLogger("modelyard.versions")


class VersionController:
    """Moves aliases between versions of a model, with rollback."""

    def __init__(self, manager: ModelManager, grace_s: float) -> None:
        self.manager = manager
        self.grace_s = grace_s
        self._grace_tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._switch_locks: dict[str, asyncio.Lock] = {}

    async def close(self) -> None:
        """Cancel pending grace-period unloads."""
        for task in self._grace_tasks.values():
            task.cancel()
        await asyncio.gather(*self._grace_tasks.values(), return_exceptions=True)
        self._grace_tasks.clear()

    def aliases(self, name: str) -> dict[str, dict[str, float]]:
        """Every alias of ``name`` with its ``{version: weight}``."""
        entry = self.manager.entry(name)
        return {alias: route.to_dict() for alias, route in entry.aliases.items()}

    def current_versions(self, entry: ModelEntry, alias: str) -> list[str]:
        """Versions the alias routes to now (the newest version if it is unset)."""
        route = entry.aliases.get(alias)
        if route is not None:
            return route.versions
        if alias == DEFAULT_ALIAS and entry.versions:
            return [newest_version(entry.versions)]
        return []

    async def set_alias(
        self, name: str, alias: str, targets: Mapping[str, float]
    ) -> dict[str, float]:
        """Point ``alias`` at ``targets`` (``{version: weight}``) after they are ready."""
        if not targets:
            raise InvalidInputError("an alias needs at least one version")
        if any(w <= 0 for w in targets.values()):
            raise InvalidInputError("alias weights must be positive")
        if is_version_label(alias):
            raise InvalidInputError(
                "an alias name cannot be a version label (numbers joined by '.', '-' or '_')"
            )
        manager = self.manager
        entry = manager.entry(name)
        lock = self._switch_locks.setdefault(name, asyncio.Lock())
        async with lock:
            records = [manager.record_for(name, str(v)) for v in targets]
            # Blue-green: every target is verified, loaded and warmed up before it
            # takes traffic; a failure leaves the alias where it was.
            await asyncio.gather(
                *(manager.ensure_ready(r, deadline=None, cold_start=False) for r in records)
            )
            route = AliasRoute(tuple((str(v), float(w)) for v, w in targets.items()))
            previous = entry.aliases.get(alias)
            if previous is None and alias == DEFAULT_ALIAS:
                old = self.current_versions(entry, alias)
                previous = AliasRoute(((old[0], 1.0),)) if old else None
            if previous is not None and previous != route:
                entry.alias_history.setdefault(alias, []).append(previous)
            entry.aliases[alias] = route
            self._after_switch(entry, previous, route, alias)
        return route.to_dict()

    async def rollback(self, name: str, alias: str = DEFAULT_ALIAS) -> dict[str, float]:
        """Move ``alias`` back to its previous route; instant when those versions are loaded."""
        manager = self.manager
        entry = manager.entry(name)
        lock = self._switch_locks.setdefault(name, asyncio.Lock())
        async with lock:
            history = entry.alias_history.get(alias) or []
            if not history:
                raise ModelStateConflictError(
                    f"alias {alias!r} of model {name!r} has no previous version to roll back to"
                )
            previous = history[-1]
            records = [manager.record_for(name, v) for v in previous.versions]
            await asyncio.gather(
                *(manager.ensure_ready(r, deadline=None, cold_start=False) for r in records)
            )
            history.pop()
            current = entry.aliases.get(alias)
            entry.aliases[alias] = previous
            manager.events.add(
                "rollback",
                records[0].key,
                f"alias {alias!r} back to {previous.to_dict()} from "
                f"{current.to_dict() if current else None}",
            )
            log.info("model %s: alias %r rolled back to %s", name, alias, previous.to_dict())
            if current is not None:
                self._schedule_grace(
                    entry, [v for v in current.versions if v not in previous.versions]
                )
        return previous.to_dict()

    def _after_switch(
        self, entry: ModelEntry, previous: AliasRoute | None, route: AliasRoute, alias: str
    ) -> None:
        for version in route.versions:
            task = self._grace_tasks.pop((entry.config.name, version), None)
            if task is not None:
                task.cancel()
        key = entry.versions[route.versions[0]].key
        self.manager.events.add(
            "version_switched",
            key,
            f"alias {alias!r} → {route.to_dict()}"
            + (f" (was {previous.to_dict()})" if previous else ""),
        )
        log.info("model %s: alias %r now routes to %s", entry.config.name, alias, route.to_dict())
        if previous is not None:
            self._schedule_grace(entry, [v for v in previous.versions if v not in route.versions])

    def _referenced(self, entry: ModelEntry, version: str) -> bool:
        return any(version in r.versions for r in entry.aliases.values())

    def _schedule_grace(self, entry: ModelEntry, versions: list[str]) -> None:
        for version in versions:
            key = (entry.config.name, version)
            if key in self._grace_tasks:
                continue
            task = asyncio.ensure_future(self._unload_after_grace(entry, version))
            self._grace_tasks[key] = task
            task.add_done_callback(functools.partial(self._forget_grace, key))

    def _forget_grace(self, key: tuple[str, str], _task: asyncio.Task[None]) -> None:
        self._grace_tasks.pop(key, None)

    async def _unload_after_grace(self, entry: ModelEntry, version: str) -> None:
        await asyncio.sleep(self.grace_s)
        record = entry.versions.get(version)
        if record is None or self._referenced(entry, version):
            return
        if record.state is ModelState.READY:
            log.info("unloading %s: replaced, grace period over", record.key)
            await self.manager.unload(entry.config.name, version)
