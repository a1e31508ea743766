"""Fold the rounds of each server into one row per concurrency, and print the comparison."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

BASELINE = "modelyard"


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.fmean(present), 3) if present else None


def summarise(servers: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Per server: mean over rounds of QPS, p50 and p99 per concurrency; memory; cold start.

    Percentiles are averaged over rounds, not recomputed from pooled latencies: each round is
    a separate server process, and the spread between rounds is kept in ``*_by_round``.
    """
    out: dict[str, Any] = {}
    for name, record in servers.items():
        rounds = record.get("rounds", [])
        by_level: dict[int, list[Mapping[str, Any]]] = {}
        for round_ in rounds:
            for result in round_.get("bench", []):
                by_level.setdefault(int(result["concurrency"]), []).append(result)
        levels = {}
        for level, results in sorted(by_level.items()):
            levels[str(level)] = {
                "qps": _mean([r["qps"] for r in results]),
                "p50_ms": _mean([r["p50_ms"] for r in results]),
                "p99_ms": _mean([r["p99_ms"] for r in results]),
                "errors": sum(sum(r.get("errors", {}).values()) for r in results),
                "qps_by_round": [round(r["qps"], 1) for r in results],
                "p99_ms_by_round": [r["p99_ms"] for r in results],
            }
        memory = [r["memory_steady"] for r in rounds if r.get("memory_steady")]
        colds = [
            r["cold_start"]["median_s"] for r in rounds if r.get("cold_start", {}).get("median_s")
        ]
        binds = [r.get("bind_s", {}) for r in rounds if r.get("bind_s")]
        out[name] = {
            "levels": levels,
            "pss_mib": _mean([m["pss_mib"] for m in memory]),
            "rss_mib": _mean([m["rss_mib"] for m in memory]),
            "processes": max((m["processes"] for m in memory), default=None),
            "startup_s": _mean([r.get("startup_s") for r in rounds]),
            "cold_start_s": round(statistics.median(colds), 4) if colds else None,
            "cold_start_note": next(
                (
                    r["cold_start"].get("note")
                    for r in rounds
                    if r.get("cold_start", {}).get("note")
                ),
                None,
            ),
            "bind_s": _mean([b.get(record.get("cold_start_model", ""), None) for b in binds]),
        }
    return out


def _fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _ratio(mine: float | None, theirs: float | None) -> str:
    if mine is None or theirs is None or theirs == 0:
        return "n/a"
    return f"{mine / theirs:.2f}x"


def markdown(summary: Mapping[str, Mapping[str, Any]]) -> str:
    """Two markdown tables: throughput/latency per concurrency, then memory and cold start.

    Ratios are modelyard / peer: above 1 is better for QPS, below 1 is better for latency,
    memory and cold start.
    """
    peers = [name for name in summary if name != BASELINE]
    base = summary.get(BASELINE)
    lines = [
        "| concurrency | server | QPS | p50 ms | p99 ms | errors "
        "| QPS ratio | p50 ratio | p99 ratio |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    levels = sorted({int(c) for s in summary.values() for c in s["levels"]})
    for level in levels:
        mine = base["levels"].get(str(level)) if base else None
        for name, row in summary.items():
            cell = row["levels"].get(str(level))
            if cell is None:
                continue
            ratios = ["", "", ""]
            if name != BASELINE and mine is not None:
                ratios = [
                    _ratio(mine["qps"], cell["qps"]),
                    _ratio(mine["p50_ms"], cell["p50_ms"]),
                    _ratio(mine["p99_ms"], cell["p99_ms"]),
                ]
            lines.append(
                f"| {level} | {name} | {_fmt(cell['qps'])} | {_fmt(cell['p50_ms'], 2)} | "
                f"{_fmt(cell['p99_ms'], 2)} | {cell['errors']} | " + " | ".join(ratios) + " |"
            )
    lines += [
        "",
        "| server | PSS MiB | RSS MiB | processes | start→ready s | cold start s "
        "| PSS ratio | cold start ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in summary.items():
        cold = _fmt(row["cold_start_s"], 3)
        if row["cold_start_s"] is None and row.get("bind_s") is not None:
            cold = f"n/a (bind {row['bind_s']:.3f})"
        ratios = ["", ""]
        if name != BASELINE and base is not None:
            ratios = [
                _ratio(base["pss_mib"], row["pss_mib"]),
                _ratio(base["cold_start_s"], row["cold_start_s"]),
            ]
        lines.append(
            f"| {name} | {_fmt(row['pss_mib'])} | {_fmt(row['rss_mib'])} | "
            f"{row['processes'] if row['processes'] is not None else 'n/a'} | "
            f"{_fmt(row['startup_s'], 2)} | {cold} | " + " | ".join(ratios) + " |"
        )
    notes = [
        f"- {name}: {row['cold_start_note']}"
        for name, row in summary.items()
        if row.get("cold_start_note")
    ]
    if peers:
        lines += ["", "Ratios are modelyard / peer: >1 is better for QPS, <1 for the rest."]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines)
