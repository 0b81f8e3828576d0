"""Routing reads only some columns of each waiting operation and only part of its spec
(controlplane/store/scheduling.py, _ROUTED and _ROUTED_SPEC): the requirement computed from that
part, as PostgreSQL builds it, equals the requirement of the whole spec."""

from __future__ import annotations

import json

import psycopg
import pytest

from controlplane.db import migrate
from controlplane.store import columns, scheduling

IMAGE = "127.0.0.1:5000/ml/trainer:1.0"
SPECS = [
    {"name": "plain", "workload": {"kind": "train", "image": IMAGE, "args": ["--x"]}},
    {"name": "gpu", "workload": {"kind": "train", "image": "reg.example:443/a/b@sha256:00"},
     "resources": {"cpu": 4, "accelerator": {"type": "a100", "count": 2}},
     "placement": {"regions": ["eu-west-1", "us-east-1"], "dataset": "imagenet"},
     "labels": {"team": "x"}, "datasets": [{"name": "d", "sha256": "0" * 64, "uri": "datasets/d"}]},
    {"name": "nulls", "workload": {"kind": "sleep", "image": IMAGE},
     "resources": None, "placement": None},
    {"name": "empty", "workload": {"kind": "sleep", "image": IMAGE},
     "resources": {}, "placement": {"regions": []}},
]


@pytest.mark.parametrize("spec", SPECS, ids=[s["name"] for s in SPECS])
def test_the_routed_part_of_a_spec_gives_the_whole_specs_requirement(
        pg_dsn: str, spec: dict) -> None:
    migrate(pg_dsn)
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(f"SELECT {scheduling._ROUTED_SPEC} FROM (SELECT %s::jsonb AS spec) o",
                           (json.dumps(spec),)).fetchone()
    assert row is not None
    assert scheduling.requirement(row[0]) == scheduling.requirement(spec)


def test_the_routed_columns_are_columns_of_every_release() -> None:
    for rel in ("N", "N+1"):
        names = columns._some("operations", "o", rel, scheduling._ROUTED).split(", ")
        assert len(names) == len(scheduling._ROUTED)
    assert "o.wait_reason" in columns._some("operations", "o", "N+1", scheduling._ROUTED)
    with pytest.raises(ValueError, match="no column"):
        columns.some("operations", ("id", "nope"))
