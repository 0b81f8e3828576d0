"""The sample workload's pipeline steps (docs/CONTRACTS.md, "Pipelines"): prepare, train a
candidate, evaluate. Tiny on purpose (checksum and sleep scale).

A step receives its inputs explicitly (``--pipeline-inputs``: the upstream completion
manifests and datasets the control plane gave it), reads each input file from the prefix named
there, never from a "latest" path, and checks its sha256 before using it. Its own outputs go
under its attempt's prefix with COMPLETE.json last, listing the inputs it consumed by digest
(and, for an evaluation, its checks): what the agent verifies and reports, and what the control
plane accepts before any downstream step starts (controlplane/pipelines/manifest.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from controlplane import storage
from controlplane.workload import data as sources_io
from controlplane.workload import model
from controlplane.workload.events import emit


@dataclass
class Inputs:
    files: dict[str, bytes] = field(default_factory=dict)  # "<step>/<file>" or "dataset:<name>"
    digests: list[str] = field(default_factory=list)
    # the datasets read at start (controlplane/workload/data.py accounting); {} without any
    sources: dict[str, Any] = field(default_factory=dict)

    def content_sha256(self) -> str | None:
        """One sha256 over the verified input files (name and bytes, in name order); None
        without any: what a training step's data is drawn from (model.make_dataset)."""
        if not self.files:
            return None
        h = hashlib.sha256()
        for name, blob in sorted(self.files.items()):
            h.update(name.encode() + b"\0" + hashlib.sha256(blob).digest())
        return h.hexdigest()


def read_inputs(store: storage.ObjectStore, doc: dict[str, Any] | None) -> Inputs:
    """Every input of the step, read from where its manifest says and checked by sha256.
    A mismatch is a ValueError (deterministic: the bytes behind a name changed)."""
    out = Inputs()
    if not doc:
        return out
    for up in doc.get("steps", []):
        for name, meta in sorted(up["files"].items()):
            blob = store.get(up["artifacts_prefix"] + name)
            if storage.sha256_hex(blob) != meta["sha256"]:
                raise ValueError(f"input {up['step']}/{name} at {up['artifacts_prefix']}: "
                                 "sha256 differs from its completion manifest")
            out.files[f"{up['step']}/{name}"] = blob
    datasets = doc.get("datasets", [])
    if any(ds.get("uri") for ds in datasets):
        outcome, blobs = sources_io.fetch(store.get, datasets, doc.get("sources"),
                                         bucket=store.bucket)
        out.files.update({f"dataset:{n}": b for n, b in blobs.items()})
        out.sources = sources_io.accounting(outcome)
        for name, why in sorted(outcome.excluded.items()):
            emit("log", f"dataset {name} left out under policy {outcome.policy}: {why}",
                 source_excluded=name, reason=why, policy=outcome.policy)
    # a source left out under a degrade policy is not consumed: its digest is not an input
    excluded = out.sources.get("excluded", {})
    left_out = ({d["sha256"] for d in datasets if d["name"] in excluded}
                - {d["sha256"] for d in datasets if d["name"] not in excluded})
    out.digests = sorted(set(doc.get("digests", [])) - left_out)
    consumed = {storage.sha256_hex(b) for b in out.files.values()}
    missing = set(out.digests) - consumed - {d["sha256"] for d in datasets}
    if missing:
        raise ValueError(f"inputs {sorted(missing)} were given but could not be read")
    emit("log", f"{len(out.files)} input files verified by sha256", inputs=out.digests)
    return out


def finish(store: storage.ObjectStore, operation_id: str, attempt: int,
           files: dict[str, bytes], inputs: Inputs, metrics: dict[str, Any],
           checks: dict[str, Any] | None = None) -> dict[str, Any]:
    """Outputs, then COMPLETE.json last (with the inputs consumed and the checks)."""
    weights = files.get("model.npy", model.npy_bytes(np.zeros(0)))
    all_files = {**files, "model.npy": weights,
                 "metrics.json": json.dumps(metrics, sort_keys=True).encode()}
    extra: dict[str, Any] = {"operation_id": operation_id, "attempt": attempt,
                             "steps": metrics.get("steps", 0), "inputs": inputs.digests}
    if checks is not None:
        extra["checks"] = checks
    if inputs.sources:
        extra["sources"] = inputs.sources
    manifest = storage.write_artifacts(store, operation_id, attempt, all_files, extra=extra)
    prefix = storage.artifact_prefix(operation_id, attempt)
    emit("artifact_written", f"artifacts at {prefix}", prefix=prefix,
         files=sorted(manifest["files"]), weights_sha256=storage.sha256_hex(weights))
    return manifest


def prepare(store: storage.ObjectStore, operation_id: str, attempt: int, inputs: Inputs,
            seconds: float) -> None:
    """Sorted, de-duplicated lines of every dataset: output bytes follow input bytes."""
    time.sleep(max(0.0, seconds))
    lines = sorted({line for name, data in inputs.files.items() if name.startswith("dataset:")
                    for line in data.decode(errors="replace").splitlines()})
    prepared = ("\n".join(lines) + "\n").encode()
    finish(store, operation_id, attempt, {"prepared.txt": prepared}, inputs,
           {"rows": len(lines), "steps": 1})


def evaluate(store: storage.ObjectStore, operation_id: str, attempt: int, inputs: Inputs,
             seconds: float, min_candidates: int = 0) -> None:
    """Score every candidate model it was given; checks say whether there was one to release
    (and, with ``min_candidates``, whether enough candidates were compared)."""
    time.sleep(max(0.0, seconds))
    scores: dict[str, float] = {}
    for name, data in sorted(inputs.files.items()):
        if name.endswith("/model.npy"):
            weights = np.load(io.BytesIO(data), allow_pickle=False)
            scores[name.split("/")[0]] = float(np.linalg.norm(weights)) if weights.size else 0.0
    best = min(scores, key=lambda k: scores[k]) if scores else None
    checks = {"candidates_scored": {"passed": bool(scores), "value": len(scores)},
              "scores_finite": {"passed": all(np.isfinite(v) for v in scores.values())}}
    if min_candidates > 0:
        checks["enough_candidates"] = {"passed": len(scores) >= min_candidates,
                                       "value": len(scores), "minimum": min_candidates}
    finish(store, operation_id, attempt,
           {"evaluation.json": json.dumps({"scores": scores, "best": best},
                                          sort_keys=True).encode()},
           inputs, {"candidates": len(scores), "best": best, "steps": 1}, checks)
