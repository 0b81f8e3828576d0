"""The run archive (slo/archive.py): whole runs or nothing, never overwritten, newest first;
the local backend on disk, the S3 backend against a real moto server (offline stand-in for S3:
the conditional put is moto's implementation of If-None-Match, not AWS's)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from environments.local import motoserver, watchdog
from environments.local.pgserver import free_port
from slo.archive import (
    AlreadyArchived,
    ArchiveError,
    LocalArchive,
    S3Archive,
    default_location,
    open_archive,
)
from slo.evaluate import evaluate_run
from slo.fixtures import ExperimentFixture
from slo.report import write_reports
from slo.verdict import Verdict


@pytest.fixture
def evaluated(make_run) -> tuple[Path, Verdict]:
    run = make_run(ExperimentFixture("api-replica-loss"))
    verdict = evaluate_run(run.path)
    write_reports(verdict, run.path)
    return run.path, verdict


def _as(verdict: Verdict, run_id: str, hours_later: float = 0.0) -> Verdict:
    return verdict.model_copy(update={"run_id": run_id,
                                      "started_at": verdict.started_at + hours_later * 3600})


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


# --------------------------------------------------------------------------------- local


def test_local_archive_keeps_the_run_and_its_entry(tmp_path: Path, evaluated) -> None:
    run_dir, verdict = evaluated
    archive = LocalArchive(tmp_path / "archive")
    entry = archive.put(run_dir, verdict)
    stored = tmp_path / "archive" / verdict.run_id / "run"
    assert entry.location == str(stored)
    assert _files(stored) == _files(run_dir) == set(entry.files)
    assert "verdict.json" in entry.files and "report.html" in entry.files
    assert (stored / "verdict.json").read_bytes() == (run_dir / "verdict.json").read_bytes()
    [listed] = archive.entries()
    assert (listed.run_id, listed.result, listed.exit_code, listed.score) == (
        verdict.run_id, verdict.result, verdict.exit_code, verdict.score)


def test_local_archive_never_overwrites(tmp_path: Path, evaluated) -> None:
    run_dir, verdict = evaluated
    archive = LocalArchive(tmp_path / "archive")
    archive.put(run_dir, verdict)
    before = (tmp_path / "archive" / verdict.run_id / "entry.json").read_bytes()
    changed = verdict.model_copy(update={"result": "fail", "exit_code": 2})
    with pytest.raises(AlreadyArchived, match=f"{verdict.run_id} is archived already"):
        archive.put(run_dir, changed)
    assert (tmp_path / "archive" / verdict.run_id / "entry.json").read_bytes() == before
    assert not any((tmp_path / "archive" / ".incoming").iterdir())


def test_the_rename_itself_refuses_a_run_archived_meanwhile(tmp_path: Path, evaluated,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Two archives of one run racing: the existence check passes for both, the rename of the
    second must still refuse (rename(2) does not replace a non-empty directory)."""
    run_dir, verdict = evaluated
    archive = LocalArchive(tmp_path / "archive")
    archive.put(run_dir, verdict)
    before = (tmp_path / "archive" / verdict.run_id / "entry.json").read_bytes()
    real_exists = Path.exists
    monkeypatch.setattr(Path, "exists", lambda p: False if p.name == verdict.run_id
                        else real_exists(p))
    with pytest.raises(AlreadyArchived):
        archive.put(run_dir, verdict.model_copy(update={"result": "fail"}))
    assert (tmp_path / "archive" / verdict.run_id / "entry.json").read_bytes() == before


def test_a_crash_mid_write_leaves_nothing_listed(tmp_path: Path, evaluated,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir, verdict = evaluated
    archive = LocalArchive(tmp_path / "archive")
    real_copy = shutil.copy2
    copied: list[str] = []

    def crash_after_two(src: Any, dst: Any) -> Any:
        if len(copied) == 2:
            raise KeyboardInterrupt("killed mid-write")
        copied.append(str(src))
        return real_copy(src, dst)

    monkeypatch.setattr(shutil, "copy2", crash_after_two)
    # a SIGKILL runs no cleanup: whatever was written so far stays on disk
    real_rmtree = shutil.rmtree
    monkeypatch.setattr(shutil, "rmtree", lambda *a, **k: None)
    with pytest.raises(KeyboardInterrupt):
        archive.put(run_dir, verdict)
    assert archive.entries() == []
    assert not (tmp_path / "archive" / verdict.run_id).exists()
    assert len(copied) == 2 and any((tmp_path / "archive" / ".incoming").iterdir())
    monkeypatch.setattr(shutil, "copy2", real_copy)
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    archive.put(run_dir, verdict)  # the crashed attempt does not block a retry
    assert [e.run_id for e in archive.entries()] == [verdict.run_id]


def test_a_half_written_staging_dir_is_never_listed(tmp_path: Path, evaluated) -> None:
    """What a SIGKILL mid-copy leaves behind (no cleanup ran): still nothing listed."""
    run_dir, verdict = evaluated
    leftover = tmp_path / "archive" / ".incoming" / f"{verdict.run_id}.dead"
    (leftover / "run").mkdir(parents=True)
    shutil.copy2(run_dir / "run.json", leftover / "run" / "run.json")
    assert LocalArchive(tmp_path / "archive").entries() == []


def test_entries_are_newest_first(tmp_path: Path, evaluated) -> None:
    run_dir, verdict = evaluated
    archive = LocalArchive(tmp_path / "archive")
    for run_id, hours in (("b-middle", 1.0), ("c-oldest", 0.0), ("a-newest", 2.0)):
        archive.put(run_dir, _as(verdict, run_id, hours))
    assert [e.run_id for e in archive.entries()] == ["a-newest", "b-middle", "c-oldest"]


def test_a_corrupt_entry_is_an_error_naming_the_file(tmp_path: Path, evaluated) -> None:
    run_dir, verdict = evaluated
    archive = LocalArchive(tmp_path / "archive")
    archive.put(run_dir, verdict)
    entry = tmp_path / "archive" / verdict.run_id / "entry.json"
    entry.write_text('{"run_id": "x"')
    with pytest.raises(ArchiveError, match=f"{entry}: unreadable index entry"):
        archive.entries()


def test_a_run_id_that_is_not_a_plain_name_is_refused(tmp_path: Path, evaluated) -> None:
    run_dir, verdict = evaluated
    with pytest.raises(ValueError, match="cannot be archived"):
        LocalArchive(tmp_path / "archive").put(run_dir, _as(verdict, "../escape"))
    assert not (tmp_path / "escape").exists()


def test_locations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GAMEDAY_ARCHIVE", raising=False)
    assert default_location(tmp_path / "runs") == str(tmp_path / "archive")
    monkeypatch.setenv("GAMEDAY_ARCHIVE", "s3://b/p")
    assert default_location(tmp_path / "runs") == "s3://b/p"
    s3 = open_archive("s3://bucket/some/prefix/")
    assert isinstance(s3, S3Archive) and (s3.bucket, s3.prefix) == ("bucket", "some/prefix")
    assert isinstance(open_archive(tmp_path / "a"), LocalArchive)
    with pytest.raises(ArchiveError, match="no bucket"):
        open_archive("s3:///prefix")


# ------------------------------------------------------------------------- S3 (moto server)


@pytest.fixture(scope="module")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A moto S3 server on a free loopback port; its process group dies with this module, or
    with the test session through the watchdog if pytest itself is killed."""
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    port = free_port()
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            motoserver.command(port),
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, "AWS_ACCESS_KEY_ID": "testing",
                                         "AWS_SECRET_ACCESS_KEY": "testing"})
    dog = watchdog.watch(proc.pid)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"moto_server exited {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                if httpx.get(endpoint + "/moto-api/", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"moto_server not ready: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield endpoint
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(10)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        dog.wait(10)


@pytest.fixture
def s3(moto_endpoint: str, request: pytest.FixtureRequest) -> Any:
    import boto3

    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    bucket = "history-" + request.node.name.replace("_", "-")[:40].lower()
    client.create_bucket(Bucket=bucket)
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    return client, bucket


def test_s3_archive_keeps_the_run_and_lists_it(s3: Any, evaluated) -> None:
    client, bucket = s3
    run_dir, verdict = evaluated
    archive = S3Archive(bucket, "gamedays/local", client=client)
    entry = archive.put(run_dir, verdict)
    assert entry.location.startswith(f"s3://{bucket}/gamedays/local/runs/{verdict.run_id}/")
    prefix = entry.location.removeprefix(f"s3://{bucket}/")
    keys = {o["Key"].removeprefix(prefix)
            for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]}
    assert keys == _files(run_dir) == set(entry.files)
    body = client.get_object(Bucket=bucket, Key=prefix + "verdict.json")["Body"].read()
    assert body == (run_dir / "verdict.json").read_bytes()
    [listed] = archive.entries()
    assert (listed.run_id, listed.result, listed.exit_code) == (verdict.run_id, verdict.result,
                                                                verdict.exit_code)
    archive.put(run_dir, _as(verdict, "later", 1.0))
    assert [e.run_id for e in archive.entries()] == ["later", verdict.run_id]


def test_s3_archive_never_overwrites_even_when_the_check_is_raced(
        s3: Any, evaluated, monkeypatch: pytest.MonkeyPatch) -> None:
    client, bucket = s3
    run_dir, verdict = evaluated
    archive = S3Archive(bucket, "p", client=client)
    archive.put(run_dir, verdict)
    key = f"p/index/{verdict.run_id}.json"
    first = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    with pytest.raises(AlreadyArchived, match="archived already"):
        archive.put(run_dir, verdict)
    # a concurrent writer that passed the existence check: S3's conditional put refuses it
    monkeypatch.setattr(archive, "_exists", lambda key: False)
    with pytest.raises(AlreadyArchived, match="exists already"):
        archive.put(run_dir, verdict.model_copy(update={"result": "fail", "exit_code": 2}))
    versions = client.list_object_versions(Bucket=bucket, Prefix=key).get("Versions", [])
    assert len(versions) == 1  # not even a second version of the entry
    assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == first


def test_s3_crash_mid_upload_lists_nothing_and_a_retry_works(s3: Any, evaluated) -> None:
    client, bucket = s3
    run_dir, verdict = evaluated

    class Crashing:
        def __init__(self, after: int) -> None:
            self.left = after

        def __getattr__(self, name: str) -> Any:
            return getattr(client, name)

        def put_object(self, **kw: Any) -> Any:
            if self.left == 0:
                raise KeyboardInterrupt("killed mid-upload")
            self.left -= 1
            return client.put_object(**kw)

    with pytest.raises(KeyboardInterrupt):
        S3Archive(bucket, "p", client=Crashing(after=2)).put(run_dir, verdict)
    archive = S3Archive(bucket, "p", client=client)
    assert archive.entries() == []
    archive.put(run_dir, verdict)
    assert [e.run_id for e in archive.entries()] == [verdict.run_id]


def test_s3_corrupt_entry_is_an_error_naming_the_key(s3: Any) -> None:
    client, bucket = s3
    client.put_object(Bucket=bucket, Key="p/index/broken.json", Body=b"not json")
    with pytest.raises(ArchiveError, match=f"s3://{bucket}/p/index/broken.json: unreadable"):
        S3Archive(bucket, "p", client=client).entries()
