"""A local Ray whose start times out (a loaded machine: Ray's raylet or GCS answers too late) is tried
once more, and a second timeout is one line with the cause and what to do, never Ray's exception."""

from __future__ import annotations

import logging

import pytest

from rayft.errors import ClusterError
from rayft.runtime import start_local_ray, start_timeout_cause

# The exceptions Ray 2.60 raises when a node it starts does not come up in time (ray/_private/node.py and
# services.py), as they reach ray.init's caller.
RAYLET = Exception(
    "The current node timed out during startup. This could happen because some of the raylet failed to startup "
    "or the GCS has become overloaded."
)
PLASMA = TimeoutError(
    "Timed out after 60 seconds while waiting for node to startup. Did not find socket name /tmp/ray/s in the list "
    "of object store socket names."
)
NODE_INFO = RuntimeError("Timed out waiting for node info for node_id=abc.")


@pytest.mark.parametrize("error", [RAYLET, PLASMA, NODE_INFO])
def test_every_start_timeout_of_ray_is_recognised(error: Exception) -> None:
    cause = start_timeout_cause(error)
    assert cause is not None and "\n" not in cause and cause.startswith(str(error).split(".")[0])


def test_other_errors_are_not_start_timeouts() -> None:
    assert start_timeout_cause(ValueError("runtime_env: bad field")) is None
    wrapped = RuntimeError("ray.init failed")
    wrapped.__cause__ = RAYLET
    assert start_timeout_cause(wrapped) is not None


class Starts:
    """Stands for ray.init: a real start cannot be made to time out on demand, so these raise what Ray
    raises when it does (the exceptions above) and record the calls and the clean-ups between them."""

    def __init__(self, *outcomes: Exception | None) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[str] = []

    def init(self) -> None:
        self.calls.append("init")
        outcome = self.outcomes.pop(0)
        if outcome is not None:
            raise outcome

    def shutdown(self) -> None:
        self.calls.append("shutdown")


def test_a_timed_out_start_is_tried_once_more(caplog: pytest.LogCaptureFixture) -> None:
    starts = Starts(RAYLET, None)
    with caplog.at_level(logging.WARNING, logger="rayft.runtime"):
        start_local_ray(starts.init, starts.shutdown)
    assert starts.calls == ["init", "shutdown", "init"]
    (line,) = [r.getMessage() for r in caplog.records]
    assert "timed out during startup" in line and "trying once more" in line


def test_a_second_timeout_is_one_line_with_the_cause_and_the_fix() -> None:
    starts = Starts(RAYLET, PLASMA)
    with pytest.raises(ClusterError) as caught:
        start_local_ray(starts.init, starts.shutdown)
    message = str(caught.value)
    assert "\n" not in message and starts.calls == ["init", "shutdown", "init", "shutdown"]
    assert "a local Ray did not start in time, twice" in message and "Timed out after 60 seconds" in message
    assert "load average" in message and "ray start --head" in message and "--address" in message


def test_another_failure_is_raised_as_it_is() -> None:
    starts = Starts(ValueError("bad runtime_env"))
    with pytest.raises(ValueError, match="bad runtime_env"):
        start_local_ray(starts.init, starts.shutdown)
    assert starts.calls == ["init"]
