"""An operation's declared datasets (docs/CONTRACTS.md section 1, ``datasets``): where a uri
may point (controlplane/dataset_uri.py), one validator for operations and pipeline steps, and
the idempotency hash covering the datasets while a spec without any hashes as before."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from controlplane import dataset_uri
from controlplane.models import OperationSpec
from controlplane.pipelines.spec import PipelineSpec
from controlplane.store.submissions import payload_hash

IMAGE = "127.0.0.1:5000/ml/trainer:1.0"
V1, V2 = "1" * 64, "2" * 64


def spec(**extra: Any) -> OperationSpec:
    return OperationSpec.model_validate({"name": "x", "workload": {"image": IMAGE}, **extra})


@pytest.mark.parametrize("uri,bucket,key", [
    ("datasets/churn/rows.csv", None, "datasets/churn/rows.csv"),
    ("s3://ml-artifacts/datasets/churn/v=2/rows.csv", "ml-artifacts",
     "datasets/churn/v=2/rows.csv"),
])
def test_a_dataset_uri_is_a_key_under_datasets_with_or_without_its_bucket(
        uri: str, bucket: str | None, key: str) -> None:
    assert dataset_uri.split(uri) == (bucket, key)
    assert dataset_uri.key_in(uri, "ml-artifacts") == key


@pytest.mark.parametrize("uri,why", [
    ("gs://ml-artifacts/datasets/rows.csv", "scheme 'gs' is not s3"),
    ("s3://ML_Artifacts/datasets/rows.csv", "is not an S3 bucket name"),
    ("s3://ml-artifacts", "not under datasets/"),
    ("artifacts/op/attempt-1/model.npy", "not under datasets/"),
    ("datasets//rows.csv", "segment '' is empty"),
    ("datasets/a/../../checkpoints/x", "segment '..'"),
    ("datasets/a b.csv", "segment 'a b.csv'"),
    ("datasets/" + "a" * 1100, "longer than 1024"),
])
def test_anything_else_is_refused_with_its_reason(uri: str, why: str) -> None:
    with pytest.raises(ValueError) as err:
        dataset_uri.split(uri)
    assert why in str(err.value)


def test_the_workload_reads_the_artifact_bucket_only() -> None:
    with pytest.raises(ValueError, match="names bucket 'other', not the artifact bucket "
                       "'ml-artifacts'"):
        dataset_uri.key_in("s3://other/datasets/rows.csv", "ml-artifacts")


def test_the_idempotency_hash_covers_the_datasets_and_not_their_absence() -> None:
    ds = {"name": "rows", "sha256": V1, "uri": "datasets/rows.csv"}
    plain, one = spec().document(), spec(datasets=[ds]).document()
    assert "datasets" not in plain  # a spec without datasets hashes as before they existed
    assert payload_hash(plain) == payload_hash(spec(datasets=[]).document())
    other_bytes = spec(datasets=[{**ds, "sha256": V2}]).document()
    other_place = spec(datasets=[{**ds, "uri": "datasets/v2/rows.csv"}]).document()
    hashes = {payload_hash(d) for d in (plain, one, other_bytes, other_place)}
    assert len(hashes) == 4  # a used key with another dataset is a 409


def test_pipeline_steps_and_operations_share_the_dataset_rules() -> None:
    dup = [{"name": "a", "sha256": V1}, {"name": "a", "sha256": V2}]
    with pytest.raises(ValidationError, match=r"datasets\[1\]\.name: duplicate dataset name"):
        spec(datasets=[{**d, "uri": "datasets/a"} for d in dup])
    step = {"name": "s", "operation": {"workload": {"image": IMAGE}}}
    with pytest.raises(ValidationError,
                       match=r"steps\[0\]\.datasets\[1\]\.name: duplicate dataset name"):
        PipelineSpec.model_validate({"name": "p", "steps": [{**step, "datasets": dup}]})
    with pytest.raises(ValidationError, match="not an s3 URI of the artifact bucket"):
        PipelineSpec.model_validate({"name": "p", "steps": [
            {**step, "datasets": [{"name": "a", "sha256": V1, "uri": "/etc/passwd"}]}]})
    # a step's datasets go on the step, read under its policy: never in its operation too
    with pytest.raises(ValidationError, match=r"declares its datasets on the step"):
        PipelineSpec.model_validate({"name": "p", "steps": [{**step, "operation": {
            **step["operation"], "datasets": [{"name": "a", "sha256": V1,
                                               "uri": "datasets/a"}]}}]})


def test_a_workload_class_does_not_refuse_datasets() -> None:
    ds = [{"name": "rows", "sha256": V1, "uri": "datasets/rows.csv"}]
    assert spec(workload_class="batch-preprocessing", datasets=ds).datasets[0].sha256 == V1


def test_an_operation_gives_its_workload_its_declared_datasets() -> None:
    from controlplane.pipelines.manifest import given_inputs, inputs_mismatch

    ds = [{"name": "b", "sha256": V2, "uri": "datasets/b"},
          {"name": "a", "sha256": V1, "uri": "s3://ml-artifacts/datasets/a"}]
    doc = spec(datasets=ds).document()
    given = given_inputs(doc)
    assert given == {"steps": [], "datasets": ds, "digests": [V1, V2]}
    assert given_inputs(spec().document()) is None  # nothing to read at start
    # the agent checks the result against it: every digest, none left out (policy fail)
    assert inputs_mismatch(given, [V2, V1], None) is None
    assert "it was given" in str(inputs_mismatch(given, [V1], None))
    assert "not degrade" in str(inputs_mismatch(given, [V1], {"excluded": {"b": "missing"}}))
    # a pipeline step's own inputs win: its operation never declares datasets of its own
    step = {**doc, "pipeline": {"inputs": {"steps": [], "datasets": [], "digests": []}}}
    assert given_inputs(step) == {"steps": [], "datasets": [], "digests": []}
