"""ServerSettings: the process-wide configuration, from the YAML file, env and flags.

Precedence, highest first: command-line flags, ``MODELYARD_*`` environment variables
(nested with ``__``, e.g. ``MODELYARD_HTTP_PORT``), then the YAML file.
"""

from __future__ import annotations

import contextvars
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from modelyard.config.limits import LimitsConfig
from modelyard.config.model_config import ModelConfig
from modelyard.config.remote_load import RemoteLoadConfig
from modelyard.config.security import SecurityConfig
from modelyard.config.units import MIB, from_old_names

_FILE_DATA: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("_FILE_DATA")


class ConfigError(Exception):
    """A configuration mistake: names the file, the field and the reason."""


class DeviceConfig(BaseModel):
    """A device and the bytes loaded models may hold on it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^(cpu|cuda:\d+)$")
    """``cpu`` or ``cuda:N``."""
    memory_budget_mb: float | None = Field(default=None, gt=0)
    """Budget in MiB; default: half of the host's RAM (``psutil``'s total), for every
    device alike, ``cuda:N`` included: name a GPU's budget explicitly."""


class PrefetchConfig(BaseModel):
    """Predictive preloading from the sequence of requested models (a Markov chain)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    """Load the likely next model ahead of its request."""
    min_probability: float = Field(default=0.6, gt=0, le=1)
    """Only act on predictions at least this likely."""
    min_observations: PositiveInt = 10
    """... and seen at least this many times."""
    displace: bool = True
    """When the prediction does not fit in free budget, let it evict idle, colder models
    whose expected reload cost (P(use within ``horizon_s``) times reload seconds) is lower
    than the prediction's; false: prefetch only into free budget."""
    horizon_s: float = Field(default=30.0, gt=0)
    """The window that "P(use within the horizon)" of a resident model is taken over."""
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


class ServerSettings(BaseSettings):
    """Process-wide settings of one modelyard server."""

    model_config = SettingsConfigDict(
        env_prefix="MODELYARD_", env_nested_delimiter="__", frozen=True, extra="forbid"
    )

    host: str = "127.0.0.1"
    """Address the HTTP and gRPC servers bind."""
    http_port: int = Field(default=8080, ge=0, le=65535)
    """REST port (0 picks a free one)."""
    grpc_port: int | None = Field(default=8081, ge=0, le=65535)
    """gRPC port (0 picks a free one; null disables gRPC)."""
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
    eviction_policy: Literal["lru", "lfu", "cost", "gdsf-decay"] = "gdsf-decay"
    """Who leaves when room is needed: ``lru``, ``lfu``, ``cost`` (Greedy-Dual-Size-
    Frequency) or ``gdsf-decay`` (GDSF over recent demand); see docs/caching.md."""
    demand_half_life_s: float = Field(default=60.0, gt=0)
    """How fast recent demand is forgotten (``gdsf-decay`` and the hot-model rule)."""
    protect_hot: bool = True
    """Never evict a model in the top decile of recent demand while a colder model is
    evictable or a load in progress will become so."""
    request_log: RequestLogConfig = Field(default_factory=RequestLogConfig)
    """Opt-in request log (JSON lines) that ``modelyard plan`` replays."""
    prefetch: PrefetchConfig = Field(default_factory=PrefetchConfig)
    """Predictive preloading."""
    security: SecurityConfig = Field(default_factory=SecurityConfig)
    """Tokens per plane and TLS; see docs/security.md."""
    devices: list[DeviceConfig] = Field(default_factory=lambda: [DeviceConfig(name="cpu")])
    """Devices and their byte budgets."""
    models: list[ModelConfig] = Field(default_factory=list)
    """The models this server knows."""
    exit_on_error: bool = True
    """A model with ``preload: true`` that cannot load stops the start; false: the server
    starts anyway and lists it as FAILED with its reason (Triton's ``--exit-on-error``)."""
    config_dir: str = "."
    """Folder of the YAML file (set by the loader; relative paths start here)."""
    config_file: str = ""
    """The YAML file itself (set by the loader; named in start-up errors)."""

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        return from_old_names(data, {"max_request_bytes": ("max_request_mb", MIB)})

    @model_validator(mode="after")
    def _check(self) -> ServerSettings:
        names = [m.name for m in self.models]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"model names must be unique; repeated: {', '.join(dupes)}")
        devices = {d.name for d in self.devices}
        for m in self.models:
            if m.device not in devices:
                raise ValueError(f"model {m.name!r} names unknown device {m.device!r}")
        return self

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


def _format_validation_error(source: str, exc: ValidationError) -> str:
    lines = [f"{source}: invalid configuration"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        lines.append(f"  {loc}: {err['msg']}")
    return "\n".join(lines)


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> ServerSettings:
    """Build settings from ``config_file`` (YAML), the environment and ``overrides``.

    ``overrides`` with value ``None`` are ignored, so CLI flags left unset fall through.
    Raises :class:`ConfigError` with the file, field and reason of every mistake.
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
        data = loaded
        data.setdefault("config_dir", str(path.resolve().parent))
        data.setdefault("config_file", str(path))
    token = _FILE_DATA.set(data)
    try:
        return ServerSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(source, exc)) from exc
    finally:
        _FILE_DATA.reset(token)
