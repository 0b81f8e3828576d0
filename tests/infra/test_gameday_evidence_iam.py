"""The game-day role reads exactly what the evidence needs from the artifact bucket (issue 49
item 8): every S3 call ``snapshot/objects.jsonl`` makes is allowed, nothing more on the bucket
than the evidence reads, its run archive and the artifact fault's bucket policy.

The evaluator is IAM's for identity policies without conditions: an action and resource are
allowed when an Allow statement matches both (``*`` / ``?`` wildcards) and no Deny does."""

from __future__ import annotations

import fnmatch
import json
from typing import Any

import pytest

from platforms.controlplane import EVIDENCE_PREFIXES
from tests.infra.harness import Run

STACK = "staging"  # the stack with the scheduled game day


def _listed(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def allowed(statements: list[dict[str, Any]], action: str, resource: str) -> bool:
    def matches(s: dict[str, Any]) -> bool:
        return (any(fnmatch.fnmatchcase(action, a) for a in _listed(s["Action"]))
                and any(fnmatch.fnmatchcase(resource, r) for r in _listed(s["Resource"])))
    hits = [s for s in statements if matches(s)]
    return any(s["Effect"] == "Allow" for s in hits) and not any(s["Effect"] == "Deny" for s in hits)


@pytest.fixture(scope="module")
def role(runs: dict[str, Run]) -> tuple[list[dict[str, Any]], str]:
    run = runs[STACK]
    policy = run.one("aws:iam/rolePolicy:RolePolicy", f"mlplatform-{STACK}-gameday-policy")
    bucket = next(b.id for b in run.of_type("aws:s3/bucket:Bucket")
                  if b.name == f"mlplatform-{STACK}-artifacts-bucket")
    return json.loads(policy.props["policy"])["Statement"], bucket


def evidence_calls(bucket: str) -> list[tuple[str, str]]:
    """(The bucket name is its id.) What platforms.controlplane.write_objects calls: list_objects_v2 on the whole bucket,
    get_object on every object of the run's operations."""
    return [("s3:ListBucket", f"arn:aws:s3:::{bucket}"),
            *(("s3:GetObject", f"arn:aws:s3:::{bucket}/{p}/op-1/attempt-1/COMPLETE.json")
              for p in EVIDENCE_PREFIXES)]


def test_every_evidence_read_is_allowed(role: tuple[list[dict[str, Any]], str]) -> None:
    statements, bucket = role
    refused = [c for c in evidence_calls(bucket) if not allowed(statements, *c)]
    assert refused == []


def test_nothing_else_on_the_bucket(role: tuple[list[dict[str, Any]], str]) -> None:
    statements, bucket = role
    b = f"arn:aws:s3:::{bucket}"
    on_bucket = sorted((a, r) for s in statements if s["Effect"] == "Allow"
                       for a in _listed(s["Action"]) if a.startswith("s3:")
                       for r in _listed(s["Resource"]) if r.startswith(b))
    expected = sorted([
        ("s3:ListBucket", b),
        *(("s3:GetObject", f"{b}/{p}/*") for p in EVIDENCE_PREFIXES),
        # its run archive (gameday gate --archive): read and create, never overwrite/delete
        ("s3:GetObject", f"{b}/gameday-archive/*"), ("s3:PutObject", f"{b}/gameday-archive/*"),
        # the artifact-store fault adds and removes a Deny in the bucket policy
        *((f"s3:{a}BucketPolicy", b) for a in ("Get", "Put", "Delete")),
    ])
    assert on_bucket == expected
    for action, key in (("s3:PutObject", "artifacts/op-1/x"), ("s3:DeleteObject", "artifacts/op-1/x"),
                        ("s3:GetObject", "elsewhere/x"), ("s3:DeleteObject", "gameday-archive/x")):
        assert not allowed(statements, action, f"{b}/{key}"), (action, key)
