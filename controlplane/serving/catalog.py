"""The reference deployment's model and its versions: the good ones and the bad ones a bad
rollout deploys (each a real artifact), with the golden set every version is judged by.

``publish`` writes a version's ``model.json`` and ``golden.json`` through the caller's ``put``
(an S3 PUT) and returns the digest a deploy must name.
"""

from __future__ import annotations

from collections.abc import Callable

from controlplane.serving.artifact import (
    Behaviour,
    LinearModel,
    encode_golden,
    encode_model,
    golden_for,
    golden_key,
    model_key,
    sha256,
)

MODEL_NAME = "fraud-score"
# a few rows spread over the input space; any wrong weight moves at least one answer
GOLDEN_INPUTS = [[0.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0], [-1.5, 0.5, 2.0, -0.25],
                 [10.0, -3.0, 0.75, 6.0], [0.1, 0.2, 0.3, 0.4]]
_WEIGHTS = (0.5, -1.25, 2.0, 0.75)
_BIAS = 0.125

GOOD = "v1"
VERSIONS: dict[str, LinearModel] = {
    # v1 and v2 give the same answers: a healthy rollout changes the artifact, not the truth
    "v1": LinearModel(MODEL_NAME, "v1", _WEIGHTS, _BIAS),
    "v2": LinearModel(MODEL_NAME, "v2", _WEIGHTS, _BIAS),
    # bad versions (bad-model-rollout): errors, latency, garbage
    "v2-errors": LinearModel(MODEL_NAME, "v2-errors", _WEIGHTS, _BIAS,
                             Behaviour(error_ratio=0.5)),
    "v2-slow": LinearModel(MODEL_NAME, "v2-slow", _WEIGHTS, _BIAS, Behaviour(delay_ms=400.0)),
    "v2-garbage": LinearModel(MODEL_NAME, "v2-garbage", (-0.5, 1.25, -2.0, 0.75), 3.0),
}
GOLDEN = golden_for(VERSIONS[GOOD], GOLDEN_INPUTS)


def publish(put: Callable[[str, bytes], None], version: str) -> str:
    """Write ``version``'s model and the golden set; the golden set first, the model last, so
    a reader that finds the model finds its golden set too. Returns the model's sha256."""
    model = VERSIONS[version]
    put(golden_key(model.name, version), encode_golden(GOLDEN))
    data = encode_model(model)
    put(model_key(model.name, version), data)
    return sha256(data)
