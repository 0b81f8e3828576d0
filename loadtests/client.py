"""Client behaviour that needs no Locust: retry decisions, backoff, artifact locations.

Kept apart from the locustfile so it is unit-tested in the pytest process (which must never
import locust).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any
from urllib.parse import quote

from loadtests.scenario import SubmitRetry


class SubmitOutcome(str, Enum):
    ACKED = "acked"            # 201 or 200 (duplicate of the same key): in the ledger
    ABANDONED = "abandoned"    # retries exhausted (attempts or deadline) without an ack
    REJECTED = "rejected"      # a 4xx that retrying cannot fix (401/403/409/422 ...)
    INTERRUPTED = "interrupted"  # the load run stopped while this submission was in flight


def is_ack(status: int) -> bool:
    return status in (200, 201)


def is_retryable(status: int) -> bool:
    """Transport error (0), timeout, 5xx and 429 may succeed later *with the same key*."""
    return status == 0 or status >= 500 or status in (408, 429)


@dataclass
class Backoff:
    """Exponential backoff with full jitter, bounded by attempts and by a deadline."""

    policy: SubmitRetry
    started: float = field(default_factory=time.monotonic)
    attempts: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def next_delay(self) -> float | None:
        """Seconds to sleep before the next attempt, or None when the budget is spent."""
        self.attempts += 1
        if self.attempts >= self.policy.max_attempts:
            return None
        cap = min(self.policy.max_backoff_s, self.policy.base_s * 2 ** (self.attempts - 1))
        delay = self.rng.uniform(cap / 2, cap)
        remaining = self.policy.deadline - (time.monotonic() - self.started)
        if remaining <= delay:
            return None
        return delay


@dataclass(frozen=True)
class ArtifactRef:
    url: str
    bucket: str
    key: str
    file: str
    sha256: str | None


def _parse_s3_uri(uri: str) -> tuple[str, str] | None:
    if not uri.startswith("s3://"):
        return None
    bucket, _, key = uri[5:].partition("/")
    return (bucket, key) if bucket and key else None


def artifact_refs(result: dict[str, Any] | None, s3_endpoint: str) -> list[ArtifactRef]:
    """Downloadable artifacts of a succeeded operation, as path-style URLs on the endpoint.

    Understands our control plane's result (`bucket` + `artifacts_prefix` + `files` with
    sha256) and any top-level ``s3://bucket/key`` string value (other adapters)."""
    if not isinstance(result, dict):
        return []
    base = s3_endpoint.rstrip("/")
    found: dict[tuple[str, str], str | None] = {}
    bucket, prefix, files = result.get("bucket"), result.get("artifacts_prefix"), result.get("files")
    if isinstance(bucket, str) and isinstance(prefix, str) and isinstance(files, dict):
        for name, meta in files.items():
            sha = meta.get("sha256") if isinstance(meta, dict) else None
            found[(bucket, prefix + name)] = sha if isinstance(sha, str) else None
    for value in result.values():
        parsed = _parse_s3_uri(value) if isinstance(value, str) else None
        if parsed and not parsed[1].endswith("/"):
            found.setdefault(parsed, None)
    return [ArtifactRef(url=f"{base}/{quote(b)}/{quote(k)}", bucket=b, key=k,
                        file=k.rsplit("/", 1)[-1], sha256=sha)
            for (b, k), sha in sorted(found.items())]
