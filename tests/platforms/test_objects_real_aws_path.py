"""Cloud runs read the artifact bucket from AWS S3 itself (default credential chain, no
endpoint URL). Tested against moto's in-process AWS mock, not a real account."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from moto import mock_aws

from platforms import PlatformError
from platforms.controlplane import (
    ControlPlaneAdapter,
    s3_client,
    snapshot_objects,
    write_objects,
)


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(k, v)
    with mock_aws():
        yield


def test_no_endpoint_means_aws_s3_in_the_region_against_moto_mock(aws: None, tmp_path: Path) -> None:
    s3 = s3_client(None, "ml-artifacts-test", "eu-west-1")
    s3.create_bucket(Bucket="ml-artifacts-test", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    s3.put_object(Bucket="ml-artifacts-test", Key="artifacts/op/attempt-1/COMPLETE.json", Body=b'{"ok": true}')
    s3.put_object(Bucket="ml-artifacts-test", Key="artifacts/op/attempt-1/model.npy", Body=b"\x00")
    out = tmp_path / "objects.jsonl"
    assert write_objects(s3, "ml-artifacts-test", out) == 2
    rows = {r["key"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows["artifacts/op/attempt-1/COMPLETE.json"]["content"] == {"ok": True}
    # the adapter built from a cloud environment's endpoints (region, no s3) takes the same path
    adapter = ControlPlaneAdapter.from_env({"api": "http://127.0.0.1:9", "bucket": "ml-artifacts-test",
                                            "region": "eu-west-1"}, {"projects": {"p": "t"}})
    assert snapshot_objects(adapter.s3_endpoint, adapter.bucket, tmp_path / "again.jsonl",
                            adapter.region) == 2
    # a run's snapshot keeps that run's operations' objects only
    assert snapshot_objects(None, "ml-artifacts-test", tmp_path / "mine.jsonl", "eu-west-1",
                            operations={"other-op"}) == 0


def test_neither_endpoint_nor_region_is_a_clear_error() -> None:
    with pytest.raises(PlatformError, match="neither an S3 endpoint nor an AWS region"):
        s3_client(None, "ml-artifacts-test", None)
