"""`gameday env status|up --json` keep secrets off stdout unless --show-secrets: the status of a
stopped environment, written as `env up` writes it, printed by the real command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from environments.local.cli import env_group
from environments.local.env import state_dir_for
from environments.local.redact import REDACTED, redact

PASSWORD = "pg-super-S3cret"
TOKENS = {"projects": {"team-a": "u-team-a-secret", "team-b": "u-team-b-secret"},
          "agent": "a-agent-secret", "admin": "x-admin-secret"}


def _env_json() -> dict[str, Any]:
    return {
        "name": "local", "status": "stopped", "components": {}, "agents": [],
        "secrets": {"pg_superuser": PASSWORD, "pg_app": "app-secret"},
        "endpoints": {
            "api": "http://127.0.0.1:18080",
            "dsn": "postgresql://app@127.0.0.1:15432/controlplane?passfile=/x/pgpass",
            "admin_dsn": f"postgresql://postgres:{PASSWORD}@127.0.0.1:15432/postgres"
                         "?connect_timeout=3",
        },
        "tokens": TOKENS,
        "platform": "prefect", "platform_info": {"db_password": "prefect-db-secret"},
    }


@pytest.fixture
def home(tmp_path: Path) -> Path:
    state = state_dir_for("local", tmp_path)
    state.mkdir(parents=True)
    (state / "env.json").write_text(json.dumps(_env_json()))
    return tmp_path


def _status(home: Path, *flags: str) -> str:
    result = CliRunner().invoke(env_group, ["status", "--json", "--home", str(home), *flags])
    # a stopped environment has no healthy component: exit 1, the status printed all the same
    assert result.exit_code == 1 and result.output.startswith("{"), result.output
    return result.output


SECRETS = [PASSWORD, "prefect-db-secret", *TOKENS["projects"].values(), TOKENS["agent"],
           TOKENS["admin"]]


def test_status_json_redacts_every_secret_by_default(home: Path) -> None:
    out = _status(home)
    assert [s for s in SECRETS if s in out] == []
    data = json.loads(out)
    assert data["endpoints"]["admin_dsn"] == (
        "postgresql://postgres:***@127.0.0.1:15432/postgres?connect_timeout=3")
    assert data["tokens"] == {"projects": {"team-a": REDACTED, "team-b": REDACTED},
                              "agent": REDACTED, "admin": REDACTED}
    # what is not a secret is printed as it is
    assert data["endpoints"]["dsn"] == _env_json()["endpoints"]["dsn"]
    assert data["endpoints"]["api"] == "http://127.0.0.1:18080"


def test_show_secrets_prints_them(home: Path) -> None:
    data = json.loads(_status(home, "--show-secrets"))
    assert data["tokens"] == TOKENS
    assert PASSWORD in data["endpoints"]["admin_dsn"]
    assert data["platform_info"]["db_password"] == "prefect-db-secret"


@pytest.mark.parametrize("text,expected", [
    ("postgresql://postgres:pw@h:5/db", "postgresql://postgres:***@h:5/db"),
    ("host=h user=u password=pw dbname=d", "host=h user=u password=*** dbname=d"),
    ("postgresql://u@h/db?password=pw&sslmode=require",
     "postgresql://u@h/db?password=***&sslmode=require"),
    ("http://127.0.0.1:9090", "http://127.0.0.1:9090"),
])
def test_passwords_inside_urls_and_dsns(text: str, expected: str) -> None:
    assert redact({"url": text}) == {"url": expected}
