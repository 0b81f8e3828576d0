"""The served model's artifact (controlplane/serving/artifact.py, catalog.py): pure."""

from __future__ import annotations

import json

import pytest

from controlplane.serving.artifact import (
    ArtifactError,
    decode_golden,
    decode_model,
    encode_golden,
    encode_model,
    golden_correct,
    sha256,
)
from controlplane.serving.catalog import GOLDEN, GOLDEN_INPUTS, VERSIONS


def test_a_model_loads_only_with_the_deployed_digest() -> None:
    data = encode_model(VERSIONS["v1"])
    assert decode_model(data, sha256(data), "s3://b/k") == VERSIONS["v1"]
    torn = data[: len(data) // 2]
    with pytest.raises(ArtifactError, match=r"s3://b/k: sha256 [0-9a-f]{64} is not the deployed"):
        decode_model(torn, sha256(data), "s3://b/k")


@pytest.mark.parametrize(("field", "value", "message"), [
    ("weights", [], "field 'weights' must be a non-empty list"),
    ("weights", [1.0, "x"], "field 'weights' must be a finite number"),
    ("bias", None, "field 'bias' must be a finite number"),
    ("behaviour", {"error_ratio": 2.0}, "behaviour.error_ratio must be within 0..1"),
    ("behaviour", {"delay_ms": -1}, "behaviour.delay_ms must not be negative"),
    ("version", "", "field 'version' must be a non-empty string"),
])
def test_a_bad_model_document_is_refused_naming_its_field(field: str, value: object,
                                                          message: str) -> None:
    doc = json.loads(encode_model(VERSIONS["v1"]))
    doc[field] = value
    data = json.dumps(doc).encode()
    with pytest.raises(ArtifactError, match=message) as info:
        decode_model(data, sha256(data), "models/fraud-score/v1/model.json")
    assert str(info.value).startswith("models/fraud-score/v1/model.json")


def test_the_golden_set_tells_good_versions_from_garbage() -> None:
    golden = decode_golden(encode_golden(GOLDEN), "golden.json")
    for version, expect_correct in (("v1", True), ("v2", True), ("v2-errors", True),
                                    ("v2-slow", True), ("v2-garbage", False)):
        outputs = VERSIONS[version].predict(GOLDEN_INPUTS)
        verdicts = [golden_correct(golden, row, y) for row, y in zip(GOLDEN_INPUTS, outputs)]
        assert all(verdicts) is expect_correct, version
    assert golden_correct(golden, [9.0, 9.0, 9.0, 9.0], 1.0) is None  # not a golden row


def test_a_row_of_the_wrong_width_is_refused() -> None:
    with pytest.raises(ArtifactError, match="input row 0 has 3 values, model fraud-score:v1 takes 4"):
        VERSIONS["v1"].predict([[1.0, 2.0, 3.0]])
