"""RemoteLoadConfig: what a load request over the API may ask for (``remote_load:``).

A load request (``POST /v2/repository/models/{m}/load``, or gRPC
``RepositoryModelLoad``) may carry a ``config`` of model fields. Anyone who can reach the
management port can send one, so by default it may only tune how a model in the
repository is served (batching, queues, timeouts, versions, memory hints); every field
that runs code, trusts files, shares the server's process or takes memory for good is
refused unless the operator allows it here, one flag per power.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class RemoteLoadConfig(BaseModel):
    """The ``remote_load:`` block of ``modelyard.yaml``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    """Allow loading repository folders the YAML does not declare, and configs with loads.
    False: a load request may only (re)load a declared model, with no ``config``."""
    allow_code: bool = False
    """Allow ``runtime: python`` and ``class``: the request then runs a Python class found
    in the model's folder, with the server's rights."""
    allow_trusted: bool = False
    """Allow ``trusted: true``: raw pickle files are unpickled (arbitrary code)."""
    allow_inline: bool = False
    """Allow ``isolation: inline``: the model runs inside the server process, so a crash
    or a leak of the model is one of the server."""
    allow_pinned: bool = False
    """Allow ``pinned: true``: the model is never evicted, so it holds its budget for good."""
    allow_runtime_options: bool = False
    """Allow ``options`` (runtime-specific settings) and ``warmup_inputs``."""
    allow_other_folder: bool = False
    """Allow a ``path`` other than the model's own folder (``<repository>/<name>``); it must
    still resolve, symlinks followed, inside the repository."""
    allow_reconfigure_declared: bool = False
    """Allow a ``config`` for a model the YAML declares (it replaces the operator's)."""
    min_priority: int = Field(default=3, ge=1, le=10)
    """The most important ``priority`` a remote config may ask for (1 is the most
    important); a smaller number is refused, so remote models cannot outrank or evict
    the operator's."""
