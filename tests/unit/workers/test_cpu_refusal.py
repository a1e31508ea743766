"""Ray mode: an actor the node's CPUs cannot hold is refused at once, with the reason."""

from __future__ import annotations

from modelyard.workers.cluster_nodes import ClusterNode, cpu_refusal

NODE = ClusterNode("a", "id-a", True, (), cpus=2.0)


def test_an_actor_that_fits_the_free_cpus_is_not_refused() -> None:
    assert cpu_refusal(NODE, [], 1.0, "m") == ""
    assert cpu_refusal(NODE, ["add-1"], 1.0, "m") == ""
    assert cpu_refusal(NODE, ["add-1", "add-2", "add-3"], 0.5, "m") == ""


def test_a_node_whose_cpus_are_held_refuses_and_names_the_holders() -> None:
    reason = cpu_refusal(NODE, ["add-2", "add-1"], 1.0, "add-3")
    assert reason.startswith("Ray cannot start model 'add-3''s actor on node a")
    assert "asks 1 CPU (ray.actor_num_cpus)" in reason
    assert "node's 2 CPUs are held by this server's 2 actor(s) there (add-1, add-2)" in reason


def test_actors_that_ask_no_cpu_are_never_refused() -> None:
    assert cpu_refusal(NODE, ["x"] * 10, 0.0, "m") == ""
