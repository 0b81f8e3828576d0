"""A step's cache identity: what must be equal for a stored result to be reused.

The key covers, and only covers:

* the content digests (sha256) of every input the step consumes: its declared datasets and the
  files of its upstream steps' completion manifests. Names and paths are left out on purpose:
  the same dataset name with different bytes is a different key, the same bytes under another
  attempt's prefix are the same key;
* the digest of its code: the image digest (``name@sha256:...``) and an optional code digest;
* its parameters (workload kind and params);
* its execution environment (cpu, accelerator, workload class, declared environment).

An image given by tag only has no digest to key on: such a step is not cacheable
(:class:`NotCacheable`), rather than keyed on a tag that may move.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

VERSION = 1
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_PINNED = re.compile(r"@sha256:(?P<d>[0-9a-f]{64})$")


class NotCacheable(ValueError):
    """The step's identity cannot be established (the reason says why)."""


@dataclass(frozen=True)
class CacheKey:
    key: str  # "sha256:<hex>"
    components: dict[str, Any]  # what went into it (recorded with every hit and miss)


def image_digest(image: str) -> str:
    m = _PINNED.search(image)
    if m is None:
        raise NotCacheable(f"image {image!r} is not pinned by digest (name@sha256:...)")
    return m["d"]


def compute(*, input_digests: Iterable[str], image: str, code_digest: str | None,
            kind: str, params: Mapping[str, Any], environment: Mapping[str, Any]) -> CacheKey:
    digests = sorted(set(input_digests))
    for d in digests:
        if not _DIGEST.match(d):
            raise NotCacheable(f"input digest {d!r} is not a sha256 hex digest")
    components = {
        "version": VERSION,
        "inputs": digests,
        "code": {"image": image_digest(image), "code_digest": code_digest},
        "params": {"kind": kind, "params": dict(params)},
        "environment": dict(environment),
    }
    canonical = json.dumps(components, sort_keys=True, separators=(",", ":"))
    return CacheKey("sha256:" + hashlib.sha256(canonical.encode()).hexdigest(), components)
