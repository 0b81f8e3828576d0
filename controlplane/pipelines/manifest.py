"""A step's completion manifest, as the control plane accepts it from a succeeded step.

The workload writes its outputs under the attempt's own prefix and COMPLETE.json last
(controlplane/storage.py); the agent reads it back, verifies every checksum and reports it as
the attempt's result (controlplane/agent/attempt.py). Before a downstream step may start from
it, the control plane checks here that the result *is* such a manifest: the attempt-specific
prefix of the attempt that succeeded, files with sizes and sha256, and exactly the inputs the
step was given, by digest. Anything else fails the step: a downstream step never starts from a
"latest" path or from outputs nobody validated.
"""

from __future__ import annotations

import re
from typing import Any

from controlplane import storage

_SHA = re.compile(r"^[0-9a-f]{64}$")


class ManifestInvalid(ValueError):
    pass


def validate(result: Any, *, operation_id: str, attempt: int,
             expected_inputs: list[str], given_inputs: dict[str, Any] | None = None,
             ) -> dict[str, Any]:
    """The step's manifest document (what downstream steps receive), or ManifestInvalid.
    ``given_inputs``: the step's inputs document (its datasets and source policy), which a
    result leaving sources out is checked against."""
    if not isinstance(result, dict):
        raise ManifestInvalid("the step reported no result")
    prefix = storage.artifact_prefix(operation_id, attempt)
    if result.get("artifacts_prefix") != prefix:
        raise ManifestInvalid(f"artifacts_prefix {result.get('artifacts_prefix')!r} is not the "
                              f"succeeded attempt's own prefix {prefix!r}")
    if result.get("completion_manifest") != prefix + storage.ARTIFACT_MANIFEST:
        raise ManifestInvalid(f"completion_manifest must be {prefix + storage.ARTIFACT_MANIFEST!r}")
    files = result.get("files")
    if not isinstance(files, dict) or not files:
        raise ManifestInvalid("files: the manifest lists no files")
    for name, meta in files.items():
        if not isinstance(meta, dict) or not _SHA.match(str(meta.get("sha256", ""))):
            raise ManifestInvalid(f"files.{name}: no sha256")
        size = meta.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ManifestInvalid(f"files.{name}: no size")
    inputs = result.get("inputs")
    given = {**(given_inputs or {}), "digests": expected_inputs}
    why = inputs_mismatch(given, inputs, result.get("sources"))
    if why is not None:
        raise ManifestInvalid(why)
    checks = result.get("checks") or {}
    if not isinstance(checks, dict) or not all(
            isinstance(c, dict) and isinstance(c.get("passed"), bool) for c in checks.values()):
        raise ManifestInvalid("checks: each check must be an object with a boolean 'passed'")
    doc = {"artifacts_prefix": prefix, "completion_manifest": prefix + storage.ARTIFACT_MANIFEST,
           "files": {n: {"sha256": m["sha256"], "size": m["size"]} for n, m in files.items()},
           "inputs": sorted(inputs), "checks": checks}
    if isinstance(result.get("sources"), dict):
        doc["sources"] = result["sources"]
    return doc


def given_inputs(spec: dict[str, Any]) -> dict[str, Any] | None:
    """What an operation document (as claimed) gives its workload to consume, by digest: a
    pipeline step's inputs, or a plain operation's declared datasets, read at start under
    policy ``fail`` (docs/CONTRACTS.md, "Data at start"); None when it gives nothing (pure)."""
    if (pipeline := spec.get("pipeline")) is not None:
        return dict(pipeline["inputs"])
    if datasets := spec.get("datasets"):
        return {"steps": [], "datasets": datasets,
                "digests": sorted({d["sha256"] for d in datasets})}
    return None


def excluded_sources(manifest: dict[str, Any] | None) -> dict[str, str]:
    return dict(((manifest or {}).get("sources") or {}).get("excluded") or {})


def inputs_mismatch(given: dict[str, Any], consumed: Any, sources: Any) -> str | None:
    """Why a step's consumed inputs are not what it was given, or None (pure). A step consumes
    every digest it was given, except the datasets it names as left out (``sources.excluded``,
    each with a reason), which only a declared ``degrade`` policy allows, and only while at
    least ``min_sources`` sources were read (controlplane/workload/data.py)."""
    digests = sorted(given.get("digests") or [])
    datasets = {d["name"]: d for d in given.get("datasets") or []}
    policy = given.get("sources") or {}
    excluded = (sources or {}).get("excluded") or {} if isinstance(sources, dict) else {}
    if not isinstance(excluded, dict):
        return "sources.excluded: must map each source left out to its reason"
    if excluded:
        if policy.get("policy") != "degrade":
            return (f"sources.excluded: {sorted(excluded)} left out, but the step's source "
                    f"policy is {policy.get('policy') or 'fail (none declared)'}, not degrade")
        unknown = sorted(set(excluded) - set(datasets))
        if unknown:
            return f"sources.excluded: {unknown} are not datasets of the step"
        blank = sorted(n for n, why in excluded.items() if not (isinstance(why, str) and why))
        if blank:
            return f"sources.excluded: {blank} left out without a reason"
        read = sum(1 for n, d in datasets.items() if d.get("uri") and n not in excluded)
        floor = policy.get("min_sources") or 0
        if read < floor:
            return (f"sources.excluded: {read} sources read, fewer than min_sources {floor} "
                    f"(left out: {sorted(excluded)})")
    left_out = ({d["sha256"] for n, d in datasets.items() if n in excluded}
                - {d["sha256"] for n, d in datasets.items() if n not in excluded})
    expected = sorted(set(digests) - left_out)
    if not isinstance(consumed, list) or sorted(consumed) != expected:
        more = f" less the {len(left_out)} left out" if left_out else ""
        return f"inputs: the step consumed {consumed!r}, it was given {expected!r}{more}"
    return None


def file_digests(manifest: dict[str, Any]) -> list[str]:
    return sorted({m["sha256"] for m in manifest["files"].values()})


def failed_checks(manifest: dict[str, Any]) -> list[str]:
    return sorted(n for n, c in (manifest.get("checks") or {}).items() if not c.get("passed"))
