"""Trace-driven simulation of the model cache: the manager's own policies on a virtual clock.

:mod:`~modelyard.simulation.traces` makes request traces (synthetic, or read back from a
server's request log), :mod:`~modelyard.simulation.engine` replays one against a budget
with a given eviction policy and prefetcher, and :mod:`~modelyard.simulation.plan`
sweeps policies and budgets for ``modelyard plan``. No process is started, nothing sleeps.
"""
