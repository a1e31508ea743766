"""Placement's choice as pure functions (``manager/placement.py``): candidates, cost,
choice and the verdict of a refusal, on values, without a manager or a server."""

from __future__ import annotations

from pathlib import Path

from modelyard.config.devices import DeviceConfig
from modelyard.config.model_config import ModelConfig
from modelyard.manager.devices import DeviceTable
from modelyard.manager.placement import (
    Option,
    Refusal,
    candidates,
    choose,
    cost,
    same_version,
    verdict,
)
from modelyard.manager.records import ModelKey, ModelRecord, Replica, ReplicaKey
from modelyard.manager.states import ModelState

MIB = 1024 * 1024


def _table() -> DeviceTable:
    return DeviceTable(
        [
            DeviceConfig(name="cpu:0", memory_budget_mb=100),
            DeviceConfig(name="cuda:0", memory_budget_mb=100),
            DeviceConfig(name="cpu:1", memory_budget_mb=100),
        ],
        nvml_opener=lambda: (None, "no NVIDIA driver answers"),
        host_budget_bytes=lambda: 1024 * MIB,
        usable_cores=lambda: {0, 1},
    )


def test_candidates_keep_the_models_order_and_name_why_a_device_cannot_serve() -> None:
    usable, refused = candidates(["cuda:0", "cpu:1", "cpu:0"], _table())
    assert usable == [(1, "cpu:1"), (2, "cpu:0")]
    assert [(r.device, r.kind) for r in refused] == [("cuda:0", "unusable")]
    assert "no NVIDIA driver answers" in refused[0].note


def test_free_room_beats_evictions_and_evictions_beat_waiting_for_loads() -> None:
    at = {"same": 0, "load": 0}
    free = cost(0, preference=2, **at)
    evicting = cost(1, preference=0, reload_s=0.1, evicted_bytes=1, **at)
    waiting = cost(2, preference=0, **at)
    assert sorted([waiting, evicting, free]) == [free, evicting, waiting]
    # Among evictions: fewer reload seconds, then fewer bytes evicted.
    cheap = cost(1, preference=1, reload_s=0.1, evicted_bytes=50, **at)
    dear = cost(1, preference=0, reload_s=2.0, evicted_bytes=10, **at)
    small = cost(1, preference=2, reload_s=0.1, evicted_bytes=10, **at)
    assert sorted([dear, cheap, small]) == [small, cheap, dear]


def test_among_equals_replicas_spread_then_the_less_loaded_then_the_preferred() -> None:
    crowded = cost(0, same=1, load=0, preference=0)
    busy = cost(0, same=0, load=5, preference=0)
    later = cost(0, same=0, load=0, preference=3)
    assert sorted([crowded, busy, later]) == [later, busy, crowded]


def test_the_choice_is_the_cheapest_and_its_reason_names_what_it_was_preferred_over() -> None:
    options = [
        Option(cost(1, same=0, load=0, preference=0, reload_s=1.0), "cpu:0", "cpu:0: evicts x"),
        Option(cost(0, same=0, load=0, preference=1), "cpu:1", "cpu:1: fits"),
    ]
    refused = [Refusal("cuda:0", "unusable", "cuda:0: no driver")]
    placement = choose(options, refused, allowed=3)
    assert placement.device == "cpu:1"
    assert placement.reason == "cpu:1: fits (over cpu:0: evicts x; cuda:0: no driver)"
    assert placement.had_choice
    alone = choose([options[0]], [], allowed=1)
    assert (alone.device, alone.reason, alone.had_choice) == ("cpu:0", "cpu:0: evicts x", False)


def test_the_verdict_of_a_load_nowhere_to_go() -> None:
    unusable = Refusal("cuda:0", "unusable", "cuda:0: no driver")
    big = Refusal("cpu:0", "too_big", "cpu:0: needs 300.0 MiB, budget 100.0", 300, 100)
    full = Refusal("cpu:1", "full", "cpu:1: no room even after evictions", 40)
    leaving = Refusal("cpu:1", "no_room", "cpu:1: 1.0 MiB free, needs 40.0")
    assert verdict([unusable], 1).kind == "unusable"
    too_big = verdict([unusable, big], 2)
    assert (too_big.kind, too_big.first) == ("too_big", big)
    assert too_big.detail == "cuda:0: no driver; cpu:0: needs 300.0 MiB, budget 100.0"
    # One device merely full: the budget's refusal on it, not "too big".
    assert (verdict([big, full], 2).kind, verdict([big, full], 2).first) == ("full", full)
    assert verdict([leaving], 1).kind == "other"
    assert verdict([], 0).detail == "it lists no configured device"


def test_same_version_counts_the_replicas_there_and_the_model_for_an_extra_replica() -> None:
    record = ModelRecord(ModelKey("m", "1"), ModelConfig(name="m", path="m"), Path("m"))
    record.device = "cpu:0"
    record.state = ModelState.READY
    record.replicas.append(Replica(ReplicaKey("m", "1", 1), "cpu:1"))
    assert same_version(record, "cpu:1", replica=False) == 1
    assert same_version(record, "cpu:0", replica=False) == 0
    assert same_version(record, "cpu:0", replica=True) == 1
