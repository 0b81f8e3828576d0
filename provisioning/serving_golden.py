"""The canary's prediction-quality check: a golden set sent to the canary model server.

Run by Argo Rollouts as the ``golden-set`` analysis Job (provisioning/components/serving.py) in the
control-plane image: ``python -m provisioning.serving_golden --url http://<canary svc>:<port>
--model M --version V --golden s3://<bucket>/models/M/V/golden.json``. Exit 0 when the share
of cases answered as expected reaches ``--min-agreement``, 1 when it does not (the rollout
is aborted and rolled back), 2 when the check could not judge (no golden set, unreadable):
"no data" is never a pass.

The golden set is the model's own (``models/<name>/<version>/golden.json``, the serving side's
format, docs/serving.md): ``{"inputs": [[<feature>, ...], ...], "expected": [<output>, ...]}``.
Each row goes to ``POST /v2/models/<name>/infer`` as the tensor ``input-0`` (FP64, shape
``[1, features]``); it agrees when the server answers 200, names the version under test
(``model_version``) and its ``output-0`` is the expected value within ``--tolerance``.
Standard library only, plus boto3 for ``s3://`` (both in the control-plane image).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controlplane.serving.artifact import (
    OUTPUT_TENSOR,
    ArtifactError,
    decode_golden,
    infer_request,
)

EXIT_PASS, EXIT_FAIL, EXIT_UNJUDGED = 0, 1, 2


class GoldenSetError(Exception):
    """The golden set cannot be read or is malformed (names the source and the field)."""


@dataclass(frozen=True)
class Verdict:
    agreed: int
    total: int
    problems: tuple[str, ...]

    @property
    def agreement(self) -> float:
        return self.agreed / self.total if self.total else 0.0


def _flat(data: Any) -> list[Any]:
    if isinstance(data, list):
        return [x for item in data for x in _flat(item)]
    return [data]


def same_data(got: Any, want: Any, tolerance: float) -> bool:
    """Element-wise equality of (nested) tensor data; numbers within ``tolerance``."""
    a, b = _flat(got), _flat(want)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y))
        if numbers:
            if not (math.isfinite(x) and math.isclose(x, y, rel_tol=0.0, abs_tol=tolerance)):
                return False
        elif x != y:
            return False
    return True


def judge_case(index: int, case: Mapping[str, Any], status: int, body: Any, version: str,
               tolerance: float) -> str | None:
    """None when the answer agrees, else why not. Pure: the HTTP exchange is done by the caller."""
    if status != 200:
        return f"case {index}: HTTP {status}"
    if not isinstance(body, Mapping):
        return f"case {index}: the answer is not a JSON object"
    if str(body.get("model_version")) != version:
        return f"case {index}: answered by version {body.get('model_version')!r}, not {version!r}"
    outputs = {o.get("name"): o.get("data") for o in body.get("outputs") or []
               if isinstance(o, Mapping)}
    for name, want in case["outputs"].items():
        if name not in outputs:
            return f"case {index}: no output {name!r} (got {sorted(map(str, outputs))})"
        if not same_data(outputs[name], want, tolerance):
            return f"case {index}: output {name!r} is {outputs[name]!r}, expected {want!r}"
    return None


# The serving side's tensors and tolerance (controlplane/serving: one input row, one output).
TOLERANCE = 1e-6


def parse_golden(raw: bytes, source: str) -> list[dict[str, Any]]:
    """The golden set as cases: v2 ``inputs`` and the expected ``outputs`` by tensor name. Read
    as the model server reads it (controlplane/serving/artifact.py), so both refuse alike."""
    try:
        golden = decode_golden(raw, source)
    except ArtifactError as exc:
        raise GoldenSetError(str(exc)) from None
    if not golden.inputs:
        raise GoldenSetError(f"{source}: the golden set is empty")
    return [{**infer_request(list(row)), "outputs": {OUTPUT_TENSOR: [want]}}
            for row, want in zip(golden.inputs, golden.expected, strict=True)]


def read_golden(source: str) -> bytes:
    """``s3://bucket/key`` (boto3, the pod's IRSA role) or a local path."""
    if source.startswith("s3://"):
        import boto3
        import botocore.exceptions

        bucket, _, key = source.removeprefix("s3://").partition("/")
        try:
            return boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise GoldenSetError(f"{source}: cannot read the golden set ({exc})") from None
    try:
        with open(source, "rb") as f:
            return f.read()
    except OSError as exc:
        raise GoldenSetError(f"{source}: cannot read the golden set ({exc})") from None


def infer(url: str, model: str, inputs: Sequence[Any], timeout: float) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{url.rstrip('/')}/v2/models/{model}/infer", method="POST",
        data=json.dumps({"inputs": list(inputs)}).encode(),
        headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (OSError, ValueError) as exc:  # refused, reset, timed out, not JSON
        return 0, str(exc)


def check(url: str, model: str, version: str, cases: Sequence[Mapping[str, Any]],
          tolerance: float, timeout: float = 10.0) -> Verdict:
    problems = []
    for i, case in enumerate(cases):
        status, body = infer(url, model, case["inputs"], timeout)
        why = judge_case(i, case, status, body, version, tolerance)
        if status == 0:
            why = f"case {i}: no answer ({body})"
        if why:
            problems.append(why)
    return Verdict(len(cases) - len(problems), len(cases), tuple(problems))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m provisioning.serving_golden")
    parser.add_argument("--url", required=True, help="the canary model server's base URL")
    parser.add_argument("--model", required=True)
    parser.add_argument("--version", required=True, help="the version the canary must answer with")
    parser.add_argument("--golden", required=True, help="s3://bucket/key or a path")
    parser.add_argument("--min-agreement", type=float, default=1.0)
    parser.add_argument("--tolerance", type=float, default=TOLERANCE)
    parser.add_argument("--timeout", type=float, default=10.0)
    args = parser.parse_args(argv)
    try:
        cases = parse_golden(read_golden(args.golden), args.golden)
    except GoldenSetError as exc:
        print(f"golden-set: cannot judge: {exc}", file=sys.stderr)
        return EXIT_UNJUDGED
    verdict = check(args.url, args.model, args.version, cases, args.tolerance, args.timeout)
    for problem in verdict.problems:
        print(f"golden-set: {problem}", file=sys.stderr)
    ok = verdict.agreement >= args.min_agreement
    print(f"golden-set: {verdict.agreed}/{verdict.total} agree "
          f"({verdict.agreement:.3f}, minimum {args.min_agreement}): {'pass' if ok else 'FAIL'}")
    return EXIT_PASS if ok else EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
