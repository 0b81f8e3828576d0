"""Where a declared dataset lives: a key under ``datasets/`` in the artifact bucket, written
either as the key itself (``datasets/churn/rows.csv``) or as an S3 URI naming the bucket
(``s3://ml-artifacts/datasets/churn/rows.csv``).

One grammar for the two places that read it: the API's validation of a spec (the form, at the
edge; the API is not told the bucket) and the workload at start (the bucket too: it reads from
the artifact bucket only, so an URI naming another bucket is a source it cannot use).
"""

from __future__ import annotations

import re

PREFIX = "datasets/"
MAX_LENGTH = 1024
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")  # S3's bucket naming rules
_SEGMENT = re.compile(r"^[A-Za-z0-9._=+@,-]+$")  # no spaces, no control or wildcard characters
_EXPECTED = f"expected s3://<artifact bucket>/{PREFIX}<key> or {PREFIX}<key>"


def split(uri: str) -> tuple[str | None, str]:
    """The bucket the URI names (None: the artifact bucket, implied) and the object key, or a
    ValueError saying what is wrong with it (pure)."""
    bucket: str | None = None
    key = uri
    if len(uri) > MAX_LENGTH:
        raise ValueError(f"longer than {MAX_LENGTH} characters")
    if "://" in uri:
        scheme, _, rest = uri.partition("://")
        if scheme != "s3":
            raise ValueError(f"scheme {scheme!r} is not s3 ({_EXPECTED})")
        bucket, _, key = rest.partition("/")
        if not _BUCKET.match(bucket):
            raise ValueError(f"{bucket!r} is not an S3 bucket name ({_EXPECTED})")
    if not key.startswith(PREFIX):
        raise ValueError(f"the object is not under {PREFIX} ({_EXPECTED})")
    for segment in key.split("/"):
        if segment in ("", ".", "..") or not _SEGMENT.match(segment):
            raise ValueError(f"key segment {segment!r} is empty, relative or has characters "
                             f"other than letters, digits and ._=+@,- ({_EXPECTED})")
    return bucket, key


def key_in(uri: str, artifact_bucket: str) -> str:
    """The object key of ``uri`` in the artifact bucket; a ValueError when the URI is invalid
    or names another bucket (the workload reads datasets from the artifact bucket only)."""
    bucket, key = split(uri)
    if bucket is not None and bucket != artifact_bucket:
        raise ValueError(f"uri names bucket {bucket!r}, not the artifact bucket "
                         f"{artifact_bucket!r}")
    return key
