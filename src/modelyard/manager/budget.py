"""Memory accounting per device: reserve, resize, release. Pure and synchronous.

There is no ``await`` in here, so on one event loop the check-then-reserve of
:meth:`MemoryBudget.try_reserve` is atomic without a lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from modelyard.manager.records import ModelKey


@dataclass
class DeviceBudget:
    """One device's budget and the reservations held against it."""

    name: str
    budget_bytes: int
    reservations: dict[ModelKey, int] = field(default_factory=dict)

    @property
    def reserved_bytes(self) -> int:
        """Bytes currently reserved by resident models."""
        return sum(self.reservations.values())

    @property
    def free_bytes(self) -> int:
        """Budget left (never negative)."""
        return max(0, self.budget_bytes - self.reserved_bytes)


class MemoryBudget:
    """The byte budgets of every device."""

    def __init__(self, budgets: dict[str, int]) -> None:
        self.devices = {name: DeviceBudget(name, nbytes) for name, nbytes in budgets.items()}

    def device(self, name: str) -> DeviceBudget:
        """The budget of ``name``; KeyError for unknown devices."""
        return self.devices[name]

    def try_reserve(self, device: str, key: ModelKey, nbytes: int) -> bool:
        """Reserve ``nbytes`` for ``key`` if it fits; False (nothing changed) if not."""
        dev = self.devices[device]
        current = dev.reservations.get(key, 0)
        if dev.reserved_bytes - current + nbytes > dev.budget_bytes:
            return False
        dev.reservations[key] = nbytes
        return True

    def resize(self, device: str, key: ModelKey, nbytes: int) -> bool:
        """Replace ``key``'s reservation by ``nbytes`` (the measured footprint).

        Shrinking always succeeds. Growing succeeds only within the budget; when it
        does not fit the reservation is left as it was and False is returned, so the
        caller can make room (or refuse the model) without the invariant breaking.
        """
        return self.try_reserve(device, key, nbytes)

    def release(self, device: str, key: ModelKey) -> int:
        """Drop ``key``'s reservation; returns the bytes given back."""
        return self.devices[device].reservations.pop(key, 0)

    def reserved(self, device: str, key: ModelKey) -> int:
        """Bytes reserved by ``key`` on ``device`` (0 if none)."""
        return self.devices[device].reservations.get(key, 0)
