"""ServerSettings: the process-wide configuration, from the YAML file, env and flags.

Precedence, highest first: command-line flags, ``MODELYARD_*`` environment variables
(nested with ``__``, e.g. ``MODELYARD_HTTP_PORT``), then the YAML file.
"""

from __future__ import annotations

import contextvars
import difflib
import logging
import os
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError

from modelyard.config.devices import DeviceConfig, check_core_sets
from modelyard.config.limits import LimitsConfig
from modelyard.config.model_config import ModelConfig
from modelyard.config.ray import RayConfig
from modelyard.config.remote_load import RemoteLoadConfig
from modelyard.config.security import SecurityConfig
from modelyard.config.seed_fields import apply_seed_fields
from modelyard.config.units import MIB, from_old_names
from modelyard.repository.runtime_guess import UnsupportedModelFormatError, infer_runtime

ENV_PREFIX = "MODELYARD_"
"""Prefix of the environment variables that override server-level fields."""

OFF_WORDS = frozenset({"", "off", "none", "null", "false", "no", "disabled"})
"""What ``grpc_port`` may say (YAML, environment or flag) to turn gRPC off."""
__all__ = [
    "ConfigError",
    "DeviceConfig",
    "MetricsConfig",
    "PrefetchConfig",
    "ServerSettings",
    "load_settings",
]

log = logging.getLogger("modelyard.config")

_FILE_DATA: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("_FILE_DATA")


class ConfigError(Exception):
    """A configuration mistake: names the file, the field and the reason."""


class PrefetchConfig(BaseModel):
    """Predictive preloading from the sequence of requested models (a Markov chain)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    """Load the likely next model ahead of its request."""
    min_probability: float = Field(default=0.6, gt=0, le=1)
    """Only act on predictions at least this likely."""
    min_observations: PositiveInt = 10
    """... and seen at least this many times."""
    sole_observations: PositiveInt = 2
    """... or this many times, if it is the only successor its model has ever had and
    such sole successors have been right at least ``min_probability`` of the last 50
    times (a stream of pipelines; on independent requests they are not, and this never
    applies)."""
    displace: bool = True
    """When the prediction does not fit in free budget, let it evict idle, colder models
    whose expected reload cost (P(use within ``horizon_s``) times reload seconds) is lower
    than the prediction's; false: prefetch only into free budget."""
    horizon_s: float = Field(default=30.0, gt=0)
    """The window that "P(use within the horizon)" of a resident model is taken over."""
    prewarm: bool = True
    """Also load a model shortly before its pre-warm window opens: when its idle times
    (the gaps between its requests, the last 16) agree within a factor of 1.25, as a
    timer's do, it is loaded twice its load time plus a quarter of a second before the
    shortest of them has passed ("Serverless in the Wild"); the same displacement rule
    applies."""
    page_cache: bool = True
    """When a predicted model cannot be loaded, read its files into the page cache
    (``posix_fadvise(WILLNEED)``; no budget used) so its load skips the disk."""


class RequestLogConfig(BaseModel):
    """An opt-in log of requests and loads (JSON lines) for ``modelyard plan``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str | None = None
    """File to append to (relative to the working directory); null: no log."""
    max_mb: float = Field(default=64.0, gt=0)
    """The log stops growing at this size (a warning is logged once); never rotated."""


class MetricsConfig(BaseModel):
    """What ``/metrics`` exports besides the native ``modelyard_*`` families."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed_names: bool = False
    """Also export the design notes' names, labels and buckets
    (``model_inference_latency{model_type,version}`` in ms,
    ``gpu_mem_usage{device_id,model_id}``, ``model_switch_latency``); see docs/seeds.md."""


class ServerSettings(BaseSettings):
    """Process-wide settings of one modelyard server."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", frozen=True, extra="forbid"
    )

    host: str = "127.0.0.1"
    """Address the HTTP and gRPC servers bind."""
    http_port: int = Field(default=8080, ge=0, le=65535)
    """REST port (0 picks a free one)."""
    grpc_port: int | None = Field(default=8081, ge=0, le=65535)
    """gRPC port (0 picks a free one; null disables gRPC, as do ``off`` and an empty
    value, so that ``MODELYARD_GRPC_PORT=off`` turns it off from the environment)."""
    model_repository: str = "."
    """Root that relative model paths are resolved against."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Log verbosity."""
    log_format: Literal["text", "json"] = "text"
    """``json`` writes one JSON object per line."""
    max_request_mb: float = Field(default=64.0, gt=0)
    """Largest request body accepted, in MiB; beyond it, HTTP 413. Older name
    ``max_request_bytes`` (bytes)."""
    model_control_mode: Literal["none", "explicit", "poll"] = "explicit"
    """``explicit``: load/unload over the API; ``poll``: follow the repository folder;
    ``none``: the declared models only, and the API's load/unload are refused (HTTP 501,
    gRPC UNIMPLEMENTED)."""
    remote_load: RemoteLoadConfig = Field(default_factory=RemoteLoadConfig)
    """What a load request over the API may ask for (fields, paths, priorities)."""
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    """Bounds on bodies, tensor elements, responses, connections and slow clients."""
    drain_timeout_s: float = Field(default=30.0, gt=0)
    """How long a stop (SIGTERM or SIGINT) may take: requests in flight finish and models
    unload within it; past it, or at a second signal, the process exits anyway (its
    workers die with it)."""
    poll_interval_s: float = Field(default=5.0, gt=0)
    """How often ``poll`` mode rescans the repository."""
    require_manifest: bool = False
    """Refuse versions without a SHA256 manifest."""
    manifest_public_keys: list[str] = Field(default_factory=list)
    """Ed25519 public keys (PEM file, PEM text or base64 raw) that manifests must be signed by."""
    rollback_grace_s: float = Field(default=300.0, ge=0)
    """How long a version replaced by a switch stays loaded for instant rollback."""
    poll_settle_s: float = Field(default=2.0, ge=0)
    """Poll mode: a version folder without a manifest is taken once unchanged this long."""
    memory_sample_interval_s: float = Field(default=5.0, gt=0)
    """How often each worker's live memory (RSS/USS/PSS) is read for stats and metrics."""
    eviction_policy: Literal["lru", "lfu", "cost", "gdsf-decay", "arrival-cost"] = "arrival-cost"
    """Who leaves when room is needed: ``lru``, ``lfu``, ``cost`` (Greedy-Dual-Size-
    Frequency), ``gdsf-decay`` (GDSF over recent demand) or ``arrival-cost`` (request
    episodes times reload seconds per MiB, by each model's gap histogram; the default,
    fewest cold-start seconds live and in the simulator); see docs/caching.md."""
    eviction_period_s: float = Field(default=86_400.0, ge=0)
    """The daily cycle ``arrival-cost`` looks for in each model's demand (and the hot-model
    rule with it), acted on once it has repeated; 0: none. See docs/caching.md."""
    demand_half_life_s: float = Field(default=60.0, gt=0)
    """How fast recent demand is forgotten (``gdsf-decay`` and the hot-model rule)."""
    protect_hot: bool = True
    """Never evict a model in the top decile of recent demand while a colder model is
    evictable or a load in progress will become so."""
    load_slots: int = Field(default=0, ge=0)
    """Loads that run at once (a load is CPU work); the others wait for a slot, holding
    their place in the budget. 0: no limit, every admitted load starts at once.
    ``modelyard plan`` replays a request log with the limit it was recorded under."""
    request_log: RequestLogConfig = Field(default_factory=RequestLogConfig)
    """Opt-in request log (JSON lines) that ``modelyard plan`` replays."""
    prefetch: PrefetchConfig = Field(default_factory=PrefetchConfig)
    """Predictive preloading."""
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    """Extra metric names on ``/metrics`` (the design notes' own, opt-in)."""
    security: SecurityConfig = Field(default_factory=SecurityConfig)
    """Tokens per plane and TLS; see docs/security.md."""
    devices: list[DeviceConfig] = Field(default_factory=lambda: [DeviceConfig(name="cpu")])
    """Devices and their byte budgets: ``cpu``, CPU core sets (``cpu:0-1``) and
    ``cuda:N``; see docs/models.md, "Devices and replicas"."""
    ray: RayConfig | None = None
    """Run model workers as Ray actors on a Ray cluster (``serve --ray``); the nodes'
    devices replace ``devices:``. See docs/ray.md."""
    models: list[ModelConfig] = Field(default_factory=list)
    """The models this server knows."""
    spare_workers: int | None = Field(default=None, ge=0)
    """Idle worker processes kept started ahead, so that a load claims one instead of
    starting a process; null: one per entry of ``devices``; 0: none."""
    exit_on_error: bool = True
    """A model with ``preload: true`` that cannot load stops the start; false: the server
    starts anyway and lists it as FAILED with its reason (Triton's ``--exit-on-error``)."""
    config_dir: str = "."
    """Folder of the YAML file (set by the loader; relative paths start here)."""
    config_file: str = ""
    """The YAML file itself (set by the loader; named in start-up errors)."""

    @field_validator("grpc_port", mode="before")
    @classmethod
    def _grpc_off(cls, value: Any) -> Any:
        # An environment variable cannot hold YAML's null: accept the words for "off".
        if isinstance(value, str) and value.strip().lower() in OFF_WORDS:
            return None
        return value

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        data = apply_seed_fields(data)
        return from_old_names(
            _without_ingress_processes(data), {"max_request_bytes": ("max_request_mb", MIB)}
        )

    @model_validator(mode="after")
    def _check(self) -> ServerSettings:
        names = [m.name for m in self.models]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"model names must be unique; repeated: {', '.join(dupes)}")
        devices = [d.name for d in self.devices]
        if len(set(devices)) != len(devices):
            raise ValueError("devices: a device is listed twice")
        check_core_sets([d.parsed for d in self.devices])
        for m in self.models:
            for name in m.allowed_devices or ():
                if name not in devices:
                    raise ValueError(f"model {m.name!r} names unknown device {name!r}")
            if m.base is not None:
                check_base(m, self.models)
            unknown = [name for name in m.fallback if name not in names]
            if unknown:
                raise ValueError(
                    f"model {m.name!r}: fallback names unknown model(s) {', '.join(unknown)}"
                )
        for i, m in enumerate(self.models):
            if "runtime" not in m.model_fields_set:
                # A list is mutable inside the frozen settings; this runs once, at build.
                self.models[i] = self._with_inferred_runtime(m)
        return self

    def _with_inferred_runtime(self, model: ModelConfig) -> ModelConfig:
        """``model`` with the runtime its files call for (``runtime:`` left out)."""
        try:
            guess = infer_runtime(self.model_path(model))
        except UnsupportedModelFormatError as exc:
            raise ValueError(f"model {model.name!r}: {exc}") from None
        log.info("model %r: runtime %s inferred from %s", model.name, guess.runtime, guess.reason)
        fields = model.model_dump(exclude_unset=True, by_alias=True)
        return ModelConfig.model_validate({**fields, "runtime": guess.runtime})

    @property
    def spare_worker_count(self) -> int:
        """``spare_workers``, its default resolved: one spare per device."""
        return len(self.devices) if self.spare_workers is None else self.spare_workers

    @property
    def max_request_bytes(self) -> int:
        """``max_request_mb`` in bytes."""
        return max(1, int(self.max_request_mb * MIB))

    @property
    def repository_root(self) -> Path:
        """The model repository as an absolute path."""
        root = Path(self.model_repository)
        if not root.is_absolute():
            root = Path(self.config_dir) / root
        return root.resolve()

    def model_path(self, model: ModelConfig) -> Path:
        """The folder of ``model`` as an absolute path."""
        p = Path(model.path)
        return (p if p.is_absolute() else self.repository_root / p).resolve()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _FileSource(settings_cls))


class _FileSource(PydanticBaseSettingsSource):
    """Values read from the YAML file, lowest precedence."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        data = _FILE_DATA.get({})
        return data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_FILE_DATA.get({}))


def _without_ingress_processes(data: Any) -> Any:
    """The settings without ``ingress_processes``, a removed setting: 1 (what it always
    meant by default) is accepted and dropped; any other value is refused, saying why."""
    if not isinstance(data, dict) or "ingress_processes" not in data:
        return data
    value = data["ingress_processes"]
    if value not in (1, "1"):
        raise ValueError(
            f"ingress_processes: {value!r}: the setting was removed (HTTP is served by the "
            "server process itself); to scale past one process, use Ray mode (docs/ray.md)"
        )
    return {k: v for k, v in data.items() if k != "ingress_processes"}


def env_variable(loc: tuple[int | str, ...], environ: Mapping[str, str]) -> str | None:
    """The ``MODELYARD_*`` variable that set the field at ``loc``, if one did.

    The most specific wins: ``MODELYARD_LIMITS__MAX_CONNECTIONS`` for
    ``limits.max_connections``, else ``MODELYARD_LIMITS`` (a JSON object). Names are
    compared without case, as pydantic-settings reads them.
    """
    names = {key.upper(): key for key in environ}
    parts: list[str] = []
    for part in loc:
        if not isinstance(part, str):
            break  # a list index: the whole list came from one variable
        parts.append(part.upper())
    for depth in range(len(parts), 0, -1):
        found = names.get(ENV_PREFIX + "__".join(parts[:depth]))
        if found is not None:
            return found
    return None


def _format_validation_error(
    source: str, exc: ValidationError, flags: Mapping[str, Any], environ: Mapping[str, str]
) -> str:
    # Each mistake is reported where the user must fix it: the flag, the environment
    # variable, or the YAML file (values from the flags win over the environment, which
    # wins over the file, so that is also the order to look in).
    groups: dict[str, list[str]] = {}
    for err in exc.errors():
        loc = tuple(err["loc"])
        field = ".".join(str(p) for p in loc) or "(root)"
        variable = env_variable(loc, environ) if loc else None
        if loc and loc[0] in flags:
            origin = f"--{str(loc[0]).replace('_', '-')}"
        elif variable is not None:
            origin = f"environment variable {variable}={environ[variable]!r}"
        else:
            origin = source
        message = err["msg"]
        if err["type"] == "extra_forbidden" and loc:
            message += _did_you_mean(str(loc[-1]))
        groups.setdefault(origin, []).append(f"  {field}: {message}")
    lines: list[str] = []
    for origin, problems in groups.items():
        lines.append(f"{origin}: invalid configuration")
        lines.extend(problems)
    return "\n".join(lines)


def _did_you_mean(name: str) -> str:
    """``"; did you mean 'x'?"`` for the configuration field nearest to ``name``, if any."""
    close = difflib.get_close_matches(name, sorted(_field_names(ServerSettings)), n=1, cutoff=0.7)
    return f"; did you mean {close[0]!r}?" if close else ""


def _field_names(model: type[BaseModel], seen: set[type] | None = None) -> set[str]:
    """Every field name (and alias) of ``model`` and of the models nested in its fields."""
    seen = set() if seen is None else seen
    if model in seen:
        return set()
    seen.add(model)
    names: set[str] = set()
    for name, info in model.model_fields.items():
        names.add(name)
        if isinstance(info.alias, str):
            names.add(info.alias)
        for nested in _models_in(info.annotation):
            names |= _field_names(nested, seen)
    return names


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation names, through lists, unions and the like."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _settings_error(exc: SettingsError, environ: Mapping[str, str]) -> str:
    # pydantic-settings says 'error parsing value for field "devices" from source
    # "EnvSettingsSource"' when a list or mapping field's variable is not JSON.
    message = str(exc)
    field = message.split('"')[1] if message.count('"') >= 2 else ""
    variable = env_variable((field,), environ) if field else None
    if variable is None:
        return f"environment: {message}"
    return (
        f"environment variable {variable}={environ[variable]!r}: not valid JSON "
        f"(the field {field!r} takes a JSON list or object)"
    )


LOADER_FIELDS = frozenset({"config_dir", "config_file"})
"""Settings the loader sets from the file's own path: a YAML file naming them is refused
(``config_dir: /etc`` would move every relative path, ``repository_root`` first)."""


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> ServerSettings:
    """Build settings from ``config_file`` (YAML), the environment and ``overrides``.

    ``overrides`` with value ``None`` are ignored, so CLI flags left unset fall through.
    Raises :class:`ConfigError` naming where each mistake is (the flag, the
    ``MODELYARD_*`` variable, or the file), the field and the reason.
    """
    data: dict[str, Any] = {}
    source = "<defaults>"
    if config_file is not None:
        path = Path(config_file)
        source = str(path)
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: top level must be a mapping, got {type(loaded).__name__}")
        internal = sorted(LOADER_FIELDS & loaded.keys())
        if internal:
            raise ConfigError(
                f"{path}: {', '.join(repr(f) for f in internal)} cannot be set in the file "
                "(the server sets it from where the file is)"
            )
        data = loaded
        data["config_dir"] = str(path.resolve().parent)
        data["config_file"] = str(path)
    flags = {k: v for k, v in overrides.items() if v is not None}
    token = _FILE_DATA.set(data)
    try:
        return ServerSettings(**flags)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(source, exc, flags, os.environ)) from exc
    except SettingsError as exc:
        raise ConfigError(_settings_error(exc, os.environ)) from exc
    finally:
        _FILE_DATA.reset(token)


def check_base(model: ModelConfig, models: list[ModelConfig]) -> None:
    """ValueError unless ``model.base`` names a ``llama_cpp`` model that is no adapter."""
    base = next((m for m in models if m.name == model.base), None)
    if base is None:
        raise ValueError(f"model {model.name!r}: base names unknown model {model.base!r}")
    if base.runtime != "llama_cpp" or base.base is not None:
        raise ValueError(
            f"model {model.name!r}: base {model.base!r} must be a llama_cpp model "
            "that is not itself an adapter"
        )
