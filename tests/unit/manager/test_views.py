"""The typed views: /v2/stats and /v2/health/details read the same VersionView."""

from __future__ import annotations

from pathlib import Path

from modelyard.manager.stats import ManagerView, VersionView
from modelyard.observability.health import HealthView
from tests.unit.manager.test_manager import MIB, make_manager


async def test_stats_and_health_say_the_same_about_a_version(tmp_path: Path) -> None:
    manager, _, clock = make_manager(tmp_path, {"a": {"memory_mb": 10}, "b": {"memory_mb": 10}})
    a = manager.resolve("a", None)
    await manager.ensure_ready(a, deadline=None)
    manager.touch(a)
    clock.advance(2.5)
    view = ManagerView.of(manager)
    by_name = {m.name: m for m in view.models}
    stats = by_name["a"].stats_json()
    health = by_name["a"].health_json()
    for field in ("name", "version", "state", "ready", "reason", "restarts"):
        assert stats[field] == health[field], field
    assert stats["state"] == "READY"
    assert stats["reserved_bytes"] == 10 * MIB
    assert stats["last_used_s_ago"] == 2.5, "read on the manager's clock"
    assert stats["loads"] == 1
    assert stats["last_load"]["total_s"] >= 0
    assert "pid" in stats, "a loaded version reports its instance"
    assert "scheduler" not in stats, "no scheduler was attached"
    assert health["breaker"] is None
    # An unloaded version: no pid, no worker readings, never used.
    b = by_name["b"].stats_json()
    assert b["state"] == "UNLOADED"
    assert b["last_used_s_ago"] is None
    assert "pid" not in b
    assert "worker" not in b
    document = view.stats_json()
    assert document["devices"] == [
        {
            "name": "cpu",
            "budget_bytes": 100 * MIB,
            "reserved_bytes": 10 * MIB,
            "free_bytes": 90 * MIB,
            "kind": "cpu",
        }
    ]
    assert document["eviction_policy"] == "arrival-cost"
    assert [e["kind"] for e in document["events"]] == ["loaded"]
    await manager.close()


def test_health_hides_the_pid_of_a_version_that_is_not_ready(tmp_path: Path) -> None:
    manager, _, clock = make_manager(tmp_path, {"a": {}})
    version = VersionView.of(manager.resolve("a", None), clock.monotonic())
    health = HealthView(True, False, "starting", None, False, [version]).to_json()
    assert health["ready"] is False
    assert health["reason"] == "starting"
    assert health["models"] == [
        {
            "name": "a",
            "version": "1",
            "state": "UNLOADED",
            "ready": False,
            "reason": "",
            "pid": None,
            "restarts": 0,
            "breaker": None,
        }
    ]
