"""The database side of the local environment's files: the PostgreSQL binaries and OS user,
where the members' data directories live (``db_root_for``), the secret files the control
plane's processes read their credentials from, and the DSNs."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from environments.local.topology import Secrets

PG_BIN = Path("/usr/lib/postgresql/15/bin")
PG_USER = "postgres"
APP_DB = "controlplane"
APP_USER = "controlplane"

def run_as_postgres() -> str | None:
    """Postgres refuses to run as root: switch to the `postgres` OS user only when root."""
    return PG_USER if os.geteuid() == 0 else None


def chown_for_postgres(path: Path) -> None:
    if os.geteuid() == 0:
        shutil.chown(path, PG_USER, PG_USER)


def check_traversable_by_postgres(state_dir: Path) -> str | None:
    """Name the first ancestor the `postgres` user cannot enter, or None when all is well."""
    if os.geteuid() != 0:
        return None
    for parent in [state_dir.resolve(), *state_dir.resolve().parents]:
        if not parent.exists():
            continue  # created by `up` with the default (traversable) mode
        mode = parent.stat().st_mode
        if not mode & 0o001:
            return str(parent)
    return None


# Where the database members live when the state directory is one the `postgres` OS user cannot
# enter (a clone under root's 0700 home): a system data directory, one per state directory.
SYSTEM_DB_ROOT = Path("/var/lib/gameday")


def db_root_for(state_dir: Path, env_name: str) -> Path:
    """The directory holding pg-0/ and pg-1/: the state directory itself when the postgres
    user can reach it (or when nothing runs as another user), else a directory of its own under
    SYSTEM_DB_ROOT. Users never have to loosen the permissions of their home."""
    if check_traversable_by_postgres(state_dir) is None:
        return state_dir
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]
    return SYSTEM_DB_ROOT / f"{env_name}-{digest}"


# In a database directory under SYSTEM_DB_ROOT: the state directory it belongs to, so that one
# left behind when that state directory is gone can be found and removed (environments/local/orphans.py)
OWNER_FILE = "STATE_DIR"


def prepare_db_root(db_root: Path, state_dir: Path) -> None:
    """Create ``db_root`` and its gameday parent, enterable by the postgres user (0755), and
    record the state directory it belongs to."""
    db_root.mkdir(parents=True, exist_ok=True)
    for d in (db_root.parent, db_root):
        d.chmod(0o755)
    (db_root / OWNER_FILE).write_text(f"{state_dir.resolve()}\n")



def secrets_dir(state: Path) -> Path:
    return state / "secrets"


def pgpass_file(state: Path) -> Path:
    """The app role's password, in libpq's password-file format."""
    return secrets_dir(state) / "pgpass"


def agent_token_file(state: Path) -> Path:
    return secrets_dir(state) / "agent-token"


def write_private(path: Path, text: str) -> None:
    """Mode 0600, replaced atomically: a reader sees the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_pgpass(state: Path, password: str) -> None:
    # any host/port/database: the DSNs reach the same role through HAProxy or a proxy route
    escaped = password.replace("\\", "\\\\").replace(":", "\\:")
    write_private(pgpass_file(state), f"*:*:*:{APP_USER}:{escaped}\n")


def write_agent_token(state: Path, token: str) -> None:
    write_private(agent_token_file(state), token + "\n")


def write_secret_files(state: Path, secrets: Secrets) -> None:
    """The files the control plane's processes read their credentials from, so rotating one
    means replacing a file (environments/local/credentials.py), never re-launching with a new argv or
    environment."""
    write_pgpass(state, secrets.pg_app)
    write_agent_token(state, secrets.agent_token)


def app_dsn(ports: dict[str, int], state: Path, port: str = "haproxy_pg") -> str:
    """The app role's DSN: no password in it, libpq reads it from the password file at every
    connection attempt. So after a password rotation (ALTER ROLE + a new file) every new
    connection of a pool uses the new password, with no restart; sessions already open stay
    authenticated (PostgreSQL checks the password at login only)."""
    return (f"postgresql://{APP_USER}@127.0.0.1:{ports[port]}/{APP_DB}"
            f"?passfile={pgpass_file(state)}&connect_timeout=3&application_name=gameday")


def superuser_dsn(port: int, secrets: Secrets, db: str = "postgres") -> str:
    return f"postgresql://postgres:{secrets.pg_superuser}@127.0.0.1:{port}/{db}?connect_timeout=3"
