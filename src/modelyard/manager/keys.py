"""ModelKey and ReplicaKey: the names of a model version and of one of its replicas."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, order=True)
class ModelKey:
    """A model version: ``(name, version)``; ``"name:version"`` only at the edges."""

    name: str
    version: str
    _hash: int = field(init=False, repr=False, compare=False)
    """Computed once: every request hashes its key several times (LRU, demand, policy)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.name, self.version)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[ModelKey], tuple[str, str]]:
        # Rebuilt from its fields: a string's hash differs from one process to the next.
        return (ModelKey, (self.name, self.version))

    def __str__(self) -> str:
        return f"{self.name}:{self.version}"


@dataclass(frozen=True, slots=True, order=True)
class ReplicaKey:
    """A replica of a model version: its own worker and its own reservation.

    The first replica of a version is numbered 0 (``record.first``; its reservation is
    held under the :class:`ModelKey`); extra ones, started by scale-out or
    ``replicas.min``, are numbered from 1.
    """

    name: str
    version: str
    index: int

    @property
    def model(self) -> ModelKey:
        """The version this replica serves."""
        return ModelKey(self.name, self.version)

    def __str__(self) -> str:
        return f"{self.name}:{self.version}#{self.index}"


Holder = ModelKey | ReplicaKey
"""Who holds a reservation on a device: a version's first replica, or an extra replica."""
