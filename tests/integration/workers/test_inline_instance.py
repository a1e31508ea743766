"""An inline model runs on the event loop once its calls are cheap, however slow the hops.

The model's call cost must be its runtime call alone: on a loaded machine a thread hop
(or a preemption) takes milliseconds, and counting it kept a 10 µs model on threads for
good. The slow hop is the fault here: ``asyncio.to_thread`` is made to take 2 ms.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelyard.runtimes.base import RuntimeSpec
from modelyard.workers.inline import InlineInstance
from modelyard.workers.instance import StartRequest


async def test_tiny_model_leaves_slow_thread_hops_for_the_loop(
    model_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    instance = InlineInstance()
    spec = RuntimeSpec(kind="onnx", version_dir=str(model_root / "add" / "1"), model_name="add")
    await instance.start(StartRequest(spec))
    real_to_thread = asyncio.to_thread
    hops: list[str] = []

    async def slow_to_thread(func: Callable[..., Any], /, *args: Any) -> Any:
        hops.append(getattr(func, "__name__", "?"))
        await asyncio.sleep(0.002)  # a loaded machine's thread hop
        return await real_to_thread(func, *args)

    monkeypatch.setattr(asyncio, "to_thread", slow_to_thread)
    # As after a slow warm-up or one preempted call: the model starts on threads.
    instance._ewma_s = 0.003
    x = {"input": np.ones((1, 4), np.float32)}
    try:
        for _ in range(100):
            out = await instance.infer(x, timeout_s=5.0)
            assert out["output"].tolist() == [[2.0, 2.0, 2.0, 2.0]]
        hops_before = len(hops)
        for _ in range(20):
            await instance.infer(x, timeout_s=5.0)
        assert len(hops) == hops_before, "a cheap model kept going through thread hops"
        assert hops_before < 100
    finally:
        await instance.stop()
