"""Early rejection and shedding by priority: which requests to refuse at once, and why.

Under a burst a queue that only refuses when full lets a request wait its whole deadline
to fail, and lets low-priority work age into the way of high-priority work. Two rules,
both on the latency estimate of :mod:`~modelyard.scheduling.wait_estimate`, refuse such
requests at admission instead (or send them to their fallback, see the data plane):

* **deadline** (early rejection): a request whose estimated latency ends after its
  deadline is refused; it would only have timed out;
* **shed** (by priority): the objectives of ``latency_slo_by_priority_s`` (the model's
  ``latency_slo_s`` for priorities the map does not name) protect the more important
  classes. A request of priority ``p`` is shed when some more important class ``q < p``
  with an objective is at risk (its estimated *wait*, the time before its call would
  start, above :data:`SHED_HEADROOM` of its objective), or when ``p``'s own estimated
  latency is above its own objective. The wait, not the latency, because shedding others
  can shorten only the wait: on an idle model (nothing queued, nothing running) no class
  is at risk, however long one call takes. The most important class (no class with an
  objective above it) is never shed: it is only refused when its deadline cannot be met.

Lower classes thus give way while the higher ones still have headroom, and are the
first refused. Nothing is refused before a service time was measured, and the estimates
recover by themselves (stale measurements decay, an idle model admits a probe now and
then: :mod:`~modelyard.scheduling.wait_estimate`, the scheduler). The functions are
pure; the scheduler counts, builds the typed errors and raises them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = ["SHED_HEADROOM", "Refusal", "decide", "objective_s"]

SHED_HEADROOM = 0.5
"""A class is at risk when its estimated latency passes this share of its objective:
lower classes are shed then, while what is already queued can still finish in time."""

RefusalReason = Literal["deadline", "shed"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused at admission, with the figures that decided it."""

    reason: RefusalReason
    estimate_s: float
    """The refused request's own estimated latency."""
    limit_s: float
    """What it was compared with: the time left to the deadline, or an objective."""
    protected: int | None = None
    """For a shed: the more important priority at risk (None: its own objective)."""


def objective_s(
    priority: int, by_priority_s: Mapping[int, float], default_s: float | None
) -> float | None:
    """The latency objective of ``priority``: its own, else the model's, else None."""
    return by_priority_s.get(priority, default_s)


def decide(
    *,
    priority: int,
    now: float,
    deadline: float,
    estimate_s: Callable[[int], float | None],
    early_rejection: bool,
    by_priority_s: Mapping[int, float],
    default_slo_s: float | None,
    slack_s: float = 0.0,
) -> Refusal | None:
    """The refusal of a request of ``priority``, or None to admit it.

    ``estimate_s(q)`` is, for ``q == priority``, this request's estimated latency, and for
    a more important ``q`` the estimated wait of a request of priority ``q`` queued now;
    None while nothing is measured.
    ``slack_s`` is kept free before the deadline (the scheduler passes one call's time:
    a call that overruns its deadline costs the worker, not only the request).
    """
    own_s = estimate_s(priority)
    if own_s is None:
        return None
    if early_rejection and now + own_s + slack_s > deadline:
        return Refusal("deadline", own_s, deadline - now)
    protected = sorted(q for q in by_priority_s if q < priority)
    if not protected:
        return None
    for q in protected:
        estimate_q = estimate_s(q)
        slo_q = by_priority_s[q]
        if estimate_q is not None and estimate_q > SHED_HEADROOM * slo_q:
            return Refusal("shed", own_s, SHED_HEADROOM * slo_q, protected=q)
    own_slo_s = objective_s(priority, by_priority_s, default_slo_s)
    if own_slo_s is not None and own_s > own_slo_s:
        return Refusal("shed", own_s, own_slo_s)
    return None
