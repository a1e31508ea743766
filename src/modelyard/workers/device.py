"""A worker enters its device before it loads its model.

Run inside the worker process only (never in the server: an inline model shares the
server's process, whose affinity and environment are not a model's to change):

* a **core set** pins the process to its CPUs (``sched_setaffinity``) and sizes the
  thread pools of the native libraries to the set (OpenMP, BLAS), as the runtime's own
  threads already are (``RuntimeSpec.intra_op_threads``);
* a **CUDA device** ``cuda:N`` is the only GPU the process sees
  (``CUDA_VISIBLE_DEVICES=N``, set before any CUDA library initialises, which in a
  worker forked from the fork server has not happened yet); the runtime then uses
  ``cuda:0``.
"""

from __future__ import annotations

import dataclasses
import os

from modelyard.runtimes.base import RuntimeSpec, cuda_index

_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def enter_device(spec: RuntimeSpec) -> RuntimeSpec:
    """Pin this process to ``spec``'s device; returns the spec as the runtime must see it."""
    if spec.cores:
        os.sched_setaffinity(0, spec.cores)
        for name in _THREAD_VARIABLES:
            os.environ[name] = str(len(spec.cores))
    index = cuda_index(spec)
    if index is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # NVML's numbering
        return dataclasses.replace(spec, device="cuda:0")
    return spec
