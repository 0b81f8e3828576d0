"""``_wait`` (behind ``submit_workloads(wait_for=...)`` and ``wait_for_operations``) returns once
every operation is in a wanted state, and fails at once when one ends in another terminal state:
terminal states are final, so polling to the timeout only made a failed experiment slower."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from chaos.actions import _wait
from chaos.context import ChaosError
from platforms import PlatformError
from platforms.base import OperationView


class ScriptedPlatform:
    """Answers ``get`` from a per-operation script of states (the last one repeats); ``None``
    in a script is the API being away for that poll."""

    def __init__(self, scripts: dict[str, list[str | None]]) -> None:
        self.scripts = {k: list(v) for k, v in scripts.items()}
        self.calls = 0

    def get(self, op_id: str) -> OperationView:
        self.calls += 1
        script = self.scripts[op_id]
        state = script.pop(0) if len(script) > 1 else script[0]
        if state is None:
            raise PlatformError("503 from the load balancer")
        return OperationView(id=op_id, state=state,
                             state_reason="retries exhausted" if state == "failed" else None)


def ctx_with(scripts: dict[str, list[str | None]]) -> SimpleNamespace:
    return SimpleNamespace(platform=ScriptedPlatform(scripts))


def test_returns_when_every_operation_is_in_a_wanted_state() -> None:
    ctx = ctx_with({"a": ["queued", None, "running", "succeeded"], "b": ["succeeded"]})
    assert _wait(ctx, ["a", "b"], {"succeeded"}, timeout=10) == {"a": "succeeded",
                                                                 "b": "succeeded"}


def test_another_terminal_state_fails_at_once_naming_state_and_reason() -> None:
    ctx = ctx_with({"a": ["running", "failed"], "b": ["running"]})
    start = time.monotonic()
    with pytest.raises(ChaosError, match=r"operation a ended failed \(retries exhausted\)"):
        _wait(ctx, ["a", "b"], {"succeeded"}, timeout=60)
    assert time.monotonic() - start < 5  # not the 60 s timeout


def test_a_wanted_terminal_state_among_several_is_not_an_error() -> None:
    ctx = ctx_with({"a": ["failed"], "b": ["running", "succeeded"]})
    assert _wait(ctx, ["a", "b"], {"failed", "succeeded"}, timeout=10) == {"a": "failed",
                                                                         "b": "succeeded"}


def test_a_state_that_never_comes_still_times_out() -> None:
    ctx = ctx_with({"a": ["running"]})
    with pytest.raises(ChaosError, match=r"not in \['succeeded'\] within 0.6s"):
        _wait(ctx, ["a"], {"succeeded"}, timeout=0.6)
