"""The registry: which models and versions exist, and which record serves a request.

It owns the ``name → ModelEntry`` map: models from the YAML, folders registered over the
API (through the ``remote_load:`` gate), the version records found on disk, their
aliases, and the runtime pins. It starts and stops nothing; the lifecycle does.
"""

from __future__ import annotations

import difflib
import logging
import random
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from modelyard.clock import Clock
from modelyard.config.model_config import ModelConfig
from modelyard.config.settings import ServerSettings
from modelyard.errors import (
    InvalidInputError,
    ModelLoadError,
    ModelNotFoundError,
    ModelStateConflictError,
)
from modelyard.manager.events import EventLog
from modelyard.manager.records import (
    DEFAULT_ALIAS,
    SINGLE_FILE_VERSION,
    AliasRoute,
    ModelEntry,
    ModelKey,
    ModelRecord,
)
from modelyard.manager.remote_load import (
    check_config,
    check_fields,
    folder_in_repository,
    shown_path,
)
from modelyard.manager.states import RESIDENT
from modelyard.protocol.names import check_model_name
from modelyard.repository.layout import missing_versions_reason, served_versions
from modelyard.repository.runtime_guess import UnsupportedModelFormatError, guess_runtime
from modelyard.repository.version_labels import is_version_label, newest_version, sort_versions
from modelyard.runtimes.base import find_model_file

log = logging.getLogger("modelyard.manager")


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` naming the known names closest to ``name``, or ``""``.

    A typo in a model name is the commonest first mistake; the error then says what
    the user probably meant instead of only that the name is unknown.
    """
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    if not close:
        return ""
    return f"; did you mean {' or '.join(repr(c) for c in close)}?"


class ModelRegistry:
    """Every known model (``entries``), its versions, aliases and pins."""

    def __init__(self, settings: ServerSettings, events: EventLog, clock: Clock) -> None:
        self._settings = settings
        self._clock = clock
        self.events = events
        self.entries: dict[str, ModelEntry] = {}
        self._rng = random.Random()

    def add_model(self, config: ModelConfig) -> ModelEntry:
        """Register a model and discover its versions on disk."""
        path = self._settings.model_path(config)
        entry = ModelEntry(config=config, path=path)
        previous = self.entries.get(config.name)
        if previous is not None:
            # A pin set over the API belongs to the model, not to one configuration.
            entry.runtime_pin = previous.runtime_pin
        self.entries[config.name] = entry
        self.refresh_versions(entry)
        default = config.default_version
        if default is None and entry.versions:
            default = newest_version(entry.versions)
        if default is not None:
            # Unversioned requests follow this alias; it moves only by a switch (API or
            # poll), so a new version folder never takes traffic before it is verified.
            try:
                self.record_for(config.name, default)
            except ModelNotFoundError as exc:
                # Reported, and unversioned requests get 404 naming it: never another version.
                log.error("%s: %s", self.field(entry, "default_version"), exc)
            entry.aliases[DEFAULT_ALIAS] = AliasRoute(((default, 1.0),))
        return entry

    def _check_may_discover(self, name: str, existing: ModelEntry | None) -> None:
        """Raise unless a load over the API may (re)register ``name``: ``remote_load``
        enabled, not a declared model (unless allowed), not loaded now."""
        policy = self._settings.remote_load
        if not policy.enabled:
            raise InvalidInputError(
                f"model {name!r}: loading undeclared models or configs over the API is "
                "disabled (remote_load.enabled)"
            )
        declared = any(m.name == name for m in self._settings.models)
        if declared and not policy.allow_reconfigure_declared:
            raise InvalidInputError(
                f"model {name!r} is declared in the server's configuration; a load request "
                "cannot reconfigure it (remote_load.allow_reconfigure_declared)"
            )
        if existing is not None and any(r.state in RESIDENT for r in existing.versions.values()):
            raise ModelStateConflictError(
                f"model {name!r} is loaded; unload it before loading it with a new config"
            )

    def discover(self, name: str, config: Mapping[str, Any] | None = None) -> ModelEntry:
        """Register a model folder of the repository that the YAML does not list.

        ``config`` holds model fields as in the YAML (``name`` and ``path`` default to the
        folder name; ``runtime`` is guessed from the files). This is how a model is added
        without a restart: ``POST /v2/repository/models/{m}/load`` with an optional
        ``{"parameters": {"config": …}}``, as Triton's explicit mode does. A known model
        with a ``config`` has its configuration replaced, once it is not loaded.

        Both arrive over the API, so both pass the ``remote_load:`` gate (see
        :mod:`modelyard.manager.remote_load`): folders stay inside the repository and
        only allowed fields are set. A refused or failed discovery registers nothing.
        """
        check_model_name(name)
        policy = self._settings.remote_load
        existing = self.entries.get(name)
        if existing is not None and not config:
            return existing
        self._check_may_discover(name, existing)
        root = self._settings.repository_root
        own_folder = folder_in_repository(root, name, f"model {name!r}")
        raw = dict(config or {})
        check_fields(name, raw, policy)
        fields: dict[str, Any] = {"name": name, "path": name, **raw}
        if not isinstance(fields["path"], str):
            raise InvalidInputError(f"config for model {name!r}: 'path' must be a string")
        folder = folder_in_repository(root, fields["path"], f"model {name!r}: path")
        # The ModelConfig keeps the resolved folder, so a symlink swapped later cannot
        # lead the load out of the repository.
        fields["path"] = str(folder)
        if "runtime" not in fields:
            try:
                fields["runtime"] = guess_runtime(folder)
            except UnsupportedModelFormatError as exc:
                raise InvalidInputError(f"model {name!r}: {exc}") from None
        model_config = _validated(name, fields)
        check_config(model_config, folder, own_folder, policy)
        if not folder.is_dir():
            folders = {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")}
            raise ModelNotFoundError(
                f"model {name!r} is not in the repository"
                f"{did_you_mean(name, folders | set(self.entries))}"
            )
        versions = served_versions(folder, model_config.version_policy)
        if not versions:
            raise ModelNotFoundError(
                f"model {name!r} has no version folders (<model>/<version>/…) in "
                f"{shown_path(root, folder)}"
            )
        for v in versions:  # a version folder may be a symlink too
            folder_in_repository(root, str(folder.relative_to(root) / str(v)), f"model {name!r}")
        known = {d.name for d in self._settings.devices}
        for device in model_config.allowed_devices or ():
            if device not in known:
                raise InvalidInputError(
                    f"config for model {name!r} names device {device!r}, which this "
                    "server does not have"
                )
        try:
            entry = self.add_model(model_config)
            if not entry.versions:  # the folder changed under us
                raise ModelNotFoundError(f"model {name!r} has no version folders")
        except BaseException:
            self.restore(name, existing)  # register nothing (a bad default_version, ...)
            raise
        self.events.add("discovered", next(iter(entry.versions.values())).key, "added by load")
        return entry

    def restore(self, name: str, previous: ModelEntry | None) -> None:
        """Put back the registration a failed remote load replaced (or drop its own)."""
        if previous is None:
            self.entries.pop(name, None)
        else:
            self.entries[name] = previous

    def refresh_versions(self, entry: ModelEntry) -> None:
        """Create records for versions the policy serves that are not known yet.

        A ``path`` naming one file (``digits/model.onnx``) is served as version ``1``:
        its record's folder is the file's, and the runtime loads that file only.
        """
        if entry.path.is_file():
            if SINGLE_FILE_VERSION not in entry.versions:
                entry.versions[SINGLE_FILE_VERSION] = ModelRecord(
                    key=ModelKey(entry.config.name, SINGLE_FILE_VERSION),
                    config=entry.config,
                    path=entry.path.parent,
                    pinned=entry.pinned,
                    state_since=self._clock.monotonic(),
                    model_file=entry.path.name,
                )
            return
        for v in served_versions(entry.path, entry.config.version_policy):
            key = ModelKey(entry.config.name, str(v))
            if key.version not in entry.versions:
                entry.versions[key.version] = ModelRecord(
                    key=key,
                    config=entry.config,
                    path=entry.path / key.version,
                    pinned=entry.pinned,
                    state_since=self._clock.monotonic(),
                )

    def missing_reason(self, entry: ModelEntry) -> str:
        """Why ``entry`` has no version to serve (folder missing, empty, none the policy takes)."""
        return missing_versions_reason(entry.path, entry.config.version_policy)

    def field(self, entry: ModelEntry, name: str = "") -> str:
        """``<yaml file>: models[i].<name>`` of a configured model (or the model's name)."""
        for i, cfg in enumerate(self._settings.models):
            if cfg.name == entry.config.name:
                where = f"models[{i}]" + (f".{name}" if name else "")
                return f"{self._settings.config_file or '<settings>'}: {where}"
        return f"model {entry.config.name!r}"

    def records(self) -> Iterable[ModelRecord]:
        """Every known model version."""
        for entry in self.entries.values():
            yield from entry.versions.values()

    def entry(self, name: str) -> ModelEntry:
        """The model called ``name``; ModelNotFoundError if unknown."""
        try:
            return self.entries[name]
        except KeyError:
            raise ModelNotFoundError(
                f"model {name!r} is not in the repository{did_you_mean(name, self.entries)}"
            ) from None

    def resolve(self, name: str, version: str | None) -> ModelRecord:
        """The record serving ``name`` at ``version`` (a version, an alias, or the default)."""
        entry = self.entry(name)
        if not version:
            route = entry.aliases.get(DEFAULT_ALIAS)
            if route is None:
                if not entry.versions:
                    raise ModelNotFoundError(
                        f"model {name!r} has no version to serve: {self.missing_reason(entry)}"
                    )
                return entry.versions[newest_version(entry.versions)]
            version = route.pick(self._rng)
        else:
            route = entry.aliases.get(version)
            if route is not None:
                version = route.pick(self._rng)
        try:
            return entry.versions[version]
        except KeyError:
            known = ", ".join(sort_versions(entry.versions)) or "none"
            aliases = ", ".join(sorted(entry.aliases)) or "none"
            raise ModelNotFoundError(
                f"model {name!r} has no version {version!r} "
                f"(served versions: {known}; aliases: {aliases})"
            ) from None

    def base_file(self, name: str) -> Path:
        """The GGUF file of model ``name``'s default version, the base an adapter applies
        to (ModelNotFoundError or ModelLoadError when there is none)."""
        base = self.resolve(name, None)
        try:
            return find_model_file(base.path, (".gguf",), base.model_file)
        except OSError as exc:
            raise ModelLoadError(f"the base model {name!r} has no GGUF file: {exc}") from None

    def record_for(self, name: str, version: str) -> ModelRecord:
        """The record of a version on disk, created if the policy did not list it."""
        entry = self.entry(name)
        record = entry.versions.get(version)
        if record is None:
            path = entry.path / version
            if not is_version_label(version) or not path.is_dir():
                raise ModelNotFoundError(f"model {name!r} has no version folder {version!r}")
            record = ModelRecord(
                key=ModelKey(name, version),
                config=entry.config,
                path=path,
                pinned=entry.pinned,
                state_since=self._clock.monotonic(),
            )
            entry.versions[version] = record
        return record

    def set_pinned(self, name: str, pinned: bool) -> ModelEntry:
        """Pin (or unpin) every version of ``name``, now and any found later.

        A pin is per model: versions a refresh or a switch adds later inherit it, so a
        new version folder cannot make a pinned model evictable.
        """
        entry = self.entry(name)
        entry.runtime_pin = pinned
        for record in entry.versions.values():
            record.pinned = pinned
        return entry


def _validated(name: str, fields: dict[str, Any]) -> ModelConfig:
    """``fields`` as the ModelConfig of model ``name``; InvalidInputError naming each
    problem (and a config naming another model)."""
    try:
        model_config = ModelConfig.model_validate(fields)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidInputError(f"invalid config for model {name!r}: {problems}") from None
    if model_config.name != name:
        raise InvalidInputError(f"config names model {model_config.name!r}, not {name!r}")
    return model_config
