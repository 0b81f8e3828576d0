"""``_wait_pipeline`` (behind ``submit_pipeline(wait_for=...)`` and ``wait_for_pipeline``) returns
once the pipeline is in a wanted state and fails at once when it ended in another one: a
pipeline's only state with a way out is ``running``, so polling to the timeout could not change
the outcome (as ``_wait`` for operations, tests/chaos/test_wait_for_operations.py)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from chaos.actions import _wait_pipeline
from chaos.context import ChaosError
from platforms import PlatformError


class ScriptedPipelines:
    """Answers ``pipeline`` from a script of states (the last one repeats); ``None`` is the
    API being away for that poll."""

    def __init__(self, script: list[str | None]) -> None:
        self.script = list(script)

    def submit_pipeline(self, *_: Any) -> None:  # what chaos.actions._pipelines looks for
        raise AssertionError("not used here")

    def pipeline(self, pid: str) -> dict[str, Any]:
        state = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if state is None:
            raise PlatformError("503 from the load balancer")
        return {"id": pid, "state": state, "report": None, "timing": None, "steps": [],
                "state_reason": "step train failed" if state == "failed" else None}


def ctx_with(script: list[str | None]) -> SimpleNamespace:
    return SimpleNamespace(platform=ScriptedPipelines(script), platform_name="scripted")


def test_returns_in_a_wanted_state() -> None:
    ctx = ctx_with(["running", None, "succeeded"])
    assert _wait_pipeline(ctx, "p", ["succeeded"], timeout=10)["state"] == "succeeded"


def test_another_final_state_fails_at_once_naming_state_and_reason() -> None:
    ctx = ctx_with(["running", "failed"])
    start = time.monotonic()
    with pytest.raises(ChaosError, match=r"pipeline p ended failed \(step train failed\)"):
        _wait_pipeline(ctx, "p", "succeeded", timeout=60)
    assert time.monotonic() - start < 5  # not the 60 s timeout


def test_waiting_for_either_outcome_accepts_failed() -> None:
    ctx = ctx_with(["running", "failed"])
    assert _wait_pipeline(ctx, "p", ["succeeded", "failed"], timeout=10)["state"] == "failed"


def test_a_running_pipeline_still_times_out() -> None:
    ctx = ctx_with(["running"])
    with pytest.raises(ChaosError, match=r"not in \['succeeded'\] within 1.2s"):
        _wait_pipeline(ctx, "p", "succeeded", timeout=1.2)
