"""Three cuts in the submit path's CPU (docs/performance.md, 2026-12-07): the answer encoded by
orjson with json for what orjson refuses, prometheus children remembered, and FastAPI's native
telemetry off. Each keeps what it replaced: the same JSON, the same counts."""

from __future__ import annotations

import json

import pytest
from prometheus_client import REGISTRY, Counter

from controlplane import metrics
from controlplane.api import submit_path
from controlplane.api.app import Settings, create_app


def test_the_answer_is_the_same_json_as_json_dumps_gives() -> None:
    doc = {"id": "x", "name": "é-ü ✓", "priority": 3, "ratio": 0.1, "big": 1e16, "none": None,
           "labels": {"a": "b"}, "datasets": [], "result": {"loss": -0.0, "n": 2**63 - 1}}
    assert json.loads(submit_path.encode(doc)) == doc


def test_an_integer_orjson_refuses_is_encoded_by_json() -> None:
    doc = {"result": {"n": 2**70}}
    body = submit_path.encode(doc)
    assert body == b'{"result":{"n":1180591620717411303424}}'


def test_a_remembered_child_counts_in_the_registry() -> None:
    c = Counter("hot_path_cuts_test_total", "test", ["a", "b"])
    metrics.child(c, "x", "y").inc()
    metrics.child(c, "x", "y").inc(2)
    metrics.child(c, "x", "z").inc()
    assert metrics.child(c, "x", "y") is c.labels("x", "y")
    assert REGISTRY.get_sample_value("hot_path_cuts_test_total", {"a": "x", "b": "y"}) == 3
    assert REGISTRY.get_sample_value("hot_path_cuts_test_total", {"a": "x", "b": "z"}) == 1


def test_fastapis_own_telemetry_is_off() -> None:
    app = create_app(Settings(dsn="postgresql://127.0.0.1:1/none"))
    native = getattr(app, "_native_telemetry", None)
    if native is None:
        pytest.skip("this FastAPI has no native telemetry (before 0.160): nothing to turn off")
    assert native.enabled() is False
    assert app._telemetry["tracing"] is False and app._telemetry["metrics"] is False
