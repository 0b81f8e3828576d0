"""Tag -> digest resolution against the real Debian docker-registry (OCI distribution API)."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import httpx
import pytest
from agenttest import TRAINER_REPO, TRAINER_TAG, ProcessSupervisor, Registry, free_port, wait_http

from controlplane import registry as reg


def test_resolves_pushed_tag_to_its_manifest_digest(registry: Registry) -> None:
    manifest = httpx.get(f"http://{registry.host}/v2/{TRAINER_REPO}/manifests/{TRAINER_TAG}",
                         headers={"Accept": reg.OCI_MANIFEST}).content
    expected = "sha256:" + hashlib.sha256(manifest).hexdigest()

    pinned = reg.resolve_digest(registry.trainer_image)

    assert pinned == f"{registry.host}/{TRAINER_REPO}@{expected}"
    # A digest reference resolves to itself.
    assert reg.resolve_digest(pinned) == pinned


def test_oci_manifest_needs_the_accept_header(registry: Registry) -> None:
    """Why MANIFEST_ACCEPT exists: without it docker-registry 2.8 hides OCI manifests."""
    url = f"http://{registry.host}/v2/{TRAINER_REPO}/manifests/{TRAINER_TAG}"
    assert httpx.head(url).status_code == 404
    assert httpx.head(url, headers={"Accept": reg.MANIFEST_ACCEPT}).status_code == 200


@pytest.mark.parametrize("image", [f"{TRAINER_REPO}:no-such-tag", "ml/no-such-repo:1.0"])
def test_missing_tag_or_repo_is_deterministic_not_found(registry: Registry, image: str) -> None:
    with pytest.raises(reg.ImageNotFound, match="not found") as info:
        reg.resolve_digest(f"{registry.host}/{image}")
    assert info.value.transient is False
    assert info.value.reason == "image_not_found"


def test_stopped_registry_is_transient_unreachable() -> None:
    with pytest.raises(reg.RegistryUnreachable, match="unreachable") as info:
        reg.resolve_digest(f"127.0.0.1:{free_port()}/ml/trainer:1.0", timeout=1.0)
    assert info.value.transient is True


def test_frozen_registry_times_out_as_unreachable(private_registry: Registry) -> None:
    private_registry.proc.freeze()
    started = time.monotonic()
    with pytest.raises(reg.RegistryUnreachable, match="ReadTimeout"):
        reg.resolve_digest(private_registry.trainer_image, timeout=0.5)
    assert time.monotonic() - started < 3
    private_registry.proc.thaw()
    assert "@sha256:" in reg.resolve_digest(private_registry.trainer_image)


@pytest.mark.parametrize("image", ["trainer:1.0", "Not A Ref", "127.0.0.1:5000/UPPER/case:1"])
def test_invalid_reference_is_deterministic(image: str) -> None:
    with pytest.raises(reg.InvalidImageReference, match="is not") as info:
        reg.resolve_digest(image)
    assert info.value.transient is False


def test_image_ref_parsing() -> None:
    ref = reg.ImageRef.parse("127.0.0.1:5000/ml/trainer:1.0")
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == ("127.0.0.1:5000", "ml/trainer", "1.0", None)
    assert reg.ImageRef.parse("registry.example.com/a/b").tag == "latest"


def test_resolves_share_one_client_and_survive_a_registry_restart(
        private_registry: Registry, procs: ProcessSupervisor, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent resolves an image per attempt through one kept client (a client and a
    connection per call cost ~1.3 ms of the agent's CPU and ~1 ms of the registry's each). The
    connection it keeps must not outlive the server: after a restart the next resolve succeeds
    on a new connection instead of failing as unreachable (which would fail the attempt)."""
    made: list[object] = []
    real_init = httpx.Client.__init__

    def counting_init(self: httpx.Client, *args: object, **kwargs: object) -> None:
        made.append(self)
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(reg, "_CLIENTS", {})
    monkeypatch.setattr(httpx.Client, "__init__", counting_init)
    pinned = reg.resolve_digest(private_registry.trainer_image)
    for _ in range(3):
        assert reg.resolve_digest(private_registry.trainer_image) == pinned
    assert len(made) == 1, f"{len(made)} clients for 4 resolves"

    argv = private_registry.proc.popen.args
    private_registry.proc.kill()
    again = procs.start("docker-registry", list(argv), tmp_path / "registry-again.log")
    wait_http(f"http://{private_registry.host}/v2/", proc=again)  # httpx.get: a client of its own
    before = len(made)
    assert reg.resolve_digest(private_registry.trainer_image) == pinned
    assert len(made) == before  # the kept client, a new connection
