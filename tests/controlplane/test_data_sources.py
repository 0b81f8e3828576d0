"""Data at start, the pure parts: a step's source policy validated at the edge (errors name the
field), each source checked against its declared sha256, the declared policy applied
(controlplane/workload/data.py), and the consumed-inputs rule the agent and the control plane
both apply to a result that left sources out (controlplane/pipelines/manifest.py)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from pydantic import ValidationError

from controlplane.pipelines import manifest
from controlplane.pipelines.spec import PipelineSpec
from controlplane.workload import data

PINNED = "127.0.0.1:5000/ml/trainer@sha256:" + "c" * 64


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def sources(n: int = 10) -> list[dict[str, Any]]:
    return [{"name": f"s{i:02d}", "sha256": sha(f"rows {i}".encode()),
             "uri": f"datasets/t/s{i:02d}.csv"} for i in range(n)]


def spec(policy: dict[str, Any] | None, datasets: list[dict[str, Any]]) -> dict[str, Any]:
    step: dict[str, Any] = {"name": "prepare", "phase": "prepare", "datasets": datasets,
                            "operation": {"workload": {"kind": "prepare", "image": PINNED}}}
    if policy is not None:
        step["on_source_unavailable"] = policy
    return {"name": "p", "steps": [step]}


def error_of(body: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as exc:
        PipelineSpec.model_validate(body)
    return str(exc.value)


def test_source_policy_is_validated_naming_the_field() -> None:
    ok = PipelineSpec.model_validate(spec({"policy": "degrade", "min_sources": 9}, sources()))
    assert ok.steps[0].on_source_unavailable is not None
    assert ok.steps[0].on_source_unavailable.min_sources == 9
    assert "policy degrade needs min_sources" in error_of(spec({"policy": "degrade"}, sources()))
    assert "min_sources applies to policy degrade only" in error_of(
        spec({"policy": "fail", "min_sources": 3}, sources()))
    assert "steps[0].on_source_unavailable.min_sources: 11 > 10 datasets" in error_of(
        spec({"policy": "degrade", "min_sources": 11}, sources()))
    nouri = sources(3)
    nouri[1]["uri"] = None
    assert "steps[0].datasets[1].uri: a step with on_source_unavailable" in error_of(
        spec({"policy": "fail"}, nouri))
    assert "steps[0].on_source_unavailable: step 'prepare' declares no datasets" in error_of(
        spec({"policy": "fail"}, []))
    dup = sources(3)
    dup[2]["name"] = "s00"
    assert "steps[0].datasets[2].name: duplicate dataset name 's00'" in error_of(spec(None, dup))
    bad = sources(2)
    bad[0]["sha256"] = "not-a-digest"
    assert "sha256" in error_of(spec({"policy": "fail"}, bad))
    assert "policy" in error_of(spec({"policy": "ignore"}, sources()))


def test_a_pipeline_without_a_source_policy_keeps_its_stored_document() -> None:
    """The stored document (and with it the idempotency payload hash) of a pipeline declaring
    no source policy has no new key."""
    from controlplane.store.pipelines import document

    doc = document(PipelineSpec.model_validate(spec(None, sources(2))))
    assert "on_source_unavailable" not in doc["steps"][0]
    doc = document(PipelineSpec.model_validate(spec({"policy": "fail"}, sources(2))))
    assert doc["steps"][0]["on_source_unavailable"] == {"policy": "fail", "min_sources": None}


def test_each_source_is_checked_against_its_declared_digest() -> None:
    good = data.check("s00", sha(b"a"), b"a")
    assert good.reason is None and good.read == sha(b"a")
    bad = data.check("s01", sha(b"a"), b"b")
    assert bad.read == sha(b"b") and bad.reason and "sha256 mismatch" in bad.reason
    gone = data.check("s02", sha(b"a"), None, "object missing: datasets/x")
    assert gone.read is None and gone.reason == "object missing: datasets/x"
    # the seeded defect's path: computed and recorded, never compared
    unchecked = data.check("s01", sha(b"a"), b"b", verify=False)
    assert unchecked.reason is None and unchecked.read == sha(b"b")


def reads(bad: dict[str, str]) -> list[data.SourceRead]:
    out = []
    for i in range(10):
        name, d = f"s{i:02d}", sha(f"rows {i}".encode())
        out.append(data.SourceRead(name, d, None if name in bad else d, bad.get(name)))
    return out


def test_the_declared_policy_is_what_happens() -> None:
    clean = data.decide("degrade", 9, reads({}))
    assert clean.run and clean.excluded == {} and len(clean.read) == 10
    one = {"s03": "sha256 mismatch"}
    degraded = data.decide("degrade", 9, reads(one))
    assert degraded.run and degraded.excluded == one and "s03" not in degraded.read
    assert len(degraded.read) == 9 and "excluded s03 (sha256 mismatch)" in degraded.reason
    acc = data.accounting(degraded)
    assert acc["excluded"] == one and set(acc["declared"]) == set(acc["read"]) | {"s03"}
    too_few = data.decide("degrade", 10, reads(one))
    assert not too_few.run and "fewer than min_sources 10" in too_few.reason
    failed = data.decide("fail", None, reads({"s07": "object missing: x"}))
    assert not failed.run and failed.read == {} and "s07 (object missing: x)" in failed.reason
    # no policy declared is fail
    assert not data.decide(None, None, reads(one)).run
    with pytest.raises(ValueError, match="unknown source policy"):
        data.decide("ignore", None, reads(one))


def test_fetch_reads_through_the_store_and_raises_when_the_step_may_not_run() -> None:
    from controlplane import storage

    ds = sources(3)
    blobs = {d["uri"]: f"rows {i}".encode() for i, d in enumerate(ds)}
    blobs[ds[1]["uri"]] = b"corrupt"
    del blobs[ds[2]["uri"]]

    def get(uri: str) -> bytes:
        if uri not in blobs:
            raise storage.ObjectMissing(uri)
        return blobs[uri]

    outcome, used = data.fetch(get, ds, {"policy": "degrade", "min_sources": 1},
                                bucket="ml-artifacts")
    assert set(used) == {"s00"} and set(outcome.excluded) == {"s01", "s02"}
    assert outcome.excluded["s02"].startswith("object missing")
    with pytest.raises(data.DataUnavailable, match="policy fail: 2 of 3 sources unusable"):
        data.fetch(get, ds, {"policy": "fail"}, bucket="ml-artifacts")
    with pytest.raises(data.DataUnavailable, match="fewer than min_sources 2"):
        data.fetch(get, ds, {"policy": "degrade", "min_sources": 2}, bucket="ml-artifacts")


def test_fetch_reads_s3_uris_of_the_artifact_bucket_only() -> None:
    ds = sources(2)
    blobs = {d["uri"]: b"rows" for d in ds}
    ds = [{**d, "sha256": storage_sha(b"rows")} for d in ds]
    ds[0]["uri"] = "s3://ml-artifacts/" + ds[0]["uri"]  # the same key, bucket named
    ds[1]["uri"] = "s3://elsewhere/" + ds[1]["uri"]
    keys: list[str] = []

    def get(key: str) -> bytes:
        keys.append(key)
        return blobs[key]

    with pytest.raises(data.DataUnavailable) as failed:
        data.fetch(get, ds, None, bucket="ml-artifacts")
    assert keys == ["datasets/t/s00.csv"]  # the other bucket is never asked
    assert "s01 (uri s3://elsewhere/datasets/t/s01.csv: uri names bucket 'elsewhere', not the "\
        "artifact bucket 'ml-artifacts')" in str(failed.value)


def storage_sha(data: bytes) -> str:
    from controlplane import storage

    return storage.sha256_hex(data)


def test_a_result_may_leave_out_only_the_sources_its_degrade_policy_names() -> None:
    ds = sources(10)
    digests = sorted(d["sha256"] for d in ds)
    degrade = {"datasets": ds, "digests": digests,
               "sources": {"policy": "degrade", "min_sources": 9}}
    all_but_3 = sorted(d["sha256"] for d in ds if d["name"] != "s03")
    named = {"excluded": {"s03": "sha256 mismatch"}}
    assert manifest.inputs_mismatch(degrade, all_but_3, named) is None
    assert manifest.inputs_mismatch(degrade, digests, None) is None
    # fewer inputs without naming the source left out: a silent shrink
    assert "inputs: the step consumed" in (manifest.inputs_mismatch(degrade, all_but_3, None)
                                           or "")
    # named but still counted as consumed
    assert manifest.inputs_mismatch(degrade, digests, named) is not None
    assert "without a reason" in (manifest.inputs_mismatch(
        degrade, all_but_3, {"excluded": {"s03": ""}}) or "")
    assert "not datasets of the step" in (manifest.inputs_mismatch(
        degrade, digests, {"excluded": {"zz": "gone"}}) or "")
    two = {"excluded": {"s03": "x", "s04": "y"}}
    assert "fewer than min_sources 9" in (manifest.inputs_mismatch(degrade, sorted(
        d["sha256"] for d in ds if d["name"] not in ("s03", "s04")), two) or "")
    fail = {**degrade, "sources": {"policy": "fail", "min_sources": None}}
    assert "not degrade" in (manifest.inputs_mismatch(fail, all_but_3, named) or "")
    assert "fail (none declared)" in (manifest.inputs_mismatch(
        {**degrade, "sources": None}, all_but_3, named) or "")


def test_the_control_plane_accepts_a_named_exclusion_and_keeps_it_in_the_manifest() -> None:
    ds = sources(10)
    digests = sorted(d["sha256"] for d in ds)
    given = {"datasets": ds, "digests": digests,
             "sources": {"policy": "degrade", "min_sources": 9}}
    prefix = "artifacts/op/attempt-1/"
    result = {"artifacts_prefix": prefix, "completion_manifest": prefix + "COMPLETE.json",
              "files": {"prepared.txt": {"sha256": "a" * 64, "size": 3}},
              "inputs": sorted(d["sha256"] for d in ds if d["name"] != "s03"),
              "sources": {"policy": "degrade", "excluded": {"s03": "object missing: x"}}}
    doc = manifest.validate(result, operation_id="op", attempt=1, expected_inputs=digests,
                            given_inputs=given)
    assert manifest.excluded_sources(doc) == {"s03": "object missing: x"}
    with pytest.raises(manifest.ManifestInvalid, match="inputs: the step consumed"):
        manifest.validate({**result, "sources": None}, operation_id="op", attempt=1,
                          expected_inputs=digests, given_inputs=given)
