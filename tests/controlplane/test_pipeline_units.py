"""Pipelines, the pure parts: cache identity, spec validation, partial-failure policy, manifest
acceptance (controlplane/pipelines/)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from controlplane.pipelines import cache_key, manifest, policy
from controlplane.pipelines.spec import PipelineSpec

D1, D2, D3 = "1" * 64, "2" * 64, "3" * 64
PINNED = "127.0.0.1:5000/ml/trainer@sha256:" + "a" * 64


def key(**over: Any) -> cache_key.CacheKey:
    args: dict[str, Any] = {"input_digests": [D1, D2], "image": PINNED, "code_digest": None,
                            "kind": "train", "params": {"steps": 10},
                            "environment": {"resources": {"cpu": 1}}}
    args.update(over)
    return cache_key.compute(**args)


def test_cache_key_changes_with_every_component_that_matters() -> None:
    base = key().key
    assert key(input_digests=[D2, D1]).key == base  # order of inputs does not matter
    assert key(input_digests=[D1, D3]).key != base  # different bytes behind an input
    assert key(image=PINNED.replace("a" * 64, "b" * 64)).key != base
    assert key(code_digest=D3).key != base
    assert key(params={"steps": 11}).key != base
    assert key(kind="sleep").key != base
    assert key(environment={"resources": {"cpu": 2}}).key != base
    assert base.startswith("sha256:") and key().components["inputs"] == [D1, D2]


def test_cache_key_ignores_names_and_paths_and_refuses_unpinned_images() -> None:
    # the same image digest under another name or registry is the same code
    assert key(image="other/name@sha256:" + "a" * 64).key == key().key
    with pytest.raises(cache_key.NotCacheable, match="not pinned by digest"):
        key(image="127.0.0.1:5000/ml/trainer:1.0")
    with pytest.raises(cache_key.NotCacheable, match="not a sha256"):
        key(input_digests=["datasets/churn.csv"])


def step(name: str, **over: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"name": name, "operation": {"workload": {"image": PINNED}}}
    s.update(over)
    return s


def pipeline(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"name": "p", "steps": list(steps)}


@pytest.mark.parametrize(("steps", "message"), [
    ([step("a"), step("a")], "steps[1].name: duplicate step name 'a'"),
    ([step("a", needs=["zz"])], "steps[0].needs: unknown step 'zz'"),
    ([step("a", needs=["b"]), step("b", needs=["c"]), step("c", needs=["a"])],
     "steps.needs: cycle a -> b -> c -> a"),
    ([step("a", needs=["a"])], "needs itself"),
    ([step("a"), step("agg", role="aggregate", needs=["a"])],
     "steps[1].on_upstream_failure: aggregation step 'agg' must declare"),
    ([step("a"), step("b", needs=["a"], on_upstream_failure={"policy": "fail"})],
     "steps[1].on_upstream_failure: only an aggregation step"),
    ([step("a"), step("agg", role="aggregate", needs=["a"],
                      on_upstream_failure={"policy": "accept-subset", "min_successful": 2})],
     "min_successful: 2 > 1 upstream steps"),
])
def test_spec_graph_errors_name_the_field(steps: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ValidationError) as err:
        PipelineSpec.model_validate(pipeline(*steps))
    assert message in str(err.value)


def test_spec_policy_fields_and_defaults() -> None:
    with pytest.raises(ValidationError, match="accept-subset needs min_successful"):
        PipelineSpec.model_validate(pipeline(step("a"), step(
            "g", role="aggregate", needs=["a"], on_upstream_failure={"policy": "accept-subset"})))
    with pytest.raises(ValidationError, match="sha256"):
        PipelineSpec.model_validate(pipeline(step("a", datasets=[{"name": "d", "sha256": "x"}])))
    spec = PipelineSpec.model_validate(pipeline(step("a"), step("r", role="release",
                                                                needs=["a"])))
    assert spec.step("a").cache_enabled and not spec.step("r").cache_enabled
    assert spec.operation_doc(spec.step("a"))["name"] == "p.a"


def test_policy_decisions_name_every_candidate() -> None:
    outcomes = {"t1": (True, ""), "t2": (False, "failed: out of memory"), "t3": (True, "")}
    fail = policy.decide("fail", None, outcomes)
    assert not fail.run and "1 of 3" in fail.reason
    cont = policy.decide("continue-incomplete", None, outcomes)
    assert cont.run and cont.included == ["t1", "t3"]
    assert cont.excluded == {"t2": "failed: out of memory"}
    assert cont.report["candidates"] == ["t1", "t2", "t3"]
    assert policy.decide("accept-subset", 2, outcomes).run
    short = policy.decide("accept-subset", 3, outcomes)
    assert not short.run and "fewer than the minimum 3" in short.reason
    none = {"t1": (False, "x")}
    assert not policy.decide("continue-incomplete", None, none).run
    assert policy.decide("fail", None, {"t1": (True, "")}).run


def result(op: str = "op1", n: int = 2, inputs: list[str] | None = None) -> dict[str, Any]:
    prefix = f"artifacts/{op}/attempt-{n}/"
    return {"artifacts_prefix": prefix, "completion_manifest": prefix + "COMPLETE.json",
            "files": {"model.npy": {"sha256": D1, "size": 10}},
            "inputs": [D2] if inputs is None else inputs,
            "checks": {"accuracy": {"passed": True, "value": 0.9}}}


def test_manifest_accepts_the_attempts_own_prefix_and_its_inputs_only() -> None:
    doc = manifest.validate(result(), operation_id="op1", attempt=2, expected_inputs=[D2])
    assert manifest.file_digests(doc) == [D1] and manifest.failed_checks(doc) == []
    for bad, match in [
        (result(n=1), "not the succeeded attempt's own prefix"),
        ({**result(), "files": {}}, "lists no files"),
        ({**result(), "files": {"m": {"sha256": D1}}}, "files.m: no size"),
        (result(inputs=[D3]), "inputs: the step consumed"),
        ({k: v for k, v in result().items() if k != "inputs"}, "inputs"),
        (None, "no result"),
    ]:
        with pytest.raises(manifest.ManifestInvalid, match=match):
            manifest.validate(bad, operation_id="op1", attempt=2, expected_inputs=[D2])
    failing = {**result(), "checks": {"accuracy": {"passed": False}}}
    assert manifest.failed_checks(manifest.validate(
        failing, operation_id="op1", attempt=2, expected_inputs=[D2])) == ["accuracy"]


def test_the_documented_example_pipeline_is_valid() -> None:
    from pathlib import Path

    import yaml

    path = Path(__file__).parents[2] / "docs" / "examples" / "pipeline.yaml"
    spec = PipelineSpec.model_validate(yaml.safe_load(path.read_text()))
    assert [s.name for s in spec.steps] == ["prepare", "train-a", "train-b", "evaluate",
                                            "register"]
    assert not spec.step("train-b").cache_enabled and not spec.step("register").cache_enabled
