"""Capacity planning: cold starts, their seconds and the p99 they add, per policy and budget.

``modelyard plan --trace FILE`` reads a request log (or a trace written in that format),
replays it in the simulator under each policy at each budget, and prints a table an
operator can size the budget from before buying memory. Belady's MIN is shown as the
floor no policy can go under.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from modelyard.config.settings import ServerSettings
from modelyard.manager.eviction import POLICY_NAMES
from modelyard.simulation.engine import SimResult, simulate
from modelyard.simulation.traces import MIB, Trace

DEFAULT_FRACTIONS = (0.1, 0.2, 0.3, 0.5, 0.75, 1.0)
"""Budgets tried by default, as fractions of all the trace's models together."""


@dataclass(frozen=True, slots=True)
class PlanRow:
    """One policy at one budget."""

    budget_mib: float
    policy: str
    result: SimResult


def budgets_for(trace: Trace, budgets_mib: Sequence[float] | None) -> list[int]:
    """The budgets to try, in bytes: those given, else fractions of the models' total."""
    if budgets_mib:
        return sorted(int(b * MIB) for b in budgets_mib)
    total = trace.total_bytes
    biggest = max((m.size_bytes for m in trace.models.values()), default=0)
    # Below the biggest model, that model could never load: start there at the least.
    return sorted({max(int(total * f), biggest) for f in DEFAULT_FRACTIONS})


def slots_for(trace: Trace, load_slots: int | None) -> int:
    """The load slots to replay with: those given, else the recording server's, else
    the server's default (no limit: a log without the line is from a server that ran
    every admitted load at once)."""
    if load_slots is not None:
        return load_slots
    if trace.load_slots is not None:
        return trace.load_slots
    default: int = ServerSettings.model_fields["load_slots"].default
    return default


def plan(
    trace: Trace,
    *,
    budgets_mib: Sequence[float] | None = None,
    policies: Sequence[str] = POLICY_NAMES,
    with_belady: bool = True,
    load_slots: int | None = None,
) -> list[PlanRow]:
    """Replay ``trace`` under every policy at every budget.

    ``load_slots`` loads run at once (0: no limit); None: :func:`slots_for` the trace.
    """
    rows = []
    names = [*policies, "belady"] if with_belady else list(policies)
    slots = slots_for(trace, load_slots)
    for budget in budgets_for(trace, budgets_mib):
        for policy in names:
            result = simulate(trace, policy, budget, load_slots=slots)
            rows.append(PlanRow(budget / MIB, policy, result))
    return rows


def format_table(trace: Trace, rows: Sequence[PlanRow], load_slots: int = 0) -> str:
    """The plan as a fixed-width table, one line per policy and budget."""
    slots = f"{load_slots} load slots" if load_slots else "loads unbounded"
    lines = [
        f"trace {trace.name}: {len(trace.requests)} requests over {trace.duration_s:.0f} s, "
        f"{len(trace.models)} models, {trace.total_bytes / MIB:.0f} MiB in all; {slots}",
        f"{'BUDGET MiB':>10}  {'POLICY':10}  {'COLD STARTS':>11}  {'COLD-START s':>12}  "
        f"{'P99 ADDED ms':>12}  {'LOADS':>6}",
    ]
    for row in rows:
        r = row.result
        lines.append(
            f"{row.budget_mib:>10.0f}  {row.policy:10}  {r.cold_starts:>11}  "
            f"{r.cold_start_s:>12.2f}  {r.p99_added_s * 1000:>12.1f}  {r.loads:>6}"
        )
    return "\n".join(lines)
