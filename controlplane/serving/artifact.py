"""The served model's artifact: a small deterministic linear model kept as JSON, its golden set,
and where both live in the object store. Pure: bytes in, a model or a named error out.

Layout in the artifact bucket (docs/serving.md)::

    models/<name>/<version>/model.json     the model (weights, bias, behaviour)
    models/<name>/<version>/golden.json    inputs and the outputs the model must give

A deploy names the version *and* the sha256 of its ``model.json``; a server loads a model only
when the bytes it read have that digest, so a torn or substituted object is never served.

``behaviour`` is part of the artifact on purpose: a "bad" version is a real artifact that
errors on a share of requests or answers late, deployed like any other, not a switch in the
server. Garbage predictions need no field: they are just other weights.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

SCHEMA = "gameday.linear-model/v1"
# golden answers must match to this absolute difference (floats through JSON and numpy)
GOLDEN_TOLERANCE = 1e-6


class ArtifactError(ValueError):
    """A model or golden-set document that cannot be used; the message names the field."""


@dataclass(frozen=True)
class Behaviour:
    """How a version misbehaves, if it does: a share of requests failing, a delay per request."""

    error_ratio: float = 0.0
    delay_ms: float = 0.0


@dataclass(frozen=True)
class LinearModel:
    name: str
    version: str
    weights: tuple[float, ...]
    bias: float
    behaviour: Behaviour = field(default_factory=Behaviour)

    @property
    def features(self) -> int:
        return len(self.weights)

    def predict(self, rows: list[list[float]]) -> list[float]:
        """One output per row: ``bias + weights . row``; a row of the wrong width is refused."""
        out = []
        for i, row in enumerate(rows):
            if len(row) != self.features:
                raise ArtifactError(f"input row {i} has {len(row)} values, model "
                                    f"{self.name}:{self.version} takes {self.features}")
            out.append(self.bias + sum(w * x for w, x in zip(self.weights, row)))
        return out


@dataclass(frozen=True)
class GoldenSet:
    inputs: tuple[tuple[float, ...], ...]
    expected: tuple[float, ...]


# the tensors of the Open Inference Protocol v2 request and answer, as the server names them:
# one place for the server, the load users, the rollout's probes and the cluster's golden check
INPUT_TENSOR, OUTPUT_TENSOR = "input-0", "output-0"


def infer_request(row: list[float]) -> dict[str, Any]:
    """The v2 ``infer`` body for one row of features."""
    return {"inputs": [{"name": INPUT_TENSOR, "shape": [1, len(row)], "datatype": "FP64",
                        "data": row}]}


def model_key(name: str, version: str) -> str:
    return f"models/{name}/{version}/model.json"


def golden_key(name: str, version: str) -> str:
    return f"models/{name}/{version}/golden.json"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def encode_model(model: LinearModel) -> bytes:
    return json.dumps({
        "schema": SCHEMA, "name": model.name, "version": model.version,
        "weights": list(model.weights), "bias": model.bias,
        "behaviour": {"error_ratio": model.behaviour.error_ratio,
                      "delay_ms": model.behaviour.delay_ms},
    }, sort_keys=True).encode()


def encode_golden(golden: GoldenSet) -> bytes:
    return json.dumps({"inputs": [list(r) for r in golden.inputs],
                       "expected": list(golden.expected)}, sort_keys=True).encode()


def golden_for(model: LinearModel, inputs: list[list[float]]) -> GoldenSet:
    """The golden set of a model known to be right: its own answers on ``inputs``."""
    return GoldenSet(tuple(tuple(r) for r in inputs), tuple(model.predict(inputs)))


def _number(doc: dict[str, Any], key: str, where: str) -> float:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ArtifactError(f"{where}: field {key!r} must be a finite number, got {value!r}")
    return float(value)


def decode_model(data: bytes, expected_sha256: str, where: str) -> LinearModel:
    """The model in ``data`` (read from ``where``), only if its digest is ``expected_sha256``."""
    got = sha256(data)
    if got != expected_sha256:
        raise ArtifactError(f"{where}: sha256 {got} is not the deployed {expected_sha256} "
                            f"({len(data)} bytes read): torn or substituted, not loaded")
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise ArtifactError(f"{where}: not JSON ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ArtifactError(f"{where}: field 'schema' must be {SCHEMA!r}")
    weights = doc.get("weights")
    if not isinstance(weights, list) or not weights:
        raise ArtifactError(f"{where}: field 'weights' must be a non-empty list of numbers")
    ws = tuple(_number({"weights": w}, "weights", where) for w in weights)
    raw_behaviour = doc.get("behaviour") or {}
    if not isinstance(raw_behaviour, dict):
        raise ArtifactError(f"{where}: field 'behaviour' must be an object")
    behaviour = Behaviour(
        error_ratio=_number({"error_ratio": raw_behaviour.get("error_ratio", 0.0)}, "error_ratio",
                            f"{where} behaviour"),
        delay_ms=_number({"delay_ms": raw_behaviour.get("delay_ms", 0.0)}, "delay_ms",
                         f"{where} behaviour"))
    if not 0.0 <= behaviour.error_ratio <= 1.0:
        raise ArtifactError(f"{where}: behaviour.error_ratio must be within 0..1")
    if behaviour.delay_ms < 0:
        raise ArtifactError(f"{where}: behaviour.delay_ms must not be negative")
    for key in ("name", "version"):
        if not isinstance(doc.get(key), str) or not doc[key]:
            raise ArtifactError(f"{where}: field {key!r} must be a non-empty string")
    return LinearModel(doc["name"], doc["version"], ws, _number(doc, "bias", where), behaviour)


def decode_golden(data: bytes, where: str) -> GoldenSet:
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise ArtifactError(f"{where}: not JSON ({exc})") from exc
    inputs, expected = (doc.get("inputs"), doc.get("expected")) if isinstance(doc, dict) else (None, None)
    if not isinstance(inputs, list) or not isinstance(expected, list) or len(inputs) != len(expected):
        raise ArtifactError(f"{where}: fields 'inputs' and 'expected' must be lists of equal length")
    for i, (row, want) in enumerate(zip(inputs, expected, strict=True)):
        if not isinstance(row, list) or not row or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in [*row, want]):
            raise ArtifactError(f"{where}: inputs[{i}] must be a list of numbers and "
                                f"expected[{i}] a number")
    return GoldenSet(tuple(tuple(float(x) for x in row) for row in inputs),
                     tuple(float(y) for y in expected))


def golden_correct(golden: GoldenSet, row: list[float], output: float) -> bool | None:
    """Whether ``output`` is the golden answer for ``row``; None when ``row`` is not golden."""
    for inputs, expected in zip(golden.inputs, golden.expected):
        if list(inputs) == list(row):
            return abs(output - expected) <= GOLDEN_TOLERANCE
    return None
