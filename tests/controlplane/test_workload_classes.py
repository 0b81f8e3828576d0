"""Workload classes at the API edge (controlplane/models.py + workload_classes.py) and in the
Jobs the Kubernetes runtime builds: defaults, overridable fields only, spot only when the class
checkpoints. Pure: no server (the HTTP answer is in test_api.py)."""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
import pytest
from pydantic import ValidationError

from controlplane.models import OperationSpec
from controlplane.runtimes.base import LaunchSpec
from controlplane.runtimes.kubernetes import build_job, class_pod_template, pool_options
from controlplane.store.submissions import payload_hash
from controlplane.workload_classes import ALWAYS_ALLOWED, CLASSES

IMAGE = "127.0.0.1:5000/ml/trainer:1.0"
# Every field of an OperationSpec a submitter can set, with a valid value.
SETTABLE: dict[str, dict[str, Any]] = {
    "queue": {"queue": "default"},
    "priority": {"priority": 1},
    "max_retries": {"max_retries": 1},
    "timeout_seconds": {"timeout_seconds": 60},
    "resources.cpu": {"resources": {"cpu": 2}},
    "resources.accelerator": {"resources": {"accelerator": {"type": "sim-a100", "count": 1}}},
    "placement.regions": {"placement": {"regions": ["region-1"]}},
    "placement.dataset": {"placement": {"dataset": "imagenet-mini"}},
}


def _spec(cls: str | None = None, **extra: Any) -> OperationSpec:
    body: dict[str, Any] = {"name": "x", "workload": {"image": IMAGE}, **extra}
    if cls:
        body["workload_class"] = cls
    return OperationSpec.model_validate(body)


def test_a_class_fills_every_field_not_set_and_keeps_what_was() -> None:
    s = _spec("distributed-training", resources={"cpu": 8})
    assert (s.queue, s.priority, s.max_retries) == ("gpu", 10, 3)
    assert s.resources.cpu == 8  # overridden
    assert s.resources.accelerator is not None and s.resources.accelerator.count == 1
    assert s.timeout_seconds == 3 * 24 * 3600


@pytest.mark.parametrize("cls", sorted(CLASSES))
def test_every_field_a_class_does_not_list_is_refused_naming_it(cls: str) -> None:
    wc = CLASSES[cls]
    refused = [f for f in SETTABLE if f not in wc.overridable | ALWAYS_ALLOWED]
    assert refused, f"{cls} allows everything: the test would check nothing"
    for field in refused:
        with pytest.raises(ValidationError,
                           match=re.escape(field) + r"(\.\w+)?: not overridable for workload_class"):
            _spec(cls, **SETTABLE[field])
    for field in wc.overridable & set(SETTABLE):
        _spec(cls, **SETTABLE[field])  # accepted


def test_interruptible_capacity_only_for_checkpointable_classes() -> None:
    for wc in CLASSES.values():
        if "placement.interruptible" not in wc.overridable:
            with pytest.raises(ValidationError, match="placement.interruptible"):
                _spec(wc.name, placement={"interruptible": True})
    with pytest.raises(ValidationError, match="not checkpointable|not overridable"):
        _spec("online-inference", placement={"interruptible": True})
    with pytest.raises(ValidationError, match="no workload_class vouches"):
        _spec(None, placement={"interruptible": True})
    assert _spec("distributed-training", placement={"interruptible": True}).placement.interruptible
    assert all(wc.checkpointable for wc in CLASSES.values()
               if "placement.interruptible" in wc.overridable)


def test_an_unknown_class_is_refused_naming_the_known_ones() -> None:
    # an enumeration in the schema since issue 46: pydantic's message lists the classes
    with pytest.raises(ValidationError, match="workload_class") as info:
        _spec("gpu-party")
    assert all(repr(name) in str(info.value) for name in CLASSES)


def test_a_request_without_class_hashes_as_before_the_fields_existed() -> None:
    # The idempotency hash of the same request must not change across the upgrade that added
    # workload_class and placement.interruptible (a retry spanning it would get a 409).
    before = {"name": "x", "queue": "default", "priority": 0,
              "workload": {"kind": "train", "image": IMAGE, "params": {}},
              "resources": {"cpu": 1, "accelerator": None},
              "placement": {"regions": None, "dataset": None},
              "max_retries": 3, "timeout_seconds": 3600, "labels": {}}
    assert payload_hash(_spec().document()) == payload_hash(before)


def _launch(cls: str | None, interruptible: bool) -> dict[str, Any]:
    job = build_job(LaunchSpec(operation_id="op", attempt_id="att", attempt_number=1,
                               project="p", kind="sleep", image="reg/x@sha256:" + "a" * 64,
                               params={}, workload_class=cls, interruptible=interruptible),
                    pool_options("cpu"))
    return job["spec"]["template"]["spec"]


def _capacity(pod: dict[str, Any]) -> list[str]:
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]


def test_jobs_go_to_spot_only_for_an_interruptible_checkpointable_class() -> None:
    assert _capacity(_launch(None, False)) == ["on-demand"]
    # the API refuses these; the runtime still places them on on-demand capacity
    assert _capacity(_launch(None, True)) == ["on-demand"]
    assert _capacity(_launch("online-inference", True)) == ["on-demand"]
    assert _capacity(_launch("distributed-training", False)) == ["on-demand"]
    assert _capacity(_launch("distributed-training", True)) == ["spot", "on-demand"]
    pod = _launch("interactive-notebook", False)
    assert pod["serviceAccountName"] == "wc-interactive-notebook"
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is False


@pytest.mark.parametrize("cls", sorted(CLASSES))
def test_class_templates_are_valid_pod_templates(cls: str) -> None:
    wc = CLASSES[cls]
    template = class_pod_template(wc, pool_options(wc.pool, "team-a", wc.service_account),
                                  "reg/x@sha256:" + "a" * 64)
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate",
                                  "metadata": {"name": f"workload-class-{cls}"},
                                  "template": template}, "1.33.0", strict=True)
    assert template["spec"]["serviceAccountName"] == wc.service_account
    assert template["metadata"]["annotations"]["gameday.io/checkpointable"] == (
        str(wc.checkpointable).lower())
