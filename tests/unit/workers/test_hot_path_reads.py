"""What the request path reads of a process instance costs no Python call."""

from __future__ import annotations

import inspect

from modelyard.workers.process import ProcessInstance


def test_is_alive_is_a_plain_attribute() -> None:
    # The manager reads it about three times per request (routing and execution); a
    # property made each read a Python call. Behaviour: tests/integration/workers.
    assert not any(
        isinstance(vars(cls).get("is_alive"), property) for cls in inspect.getmro(ProcessInstance)
    )
