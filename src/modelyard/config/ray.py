"""``ray:``: run model workers as Ray actors on a Ray cluster (``modelyard serve --ray``).

The front ends and the manager stay in the server process; each model replica becomes
one Ray actor, placed on a node of the cluster. Every node's devices are budgeted
devices of the manager, named ``NODE/cpu`` and ``NODE/cuda:N``; see docs/ray.md.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

NODE_RESOURCE_PREFIX = "modelyard.node."
"""A node resource ``modelyard.node.NAME`` names the node ``NAME`` (else its id's start)."""
MEMORY_RESOURCE = "modelyard.memory_mb"
"""A node resource giving the node's CPU byte budget in MiB."""
GPU_MEMORY_RESOURCE = "modelyard.gpu_memory_mb"
"""A node resource giving each GPU's byte budget in MiB."""


class RayConfig(BaseModel):
    """How the server joins a Ray cluster and places its actors."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    address: str = "auto"
    """``auto`` (the cluster this host belongs to) or ``HOST:PORT`` of its head."""
    namespace: str = "modelyard"
    """Ray namespace of the actors; ingresses sharing workers use the same one."""
    actor_num_cpus: float = Field(default=1.0, ge=0)
    """CPUs Ray reserves for each model actor (a node holds at most its CPUs / this)."""
    actor_num_gpus: float = Field(default=1.0, gt=0, le=1)
    """GPUs Ray reserves for each actor placed on a ``NODE/cuda:N`` device."""
    node_memory_budget_mb: float | None = Field(default=None, gt=0)
    """CPU budget of a node without a ``modelyard.memory_mb`` resource; default: half
    of the memory Ray reports for the node."""
    gpu_memory_budget_mb: float | None = Field(default=None, gt=0)
    """Budget of each GPU of a node without a ``modelyard.gpu_memory_mb`` resource; a
    GPU with neither is listed as unusable (Ray does not report GPU memory)."""
    budget_share: float = Field(default=1.0, gt=0, le=1)
    """The share of each node's budget this ingress may spend: ``1/N`` when N ingresses
    share one cluster (docs/ray.md, "Several ingresses")."""
    inline_max_bytes: int = Field(default=64 * 1024, ge=0)
    """Inputs up to this size travel inside the call; larger ones are put in Ray's
    object store first (BENCHMARKS.md, section 19)."""
    poll_interval_s: float = Field(default=0.5, gt=0)
    """How often the node list is read (joins, deaths)."""
    spare_actors: int = Field(default=1, ge=0, le=16)
    """Idle model actors kept started and warmed on each node, so that a load claims one
    instead of waiting for Ray to start a worker process (seconds); 0: none. Spares ask
    Ray for no CPU. Not used for generative models or with ``shared_workers``."""
    model_store: str | None = Field(default=None, min_length=1, max_length=4096)
    """URI of a copy of the model repository every node can read: ``file:///srv/models``
    (a folder every node mounts), or any URI an fsspec backend reads (``s3://…`` with
    ``s3fs``). Each actor fetches its version from there into its node's cache, once
    per node, verified against the version's manifest (required); None: every node
    reads the server's own repository path."""
    node_cache_dir: str = Field(default="", max_length=4096)
    """Each node's cache of the model store; ``{node}`` is replaced by the node's name;
    empty: ``modelyard-store/NODE`` in the node's temporary folder."""
    shared_workers: bool = False
    """Actors are named and shared by every ingress of the namespace, each holding a
    lease; the last lease released stops the actor."""
