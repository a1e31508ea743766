"""Memory accounting per device: reserve, resize, release. Pure and synchronous.

There is no ``await`` in here, so on one event loop the check-then-reserve of
:meth:`MemoryBudget.try_reserve` is atomic without a lock.

Reservations are held per replica: a version's first replica under its ``ModelKey``,
each extra replica under its ``ReplicaKey`` (see ``records.py``). A reservation has two
parts. The **private** part is memory only that replica holds (its worker's USS, less
any mapped weight file). **Shared files** are weight files that models memory-map
(``share_weights``): the kernel holds one copy of a file's pages in the page cache
however many workers map it, so the ledger charges each file once per device, while any
replica there maps it, and gives the bytes back when its last user releases. A file is
identified by ``(dev, inode, size, mtime)`` (see ``workers/footprint.py``: hard links
are one file, a file replaced in place is a new one).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from modelyard.manager.records import Holder
from modelyard.workers.footprint import MappedFile as SharedFile

__all__ = ["DeviceBudget", "MemoryBudget", "SharedCharge", "SharedFile"]


@dataclass
class SharedCharge:
    """A shared file charged to a device, and the models that map it."""

    file: SharedFile
    users: set[Holder] = field(default_factory=set)


@dataclass
class DeviceBudget:
    """One device's budget and the reservations held against it."""

    name: str
    budget_bytes: int
    reservations: dict[Holder, int] = field(default_factory=dict)
    """Private bytes of each resident model."""
    shared: dict[SharedFile, SharedCharge] = field(default_factory=dict)
    """Mapped weight files, each charged once for all the models that map it."""

    @property
    def reserved_bytes(self) -> int:
        """Bytes currently reserved: every private part plus every shared file once."""
        return sum(self.reservations.values()) + self.shared_bytes

    @property
    def shared_bytes(self) -> int:
        """Bytes charged for shared weight files."""
        return sum(c.file.size for c in self.shared.values())

    @property
    def free_bytes(self) -> int:
        """Budget left (never negative)."""
        return max(0, self.budget_bytes - self.reserved_bytes)

    def uncharged_bytes(self, files: Iterable[SharedFile]) -> int:
        """Bytes of ``files`` that no model has charged yet (each distinct file once)."""
        return sum(f.size for f in set(files) if f not in self.shared)


class MemoryBudget:
    """The byte budgets of every device."""

    def __init__(self, budgets: dict[str, int]) -> None:
        self.devices = {name: DeviceBudget(name, nbytes) for name, nbytes in budgets.items()}

    def set_budget(self, device: str, nbytes: int) -> None:
        """Add ``device`` with ``nbytes``, or change its budget (a node joined or came
        back); reservations already held stay."""
        dev = self.devices.get(device)
        if dev is None:
            self.devices[device] = DeviceBudget(device, nbytes)
        else:
            dev.budget_bytes = nbytes

    def device(self, name: str) -> DeviceBudget:
        """The budget of ``name``; KeyError for unknown devices."""
        return self.devices[name]

    def try_reserve(
        self, device: str, key: Holder, nbytes: int, files: Iterable[SharedFile] = ()
    ) -> bool:
        """Set ``key``'s private reservation to ``nbytes`` and charge the ``files`` it maps.

        Files already charged (by any model) cost nothing more. If the total does not
        fit, nothing changes and False is returned. Files ``key`` already holds stay held
        until :meth:`release`.
        """
        dev = self.devices[device]
        files = set(files)
        current = dev.reservations.get(key, 0)
        if dev.reserved_bytes - current + nbytes + dev.uncharged_bytes(files) > dev.budget_bytes:
            return False
        dev.reservations[key] = nbytes
        for f in files:
            dev.shared.setdefault(f, SharedCharge(f)).users.add(key)
        return True

    def resize(self, device: str, key: Holder, nbytes: int) -> bool:
        """Replace ``key``'s private reservation by ``nbytes`` (the measured footprint).

        Shrinking always succeeds. Growing succeeds only within the budget; when it
        does not fit the reservation is left as it was and False is returned, so the
        caller can make room (or refuse the model) without the invariant breaking.
        Shared files are untouched.
        """
        return self.try_reserve(device, key, nbytes)

    def release(self, device: str, key: Holder) -> int:
        """Drop ``key``'s reservation; returns the bytes given back.

        That is its private part plus the shared files it was the last user of.
        """
        dev = self.devices[device]
        freed = dev.reservations.pop(key, 0)
        for f, charge in list(dev.shared.items()):
            charge.users.discard(key)
            if not charge.users:
                del dev.shared[f]
                freed += f.size
        return freed

    def give_back(self, device: str, key: Holder, freed: int, *, unmapped: bool) -> int:
        """Lower ``key``'s private reservation by ``freed`` bytes (never below zero) and,
        with ``unmapped``, drop its charges on shared files: a stopping worker has closed
        its runtime and measured that much memory given back, but has not exited yet
        (the rest stays reserved until :meth:`release`). Returns the bytes given back.
        """
        dev = self.devices[device]
        before = dev.reserved_bytes
        if key in dev.reservations:
            dev.reservations[key] = max(0, dev.reservations[key] - freed)
        if unmapped:
            for f, charge in list(dev.shared.items()):
                charge.users.discard(key)
                if not charge.users:
                    del dev.shared[f]
        return before - dev.reserved_bytes

    def reserved(self, device: str, key: Holder) -> int:
        """Bytes releasing ``key`` would give back now (0 if none).

        Its private part plus the shared files only it maps; a file other models map
        too stays charged when ``key`` leaves.
        """
        dev = self.devices[device]
        own = sum(f.size for f, c in dev.shared.items() if c.users == {key})
        return dev.reservations.get(key, 0) + own

    def freed_by(self, device: str, keys: Iterable[Holder], keep: Iterable[SharedFile] = ()) -> int:
        """Bytes given back if every model in ``keys`` left.

        Their private parts, plus the shared files no other model maps; files in
        ``keep`` (which the caller is about to map) do not count, as they stay needed.
        """
        dev = self.devices[device]
        leaving = set(keys)
        kept = set(keep)
        freed = sum(dev.reservations.get(k, 0) for k in leaving)
        for f, charge in dev.shared.items():
            if f not in kept and charge.users <= leaving:
                freed += f.size
        return freed

    def files_of(self, device: str, key: Holder) -> list[SharedFile]:
        """The shared files ``key`` holds a charge on."""
        return [f for f, c in self.devices[device].shared.items() if key in c.users]
