"""What a worker process holds in memory, read from ``/proc`` by the server.

The footprint of a process-isolated model is the worker's **USS** (unique set size:
pages only this process maps). A worker forked from the warm parent shares the
parent's interpreter, numpy and ONNX Runtime pages copy-on-write; those are paid once
for all workers, so they are not the model's cost. USS is also exactly what returns
to the system when the worker exits, which is what the memory budget needs to know.
PSS (shared pages divided among their sharers) is reported beside it: with shared
weights, PSS shows each replica's fair share of the common page cache.

With ``share_weights`` an ONNX worker memory-maps its external-data files. Their pages
are the page cache's, held once however many workers map them, so they are not the
replica's cost: :func:`mapped_private_bytes` measures what of a worker's USS lies in
those files (all of it while it is their only mapper), the footprint leaves it out, and
the budget charges each file once (``manager/budget.py``). Which files: the regular
files of the version folder (symlinks followed) other than the ``.onnx`` graph and the
manifest, see :func:`weight_files`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import psutil

_MANIFEST_NAME = "modelyard-manifest.json"  # repository/manifest.py (workers stay below it)
_GRAPH_SUFFIXES = (".onnx",)

_FIELDS = {
    "Rss:": "rss",
    "Pss:": "pss",
    "Private_Clean:": "private",
    "Private_Dirty:": "private",
    "Private_Hugetlb:": "private",
    "Swap:": "swap",
}


@dataclass(frozen=True, slots=True)
class MemorySample:
    """One reading of a process's memory, in bytes."""

    rss_bytes: int
    uss_bytes: int
    pss_bytes: int
    swap_bytes: int = 0

    def as_details(self) -> dict[str, object]:
        """For ``InstanceInfo.details`` and health output."""
        return {
            "rss_bytes": self.rss_bytes,
            "uss_bytes": self.uss_bytes,
            "pss_bytes": self.pss_bytes,
            "swap_bytes": self.swap_bytes,
        }


def parse_smaps_rollup(text: str) -> MemorySample:
    """A sample from the text of ``/proc/<pid>/smaps_rollup`` (sizes in kB)."""
    totals = {"rss": 0, "pss": 0, "private": 0, "swap": 0}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in _FIELDS:
            totals[_FIELDS[parts[0]]] += int(parts[1]) * 1024
    return MemorySample(totals["rss"], totals["private"], totals["pss"], totals["swap"])


def sample_memory(pid: int, proc_root: Path = Path("/proc")) -> MemorySample:
    """RSS, USS and PSS of ``pid``; psutil.NoSuchProcess once it has gone.

    Reads ``smaps_rollup`` (one file, cheap); falls back to psutil where it is missing.
    Blocking but short: call it from a thread on the server's event loop.
    """
    try:
        return parse_smaps_rollup((proc_root / str(pid) / "smaps_rollup").read_text())
    except FileNotFoundError:
        if not (proc_root / str(pid)).exists():
            raise psutil.NoSuchProcess(pid) from None
    except ProcessLookupError:
        raise psutil.NoSuchProcess(pid) from None
    info = psutil.Process(pid).memory_full_info()
    return MemorySample(info.rss, info.uss, getattr(info, "pss", info.uss), info.swap)


@dataclass(frozen=True, slots=True)
class MappedFile:
    """A weight file a worker memory-maps, identified as the page cache sees it.

    By ``(dev, inode, size, mtime)``: the page cache holds one copy per inode, so hard
    links (how two versions share a file; ONNX Runtime refuses external data that a
    symlink leads out of the model's folder) are one file, and a file replaced under the
    same name is another (the old pages stay mapped by whoever still holds them). The
    real path is kept for messages and to find the file's mappings.
    """

    path: str = field(compare=False)
    dev: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path | str) -> MappedFile:
        """The identity of the file at ``path`` now (OSError if it cannot be read)."""
        real = os.path.realpath(path)
        st = os.stat(real)
        return cls(real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def weight_files(version_dir: Path) -> list[MappedFile]:
    """The files a ``share_weights`` ONNX model maps: its external-data files.

    Every regular file under ``version_dir`` (symlinks followed) but the graph and the
    manifest. A file that ONNX Runtime does not map after all is charged anyway: the
    budget errs on the safe side. Files that vanish while listed are skipped.
    """
    found: dict[MappedFile, MappedFile] = {}
    if not version_dir.is_dir():
        return []
    for p in sorted(version_dir.rglob("*")):
        if p.suffix in _GRAPH_SUFFIXES or p.name == _MANIFEST_NAME or "__pycache__" in p.parts:
            continue
        try:
            if not p.is_file():
                continue
            f = MappedFile.of(p)
        except OSError:
            continue
        found.setdefault(f, f)
    return list(found.values())


_PRIVATE_LINE = re.compile(r"\nPrivate_(?:Clean|Dirty|Hugetlb): +(\d+)")
_MAPPING_HEADER = re.compile(r"\n[0-9a-f]+-[0-9a-f]+ ")


def _private_kib(text: str) -> int:
    return sum(map(int, _PRIVATE_LINE.findall(text)))


def parse_mapped_private(text: str, paths: Collection[str]) -> tuple[int, int]:
    """From the text of ``/proc/<pid>/smaps``: (all private bytes, those in ``paths``).

    One read gives both, so that another worker mapping the file in between cannot
    make its pages private in one figure and shared in the other. String searches
    rather than a loop over lines: a worker with llama.cpp or torch loaded has a
    thousand mappings (20,000 lines), which a per-line loop took 10-20 ms to parse.
    """
    text = "\n" + text  # every line, the first too, starts after a newline
    total = _private_kib(text)
    mapped = 0
    for path in set(paths):
        # A mapping's header: "start-end perms offset dev inode [path]", path last.
        needle = f" {path}\n"
        at = text.find(needle)
        while at >= 0:
            line_start = text.rfind("\n", 0, at)
            end = at + len(needle) - 1
            if _MAPPING_HEADER.match(text, line_start):
                nxt = _MAPPING_HEADER.search(text, end)
                mapped += _private_kib(text[end : nxt.start() if nxt else len(text)])
            at = text.find(needle, end)
    return total * 1024, mapped * 1024


_SAMPLE_LINE = {key: re.compile(rf"\n{key}: +(\d+)") for key in ("Rss", "Pss", "Swap")}


def parse_smaps_sample(text: str, paths: Collection[str]) -> tuple[MemorySample, int]:
    """From the text of ``/proc/<pid>/smaps``: the process's sample and the private
    bytes of its mappings of ``paths`` (what ``smaps_rollup`` and
    :func:`parse_mapped_private` give, from one read)."""
    uss, mapped = parse_mapped_private(text, paths)
    body = "\n" + text
    rss, pss, swap = (
        sum(map(int, _SAMPLE_LINE[key].findall(body))) * 1024 for key in ("Rss", "Pss", "Swap")
    )
    return MemorySample(rss, uss, pss, swap), mapped


def _read_smaps(pid: int, proc_root: Path) -> str:
    """``pid``'s full ``smaps``; psutil.NoSuchProcess once it has gone."""
    try:
        return (proc_root / str(pid) / "smaps").read_text()
    except (FileNotFoundError, ProcessLookupError):
        raise psutil.NoSuchProcess(pid) from None


def sample_with_mapped(
    pid: int, paths: Collection[str], proc_root: Path = Path("/proc")
) -> tuple[MemorySample, int]:
    """``pid``'s sample and the private bytes of its mappings of ``paths``, from one read
    of ``smaps`` (for a worker that maps its weights: half the reads of
    :func:`sample_memory` then :func:`mapped_private_bytes`).

    Blocking: call it from a thread on the server's event loop.
    """
    text = _read_smaps(pid, proc_root)
    return parse_smaps_sample(text, set(paths))


def mapped_private_bytes(
    pid: int, paths: Collection[str], proc_root: Path = Path("/proc")
) -> tuple[int, int]:
    """``pid``'s USS and the part of it that lies in its mappings of the files ``paths``.

    Blocking (reads ``smaps``): call it from a thread on the server's event loop.
    """
    text = _read_smaps(pid, proc_root)
    return parse_mapped_private(text, set(paths))
