"""Poll mode (``--model-control-mode poll``): follow version folders as they come and go."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from modelyard.errors import ServerError
from modelyard.manager.manager import ModelManager
from modelyard.manager.records import DEFAULT_ALIAS, AliasRoute, ModelEntry
from modelyard.manager.states import ModelState
from modelyard.manager.versions import VersionController
from modelyard.repository.layout import served_versions
from modelyard.repository.version_labels import newest_version, order_key
from modelyard.repository.watcher import RepositoryWatcher

log = logging.getLogger("modelyard.poller")


class RepositoryPoller:
    """Rescans every model folder; new versions are verified, loaded and switched to."""

    def __init__(
        self,
        manager: ModelManager,
        versions: VersionController,
        interval_s: float,
        settle_s: float,
    ) -> None:
        self.manager = manager
        self.versions = versions
        self.interval_s = interval_s
        self.watcher = RepositoryWatcher(settle_s)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start polling in the background."""
        for entry in self.manager.entries.values():
            # What was there at start-up is known already; only changes matter (a version
            # that failed to load at start is offered again once its files change).
            for version in entry.versions:
                self.watcher.note_taken(entry.path / version)
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        """Stop polling."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            for entry in list(self.manager.entries.values()):
                try:
                    await self.poll_once(entry)
                except Exception:  # one model's trouble must not stop polling the others
                    log.exception("polling %s failed", entry.config.name)

    async def poll_once(self, entry: ModelEntry) -> None:
        """Apply one scan of ``entry``'s folder."""
        name = entry.config.name
        if any(r.model_file for r in entry.versions.values()):
            return  # a config path naming one file: there are no version folders to follow
        refused = {v for v, r in entry.versions.items() if r.state is ModelState.FAILED}
        result = await asyncio.to_thread(
            self.watcher.scan, entry.path, set(entry.versions), refused
        )
        for version in result.removed:
            await self._remove(entry, version)
        if not result.ready:
            return
        allowed = {str(v) for v in served_versions(entry.path, entry.config.version_policy)}
        for version in result.ready:
            record = self.manager.record_for(name, version)
            if version in refused:
                log.info("refused version %s changed on disk; offering it again", record.key)
            else:
                log.info("new version %s found", record.key)
        offered = [v for v in result.ready if v in allowed]
        newest = newest_version(offered) if offered else None
        route = entry.aliases.get(DEFAULT_ALIAS)
        # Only versions still there count: a default left pointing nowhere is replaced.
        current = [v for v in route.versions if v in entry.versions] if route else []
        if newest is None or (current and order_key(newest) <= order_key(newest_version(current))):
            return
        try:
            await self.versions.set_alias(name, DEFAULT_ALIAS, {newest: 1.0})
        except ServerError as exc:
            log.error("version %s:%s refused; %s keeps serving: %s", name, newest, current, exc)
            if not current:
                # Unversioned requests must still find the best version there is.
                self._fall_back(entry, DEFAULT_ALIAS, removed=None)

    def _fall_back(self, entry: ModelEntry, alias: str, removed: str | None) -> None:
        """Point ``alias`` at its newest earlier route that still exists and did not fail.

        The default alias, with no such route, goes to the newest version that is READY,
        else to the newest one that may still load; with none, it is unset (unversioned
        requests then get 404 naming the missing versions).
        """

        def usable(v: str) -> bool:
            r = entry.versions.get(v)
            return v != removed and r is not None and r.state is not ModelState.FAILED

        for route in reversed(entry.alias_history.get(alias, [])):
            if all(usable(v) for v in route.versions):
                entry.aliases[alias] = route
                return
        candidates = [v for v in entry.versions if usable(v)]
        ready = [v for v in candidates if entry.versions[v].is_ready]
        if alias == DEFAULT_ALIAS and candidates:
            entry.aliases[alias] = AliasRoute(((newest_version(ready or candidates), 1.0),))
        else:
            entry.aliases.pop(alias, None)

    async def _remove(self, entry: ModelEntry, version: str) -> None:
        record = entry.versions.get(version)
        if record is None:
            return
        for alias, route in list(entry.aliases.items()):
            if version in route.versions:
                rest = [(v, w) for v, w in route.targets if v != version]
                if rest:
                    entry.aliases[alias] = AliasRoute(tuple(rest))
                else:
                    self._fall_back(entry, alias, version)
        log.info("version folder %s removed; draining and unloading", record.key)
        # Even a version still loading goes: its load is cancelled, its worker stopped.
        await self.manager.remove_version(record, reason="version folder removed")
