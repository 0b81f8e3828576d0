"""The local environment's credential files: the control plane's DSN carries no password (libpq
reads it from the password file at each connection, so a rotated password needs no restart),
agents get a token file, and both files are private and replaced atomically."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg

from environments.local.pg_files import (
    agent_token_file,
    app_dsn,
    pgpass_file,
    write_agent_token,
    write_pgpass,
)


def test_the_dsn_names_the_password_file_and_holds_no_password(tmp_path: Path) -> None:
    write_pgpass(tmp_path, "s3cret:with\\odd")
    dsn = app_dsn({"haproxy_pg": 5432}, tmp_path)
    assert "s3cret" not in dsn
    assert psycopg.conninfo.conninfo_to_dict(dsn)["passfile"] == str(pgpass_file(tmp_path))
    # libpq's format, ':' and '\' escaped; any host, port and database
    assert pgpass_file(tmp_path).read_text() == "*:*:*:controlplane:s3cret\\:with\\\\odd\n"
    assert os.stat(pgpass_file(tmp_path)).st_mode & 0o777 == 0o600  # libpq ignores it otherwise


def test_rewriting_a_secret_file_replaces_it_atomically(tmp_path: Path) -> None:
    write_agent_token(tmp_path, "agent-old-0123456789")
    path = agent_token_file(tmp_path)
    before = path.stat().st_ino
    write_agent_token(tmp_path, "agent-new-0123456789")
    # a new inode: a reader holding the old file reads the old token whole, never half of one
    assert path.stat().st_ino != before and path.read_text() == "agent-new-0123456789\n"
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["agent-token"]  # no temp file left


class _FakeEnv:
    """What LocalCredentials.revoke_retired uses of the environment's record (``state``) and
    processes (``run_step``); records the steps."""

    def __init__(self, state: Path, agent: str, project: str) -> None:
        self.dir = state
        self.endpoints = {"dsn": "postgresql://controlplane@127.0.0.1:1/controlplane"}
        self.info = {"secrets": {"agent_token": agent, "project_tokens": {"team-b": project}}}
        self.steps: list[list[str]] = []

    def run_step(self, name: str, argv: list[str], env_extra: dict[str, str]) -> None:
        self.steps.append(argv[argv.index("token"):])


def test_revoking_retires_only_tokens_no_longer_in_use(tmp_path: Path) -> None:
    import json

    from environments.local.credentials import LocalCredentials, token_id

    env = _FakeEnv(tmp_path, "agent-new-0123456789", "user-new-0123456789")
    creds = LocalCredentials(env, env, None)  # type: ignore[arg-type]
    assert creds.revoke_retired() == {"revoked": [], "note": "nothing was rotated"}
    creds.retired_file.parent.mkdir()
    creds.retired_file.write_text(json.dumps({"agent_token": "agent-old-0123456789",
                                              "project_token": "user-new-0123456789"}))
    # the project's rotation never happened (its retired token is the current one): kept
    assert creds.revoke_retired() == {"revoked": [token_id("agent-old-0123456789")]}
    assert env.steps == [["token", "revoke", "--id", token_id("agent-old-0123456789")]]
    assert all("agent-old" not in " ".join(s) for s in env.steps)  # ids in argv, never tokens


def test_the_refusal_proof_needs_every_replica_to_refuse_every_retired_token(
        tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from environments.local.credentials import LocalCredentials

    refused: set[str] = {"agent-old-0123456789", "user-old-0123456789"}

    class Api(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            token = self.headers["Authorization"].removeprefix("Bearer ")
            code = 401 if token in refused else 200
            body = json.dumps({"detail": f"token of {token} was revoked" if code == 401 else ""})
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = _FakeEnv(tmp_path, "agent-new-0123456789", "user-new-0123456789")
        url = f"http://127.0.0.1:{server.server_address[1]}"
        env.endpoints["api_replicas"] = {"api-1": url, "api-2": url}
        creds = LocalCredentials(env, env, None)  # type: ignore[arg-type]
        assert creds.refused(within=0.1) == {"refused": True, "note": "nothing was rotated"}
        creds.retired_file.parent.mkdir()
        creds.retired_file.write_text(json.dumps({
            "agent_token": "agent-old-0123456789", "project_token": "user-old-0123456789",
            "project": "team-b", "pg_app": "old-password"}))
        monkeypatch.setattr(creds, "_old_password_refused",
                            lambda pw: "refused: password authentication failed")
        proof = creds.refused(within=0.1)
        assert proof["refused"] is True and proof["agent@api-2"]["current"] == 200
        assert "agent-old" not in json.dumps(proof)  # reasons, never the secret
        refused.discard("user-old-0123456789")  # the old project token still works
        proof = creds.refused(within=0.6)
        assert proof["refused"] is False and proof["project@api-1"]["retired"].startswith("200")
        refused.add("user-old-0123456789")
        monkeypatch.setattr(creds, "_old_password_refused",
                            lambda pw: "ACCEPTED: the old database password still logs in")
        assert creds.refused(within=0.1)["refused"] is False
        # the evidence retired-credentials-refused judges: each request made with a retired
        # credential once it was revoked (none before: then it may still work)
        records: list[dict] = []
        creds.refused(within=0.1, record=records.append)
        assert records == []
        creds.retired_file.write_text(json.dumps({
            **json.loads(creds.retired_file.read_text()), "revoked_at": 1.0}))
        refused.discard("agent-old-0123456789")  # the old agent token accepted again
        creds.refused(within=0.3, record=records.append)
        agent = [r for r in records if r["kind"] == "agent_token"]
        assert len(agent) > 2 and all(r["accepted"] and r["status"] == 200 for r in agent)
        assert [r["accepted"] for r in records if r["kind"] == "project_token"] == [False] * 2
        [password] = [r for r in records if r["kind"] == "db_password"]
        assert password["accepted"] is True and password["grace_seconds"] == 0.0
        assert all(r["revoked_at"] == 1.0 for r in records)
        assert "-old-" not in json.dumps(records) and "old-password" not in json.dumps(records)
    finally:
        server.shutdown()
