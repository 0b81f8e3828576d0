"""Store statements name their columns (controlplane/store/columns.py): the lists are the
migrated schema of each release, and no statement returns `*`, whose prepared plan an expand
migration would break (docs/upgrades.md, "Found by the rehearsal")."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg

from controlplane.db import migrate
from controlplane.store import columns

STORE = Path(columns.__file__).resolve().parent
# `*` as a statement's output: SELECT *, RETURNING *, alias.*  (count(*) and a SELECT * over an
# unnest with its own column list are fixed shapes and allowed)
STAR = re.compile(r"\bSELECT\s+\*(?!\s+FROM\s+unnest\()|\bRETURNING\s+\*|\b[a-z_]+\.\*",
                  re.IGNORECASE)


def star_outputs(source: str) -> list[str]:
    code = [line for line in source.splitlines() if not line.lstrip().startswith("#")]
    return [m.group(0) for line in code for m in STAR.finditer(line)]


def _schema(dsn: str) -> dict[str, set[str]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT table_name, column_name FROM information_schema.columns"
                            " WHERE table_schema = current_schema()").fetchall()
    out: dict[str, set[str]] = {}
    for table, column in rows:
        out.setdefault(table, set()).add(column)
    return out


def test_the_column_lists_are_each_release_s_schema(pg_dsn: str) -> None:
    migrate(pg_dsn, "N")
    schema = _schema(pg_dsn)
    for table in columns.TABLES:
        assert set(columns.names(table, "N")) == schema[table], table
    migrate(pg_dsn, "N+1")  # the expand: both columns; N+1 reads only the new one
    schema = _schema(pg_dsn)
    for table in columns.TABLES:
        replaced = set(columns.RENAMED["N+1"].get(table, {}))
        assert set(columns.names(table, "N+1")) | replaced == schema[table], table
        assert not replaced & set(columns.names(table, "N+1")), table


def test_no_store_statement_returns_star() -> None:
    found = {p.name: star_outputs(p.read_text()) for p in sorted(STORE.glob("*.py"))
             if p.name != "columns.py"}
    assert not {k: v for k, v in found.items() if v}, found


def test_the_star_check_sees_each_form() -> None:
    for bad in ("SELECT * FROM operations", "RETURNING *", "SELECT o.*, 1 FROM operations o",
                "select t.* from attempts t"):
        assert star_outputs(f'cur.execute("{bad}")'), bad
    for fine in ("SELECT count(*) FROM n", "SELECT * FROM unnest(%s::uuid[]) AS v(id)",
                 "# a comment about SELECT *"):
        assert not star_outputs(fine), fine
