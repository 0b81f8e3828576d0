"""Run history: every run's directory and verdict, kept in an archive that is never overwritten.

Two backends behind one interface (`Archive`), chosen by `open_archive(location)`:

  local   a directory (default `archive/` next to the runs directory, or `$GAMEDAY_ARCHIVE`):
            <archive>/<run-id>/entry.json     the index entry (slo.baseline.IndexEntry)
            <archive>/<run-id>/run/...        the run directory's files, verdict included
            <archive>/.incoming/...           archives being written (never listed)
          A run is copied into `.incoming/` and renamed into place in one step, so a crash
          leaves nothing listed; a run id already archived is refused, never replaced.
  s3      `s3://bucket/prefix` (the bucket is expected versioned):
            <prefix>/runs/<run-id>/<upload-id>/...  the run directory's files
            <prefix>/index/<run-id>.json             the index entry, written last
          Every object is written with a conditional put (`If-None-Match: *`): S3 refuses to
          replace an existing key. The index entry is the commit point: files of an upload
          that crashed stay unlisted, and a second archive of the same run id is refused.

Listing reads the index entries only, newest first. An unreadable entry is an error naming
the file (or key), never skipped.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from slo.baseline import IndexEntry, check_run_id, entry_of, newest_first
from slo.verdict import Verdict

ARCHIVE_ENV = "GAMEDAY_ARCHIVE"
ENTRY = "entry.json"
INCOMING = ".incoming"
MakeEntry = Callable[[str, Sequence[str], float], IndexEntry]


class ArchiveError(Exception):
    """The archive cannot be read or written; the message names the file or key."""


class AlreadyArchived(ArchiveError):
    """A run with this id is in the archive already: archives are never overwritten."""


class Archive(Protocol):
    location: str

    def put(self, run_dir: Path, verdict: Verdict) -> IndexEntry:
        """Archive `run_dir` (its files, verdict.json included) under `verdict.run_id`."""
        ...

    def entries(self) -> list[IndexEntry]:
        """Every archived run's index entry, newest first."""
        ...

    def put_run(self, run_dir: Path, run_id: str, make_entry: MakeEntry) -> IndexEntry:
        """Archive `run_dir` under `run_id` with the entry `make_entry(location, files,
        archived_at)` (a skipped run has no verdict: slo.baseline.skipped_entry)."""
        ...


def default_location(runs_dir: Path = Path("runs")) -> str:
    """`$GAMEDAY_ARCHIVE`, else `archive/` next to the runs directory."""
    return os.environ.get(ARCHIVE_ENV) or str(runs_dir.resolve().parent / "archive")


def open_archive(location: str | Path) -> Archive:
    text = str(location)
    if text.startswith("s3://"):
        bucket, _, prefix = text.removeprefix("s3://").partition("/")
        if not bucket:
            raise ArchiveError(f"{text}: no bucket (expected s3://bucket/prefix)")
        return S3Archive(bucket, prefix.strip("/"))
    return LocalArchive(Path(text))


def _run_files(run_dir: Path) -> list[Path]:
    if not run_dir.is_dir():
        raise ArchiveError(f"{run_dir}: not a run directory")
    return sorted(p for p in run_dir.rglob("*") if p.is_file())


def _parse_entry(text: str | bytes, where: str) -> IndexEntry:
    try:
        return IndexEntry.model_validate_json(text)
    except (ValidationError, ValueError) as exc:
        raise ArchiveError(f"{where}: unreadable index entry: "
                           f"{str(exc).splitlines()[0]}") from None


class LocalArchive:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.location = str(self.root)

    def put(self, run_dir: Path, verdict: Verdict) -> IndexEntry:
        return self.put_run(run_dir, verdict.run_id,
                            lambda loc, files, at: entry_of(verdict, loc, files, at))

    def put_run(self, run_dir: Path, run_id: str, make_entry: MakeEntry) -> IndexEntry:
        run_id = check_run_id(run_id)
        dest = self.root / run_id
        if dest.exists():
            raise AlreadyArchived(f"{dest}: run {run_id} is archived already; archives are "
                                  "never overwritten")
        files = _run_files(Path(run_dir))
        staging = self.root / INCOMING / f"{run_id}.{uuid.uuid4().hex}"
        staging.mkdir(parents=True)
        try:
            for f in files:
                rel = f.relative_to(run_dir)
                (staging / "run" / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, staging / "run" / rel)
            entry = make_entry(str(dest / "run"),
                               [str(f.relative_to(run_dir)) for f in files], time.time())
            (staging / ENTRY).write_text(entry.model_dump_json(indent=2, by_alias=True) + "\n",
                                         encoding="utf-8")
            try:
                # one rename: the run appears whole or not at all; rename(2) refuses a
                # non-empty target, so a concurrent archive of the same run cannot replace it
                os.rename(staging, dest)
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    raise AlreadyArchived(f"{dest}: run {run_id} is archived already; "
                                          "archives are never overwritten") from None
                raise
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return entry

    def entries(self) -> list[IndexEntry]:
        if not self.root.is_dir():
            return []
        out = []
        for d in self.root.iterdir():
            if d.name.startswith(".") or not d.is_dir():
                continue
            path = d / ENTRY
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise ArchiveError(f"{path}: unreadable index entry: {exc}") from None
            out.append(_parse_entry(text, str(path)))
        return newest_first(out)


class S3Archive:
    def __init__(self, bucket: str, prefix: str = "", client: Any = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.location = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL_S3"))
        return self._client

    def _key(self, *parts: str) -> str:
        return "/".join([self.prefix, *parts] if self.prefix else parts)

    def _index_key(self, run_id: str) -> str:
        return self._key("index", f"{run_id}.json")

    def _put_new(self, key: str, body: bytes, run_id: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=body, IfNoneMatch="*")
        except BotoCoreError as exc:
            raise ArchiveError(f"s3://{self.bucket}/{key}: put failed: {exc}") from None
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                raise AlreadyArchived(f"s3://{self.bucket}/{key}: exists already (run {run_id}); "
                                      "archives are never overwritten") from None
            raise ArchiveError(f"s3://{self.bucket}/{key}: put failed: {exc}") from None

    def _exists(self, key: str) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
        except BotoCoreError as exc:
            raise ArchiveError(f"s3://{self.bucket}/{key}: {exc}") from None
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise ArchiveError(f"s3://{self.bucket}/{key}: {exc}") from None
        return True

    def put(self, run_dir: Path, verdict: Verdict) -> IndexEntry:
        return self.put_run(run_dir, verdict.run_id,
                            lambda loc, files, at: entry_of(verdict, loc, files, at))

    def put_run(self, run_dir: Path, run_id: str, make_entry: MakeEntry) -> IndexEntry:
        run_id = check_run_id(run_id)
        index_key = self._index_key(run_id)
        if self._exists(index_key):
            raise AlreadyArchived(f"s3://{self.bucket}/{index_key}: run {run_id} is archived "
                                  "already; archives are never overwritten")
        files = _run_files(Path(run_dir))
        # a fresh upload id per attempt: a crashed upload's objects never block a retry
        base = self._key("runs", run_id, uuid.uuid4().hex)
        rels = [str(f.relative_to(run_dir)) for f in files]
        for f, rel in zip(files, rels):
            self._put_new(f"{base}/{rel}", f.read_bytes(), run_id)
        entry = make_entry(f"s3://{self.bucket}/{base}/", rels, time.time())
        self._put_new(index_key, entry.model_dump_json(indent=2, by_alias=True).encode(), run_id)
        return entry

    def entries(self) -> list[IndexEntry]:
        from botocore.exceptions import BotoCoreError, ClientError

        out = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self._key("index", ""))
            keys = [o["Key"] for page in pages for o in page.get("Contents", [])
                    if o["Key"].endswith(".json")]
            for key in keys:
                body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
                out.append(_parse_entry(body, f"s3://{self.bucket}/{key}"))
        except (ClientError, BotoCoreError) as exc:
            raise ArchiveError(f"{self.location}: {exc}") from None
        return newest_first(out)

