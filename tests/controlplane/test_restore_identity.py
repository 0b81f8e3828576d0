"""A database restore keeps operation identities: the admin restore route re-creates a lost
acknowledged submission under the id its client holds (controlplane/api/admin.py,
store.operations.restore), and the restore order's replay uses it (restore_reconcile.replay,
environments/local/backup.py, through the platform adapter). Real API process and PostgreSQL
(tests/conftest.py)."""

from __future__ import annotations

import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import psycopg
import pytest

from environments.local.launch import ControlPlane
from environments.local.restore_reconcile import pending_line
from platforms.controlplane import ControlPlaneAdapter
from slo.ledger import LedgerEntry

from .helpers import Api, spec

ACKED_AT = "2026-01-06T10:00:05+00:00"


def _entry(op_id: str, key: str, project: str, body: dict[str, Any]) -> LedgerEntry:
    return LedgerEntry(operation_id=op_id, idempotency_key=key, acked_at=ACKED_AT,
                       project=project, request=body)


def _adapter(cp: ControlPlane, admin_token: str) -> ControlPlaneAdapter:
    return ControlPlaneAdapter(cp.api_url, cp.user_token, cp.project, admin_token=admin_token)


@pytest.fixture
def user(cp_stack: ControlPlane) -> Api:
    return Api(cp_stack.api_url, cp_stack.user_token)


@pytest.fixture
def admin(cp_stack: ControlPlane) -> Api:
    return Api(cp_stack.api_url, cp_stack.admin_token)


def lost_ack(user: Api, cp_stack: ControlPlane, body: dict[str, Any]) -> tuple[str, str]:
    """An acknowledged submission, then the store loses it (as a restore to an earlier point
    does): the client keeps (id, key, body) in its ledger."""
    key = f"k-{uuid.uuid4()}"
    r = user.submit(body, key=key)
    assert r.status_code == 201
    op_id = r.json()["id"]
    with psycopg.connect(cp_stack.dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM events WHERE operation_id = %s", (op_id,))
        conn.execute("DELETE FROM operations WHERE id = %s", (op_id,))
    assert user.c.get(f"/v1/operations/{op_id}").status_code == 404
    return op_id, key


def restore(api: Api, project: str, op_id: str, key: str, body: dict[str, Any],
            **extra: Any) -> httpx.Response:
    return api.c.post("/v1/admin/operations/restore", json={
        "project": project, "idempotency_key": key, "operation_id": op_id, "spec": body,
        "acknowledged_at": ACKED_AT, "restore_id": "bk-1", **extra})


def count_key(cp_stack: ControlPlane, key: str) -> int:
    with psycopg.connect(cp_stack.dsn) as conn:
        return conn.execute("SELECT count(*) FROM operations WHERE idempotency_key = %s",
                            (key,)).fetchone()[0]


def test_restore_keeps_the_id_records_why_and_is_idempotent(user: Api, admin: Api,
                                                             cp_stack: ControlPlane) -> None:
    op_id, key = lost_ack(user, cp_stack, spec("a"))
    r = restore(admin, cp_stack.project, op_id, key, spec("a"))
    assert r.status_code == 201, r.text
    assert r.json()["id"] == op_id and r.headers["X-Restore-Identity"] == "same_id"
    got = user.op(op_id)  # the client's id answers again
    assert got["idempotency_key"] == key and got["name"] == "a"
    (ev,) = [e for e in user.events(op_id) if e["kind"] == "restored_from_ledger"]
    assert ev["actor"] == "admin:restore-bk-1" and ev["to_state"] == "accepted"
    assert ev["data"]["acked_at"] == ACKED_AT and ev["data"]["restore_id"] == "bk-1"
    again = restore(admin, cp_stack.project, op_id, key, spec("a"))
    assert again.status_code == 200 and again.json()["id"] == op_id
    assert again.headers["X-Restore-Identity"] == "same_id"
    # a client retry with its key finds the restored operation, not a new one
    retry = user.submit(spec("a"), key=key)
    assert retry.status_code == 200 and retry.json()["id"] == op_id
    assert count_key(cp_stack, key) == 1


def test_restore_of_an_operation_the_store_still_has_is_a_no_op(user: Api, admin: Api,
                                                                cp_stack: ControlPlane) -> None:
    first = user.submit(spec("kept"), key="kept-1").json()
    r = restore(admin, cp_stack.project, first["id"], "kept-1", spec("kept"))
    assert r.status_code == 200 and r.json()["id"] == first["id"]
    assert not [e for e in user.events(first["id"]) if e["kind"] == "restored_from_ledger"]


def test_conflicts_name_what_holds_the_id_or_the_key(user: Api, admin: Api,
                                                    cp_stack: ControlPlane) -> None:
    held = user.submit(spec("held"), key="held-key").json()
    lost_id, lost_key = lost_ack(user, cp_stack, spec("lost"))
    assert restore(admin, cp_stack.project, lost_id, lost_key, spec("lost")).status_code == 201

    # same id and key, another payload
    r = restore(admin, cp_stack.project, lost_id, lost_key, spec("other"))
    assert r.status_code == 409 and "different payload" in r.json()["detail"]
    # the key belongs to another operation: with its payload, or without the redirect flag
    r = restore(admin, cp_stack.project, str(uuid.uuid4()), "held-key", spec("other"))
    assert r.status_code == 409 and held["id"] in r.json()["detail"]
    assert "different payload" in r.json()["detail"]
    fresh = str(uuid.uuid4())
    r = restore(admin, cp_stack.project, fresh, "held-key", spec("held"))
    assert r.status_code == 409 and held["id"] in r.json()["detail"]
    assert "redirect_if_key_taken" in r.json()["detail"]
    # the id is taken by another key (in this project or another)
    r = restore(admin, cp_stack.project, held["id"], "another-key", spec("held"))
    assert r.status_code == 409 and "taken by another submission" in r.json()["detail"]
    r = restore(admin, "other-team", held["id"], "held-key", spec("held"))
    assert r.status_code == 409 and "taken by another submission" in r.json()["detail"]
    # nothing was created or redirected by any of them
    assert count_key(cp_stack, "held-key") == 1 and count_key(cp_stack, "another-key") == 0
    assert user.c.get(f"/v1/operations/{fresh}").status_code == 404


def test_key_reused_after_the_restore_makes_the_old_id_a_redirect(user: Api, admin: Api,
                                                                 cp_stack: ControlPlane) -> None:
    old_id, key = lost_ack(user, cp_stack, spec("a"))
    # intake re-opened before the replay and the client re-submitted: a new id holds the key
    new_id = user.submit(spec("a"), key=key).json()["id"]
    assert new_id != old_id
    r = restore(admin, cp_stack.project, old_id, key, spec("a"), redirect_if_key_taken=True)
    assert r.status_code == 200 and r.json()["id"] == new_id
    assert r.headers["X-Restore-Identity"] == "redirect"

    moved = user.c.get(f"/v1/operations/{old_id}")
    assert moved.status_code == 308 and moved.headers["location"] == f"/v1/operations/{new_id}"
    sub = user.c.get(f"/v1/operations/{old_id}/events")
    assert sub.status_code == 308 and sub.headers["location"] == f"/v1/operations/{new_id}/events"
    followed = user.c.get(f"/v1/operations/{old_id}", follow_redirects=True)
    assert followed.status_code == 200 and followed.json()["id"] == new_id
    (ev,) = [e for e in user.events(new_id) if e["kind"] == "restored_from_ledger"]
    assert ev["data"]["redirected_from"] == old_id and ev["actor"] == "admin:restore-bk-1"
    # another project does not learn the id exists
    other = Api(cp_stack.api_url, cp_stack.other_user_token)
    assert other.c.get(f"/v1/operations/{old_id}").status_code == 404

    again = restore(admin, cp_stack.project, old_id, key, spec("a"), redirect_if_key_taken=True)
    assert again.status_code == 200 and again.json()["id"] == new_id
    assert again.headers["X-Restore-Identity"] == "redirect"
    r = restore(admin, cp_stack.project, old_id, "another-key", spec("a"))
    assert r.status_code == 409 and f"already redirects to {new_id}" in r.json()["detail"]
    assert count_key(cp_stack, key) == 1


def test_only_an_admin_token_may_restore(user: Api, cp_stack: ControlPlane) -> None:
    op_id, key = lost_ack(user, cp_stack, spec("a"))
    r = restore(user, cp_stack.project, op_id, key, spec("a"))
    assert r.status_code == 403 and "needs admin" in r.json()["detail"]
    agent = Api(cp_stack.api_url, cp_stack.agent_token)
    assert restore(agent, cp_stack.project, op_id, key, spec("a")).status_code == 403
    anonymous = httpx.post(f"{cp_stack.api_url}/v1/admin/operations/restore", json={})
    assert anonymous.status_code == 401
    assert count_key(cp_stack, key) == 0


def test_invalid_restore_requests_are_422_naming_the_field(admin: Api,
                                                          cp_stack: ControlPlane) -> None:
    op_id = str(uuid.uuid4())
    r = restore(admin, "no-such-team", op_id, "k", spec("a"))
    assert r.status_code == 422
    assert r.json()["detail"] == [{"type": "invalid_reference", "loc": ["body", "project"],
                                   "msg": "field project: project 'no-such-team' does not exist"}]
    r = restore(admin, cp_stack.project, "not-a-uuid", "k", spec("a"))
    assert r.status_code == 422 and any("operation_id" in e["loc"] for e in r.json()["detail"])
    r = admin.c.post("/v1/admin/operations/restore", json={
        "project": cp_stack.project, "idempotency_key": "k", "operation_id": op_id,
        "spec": spec("a"), "acknowledged_at": "2026-01-06T10:00:05", "restore_id": "bk-1"})
    assert r.status_code == 422 and any("acknowledged_at" in e["loc"] for e in r.json()["detail"])
    r = restore(admin, cp_stack.project, op_id, "k", spec("a", queue="nope"))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "spec", "queue"]
    assert "queue 'nope' does not exist" in r.json()["detail"][0]["msg"]


def test_replay_records_identity_and_the_durability_audit_finds_it_by_id(
        user: Api, cp_stack: ControlPlane) -> None:
    from slo.evidence import Operation
    from slo.sli import submission_durability

    same_id, same_key = lost_ack(user, cp_stack, spec("a"))
    moved_id, moved_key = lost_ack(user, cp_stack, spec("b"))
    holder = user.submit(spec("b"), key=moved_key).json()["id"]
    lines = [_entry(same_id, same_key, cp_stack.project, spec("a")),
             _entry(moved_id, moved_key, cp_stack.project, spec("b"))]
    out = [_adapter(cp_stack, cp_stack.admin_token).restore_acknowledged(x, "bk-1")
           for x in lines]
    assert out == [
        {"key": same_key, "status": 201, "old_id": same_id, "new_id": same_id,
         "identity": "same_id", "error": None},
        {"key": moved_key, "status": 200, "old_id": moved_id, "new_id": holder,
         "identity": "redirect", "error": None}]
    refused = _adapter(cp_stack, cp_stack.user_token).restore_acknowledged(lines[0], "bk-1")
    assert refused["status"] == 403 and refused["new_id"] is None and refused["error"]

    with psycopg.connect(cp_stack.dsn) as conn:
        rows = conn.execute("SELECT o.id::text, p.name, o.state, o.idempotency_key, o.created_at"
                            " FROM operations o JOIN projects p ON p.id = o.project_id").fetchall()
    ops = [Operation(id=i, project=p, state=s, idempotency_key=k, created_at=c)
           for i, p, s, k, c in rows]
    audit = submission_durability(lines, ops)
    assert audit.missing == () and audit.duplicated == ()
    by_id = {o.id: o for o in ops}
    # the same-id replay is matched by its id (and key); only the redirect is key-only
    assert by_id[same_id].idempotency_key == same_key
    assert moved_id not in by_id and by_id[holder].idempotency_key == moved_key


def test_backup_replay_uses_the_admin_token_and_the_restore_id(cp_stack: ControlPlane,
                                                               user: Api, tmp_path: Path) -> None:
    from environments.local.backup import BackupError, DatabaseBackups

    op_id, key = lost_ack(user, cp_stack, spec("a"))
    pending = [pending_line(_entry(op_id, key, cp_stack.project, spec("a")), "bk-7")]
    env = SimpleNamespace(dir=tmp_path, endpoints={"api": cp_stack.api_url},
                          tokens={"admin": cp_stack.admin_token,
                                  "projects": {cp_stack.project: cp_stack.user_token}},
                          info={"platform": "controlplane"})
    (out,) = DatabaseBackups(env, None, None, None).replay(pending)  # type: ignore[arg-type]
    assert (out["old_id"], out["new_id"], out["identity"]) == (op_id, op_id, "same_id")
    (ev,) = [e for e in user.events(op_id) if e["kind"] == "restored_from_ledger"]
    assert ev["data"]["restore_id"] == "bk-7"
    env.tokens = {"projects": {cp_stack.project: cp_stack.user_token}}
    with pytest.raises(BackupError, match="no admin token"):
        DatabaseBackups(env, None, None, None).replay(pending)  # type: ignore[arg-type]
