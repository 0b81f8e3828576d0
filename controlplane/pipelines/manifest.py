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
             expected_inputs: list[str]) -> dict[str, Any]:
    """The step's manifest document (what downstream steps receive), or ManifestInvalid."""
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
    if not isinstance(inputs, list) or sorted(inputs) != sorted(expected_inputs):
        raise ManifestInvalid(f"inputs: the step consumed {inputs!r}, it was given "
                              f"{sorted(expected_inputs)!r}")
    checks = result.get("checks") or {}
    if not isinstance(checks, dict) or not all(
            isinstance(c, dict) and isinstance(c.get("passed"), bool) for c in checks.values()):
        raise ManifestInvalid("checks: each check must be an object with a boolean 'passed'")
    return {"artifacts_prefix": prefix, "completion_manifest": prefix + storage.ARTIFACT_MANIFEST,
            "files": {n: {"sha256": m["sha256"], "size": m["size"]} for n, m in files.items()},
            "inputs": sorted(inputs), "checks": checks}


def file_digests(manifest: dict[str, Any]) -> list[str]:
    return sorted({m["sha256"] for m in manifest["files"].values()})


def failed_checks(manifest: dict[str, Any]) -> list[str]:
    return sorted(n for n, c in (manifest.get("checks") or {}).items() if not c.get("passed"))
