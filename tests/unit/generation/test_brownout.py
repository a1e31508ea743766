"""The brownout rule: cap ``max_tokens`` only when every slot is busy and enough wait."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from modelyard.config.model_config import GenerationConfig
from modelyard.scheduling.brownout import brownout_cap, is_overloaded


def test_overloaded_needs_every_slot_busy_and_the_queue_depth() -> None:
    assert not is_overloaded(running=1, slots=2, queued=0, queue_depth=0)
    assert is_overloaded(running=2, slots=2, queued=0, queue_depth=0)
    assert not is_overloaded(running=2, slots=2, queued=2, queue_depth=3)
    assert is_overloaded(running=2, slots=2, queued=3, queue_depth=3)
    # A free slot means no overload, however the queue looks (it drains at once).
    assert not is_overloaded(running=1, slots=2, queued=5, queue_depth=3)


def test_cap_applies_only_when_on_overloaded_and_shorter() -> None:
    busy = {"running": 1, "slots": 1, "queued": 0, "queue_depth": 0}
    idle = {"running": 0, "slots": 1, "queued": 0, "queue_depth": 0}
    assert brownout_cap(500, 16, **busy) == 16
    assert brownout_cap(None, 16, **busy) == 16  # "until the context is full" is capped too
    assert brownout_cap(500, 16, **idle) is None
    assert brownout_cap(500, None, **busy) is None  # brownout off
    assert brownout_cap(16, 16, **busy) is None  # not cut short: not marked
    assert brownout_cap(4, 16, **busy) is None
    deep = {"running": 1, "slots": 1, "queued": 1, "queue_depth": 2}
    assert brownout_cap(500, 16, **deep) is None
    assert brownout_cap(500, 16, **(deep | {"queued": 2})) == 16


def test_generation_config_brownout_keys() -> None:
    cfg = GenerationConfig.model_validate({"brownout_max_tokens": 32, "brownout_queue_depth": 4})
    assert (cfg.brownout_max_tokens, cfg.brownout_queue_depth) == (32, 4)
    default = GenerationConfig()
    assert default.brownout_max_tokens is None
    assert default.brownout_queue_depth == 0
    with pytest.raises(ValidationError):
        GenerationConfig.model_validate({"brownout_max_tokens": 0})
    with pytest.raises(ValidationError):
        GenerationConfig.model_validate({"brownout_queue_depth": -1})
