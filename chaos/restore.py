"""Chaos Toolkit actions and probes for the database *restore from backup* rehearsal
(chaos/experiments/db-restore-from-backup.yaml, runbooks/db-primary-loss.md B).

The restore runs the runbook's order: 1 stop intake and writers, 2 restore, 3 migrate,
4 advance fencing, 5 reconcile with object storage and the client ledgers, 6 re-open. Steps
1-4 and 6 act on the local environment (environments/local/backup.py); on AWS the same order is a
point-in-time restore to a new RDS instance, which cannot run here, so these actions refuse
other environments with that reason instead of pretending.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos.context import ChaosError, Context
from environments.base import environment_kind

__all__ = [
    "acknowledged_submissions_present",
    "lose_database",
    "reconcile_after_restore",
    "reopen_after_restore",
    "restore_database_from_backup",
    "take_database_backup",
]

# The actions that inject a fault, as in chaos/actions.py (what `gameday run --dry-run` lists).
FAULTS = ("lose_database", "restore_database_from_backup")

Configuration = dict[str, Any] | None
Secrets = dict[str, Any] | None


def _ctx(configuration: Configuration) -> Context:
    ctx = Context.from_configuration(configuration)
    if not environment_kind(ctx.env_name).database_backups_here:
        raise ChaosError(f"the restore rehearsal acts on the local environment, not {ctx.env_name!r}: "
                         "on AWS follow runbooks/db-primary-loss.md (point-in-time restore)")
    return ctx


def _backups(ctx: Context) -> Any:
    return ctx.env.backups  # the local environment's (environments/local/backup.py)


def _report_path(ctx: Context) -> Path:
    return ctx.run_dir / "experiments" / ctx.experiment / "restore.json"


def _report(ctx: Context) -> dict[str, Any]:
    path = _report_path(ctx)
    return json.loads(path.read_text()) if path.exists() else {}


def _save(ctx: Context, key: str, value: Any) -> None:
    data = {**_report(ctx), key: value}
    _report_path(ctx).parent.mkdir(parents=True, exist_ok=True)
    _report_path(ctx).write_text(json.dumps(data, indent=2, default=str))


def _ledger_files(run_dir: Path) -> list[Path]:
    """Every client ledger of this run so far: the experiments' and the load's live part files
    (merged into ledger.jsonl only when the load stops)."""
    files = [run_dir / "ledger-experiments.jsonl", run_dir / "ledger.jsonl",
             *sorted((run_dir / ".locust" / "parts").glob("ledger.*.jsonl"))]
    return [f for f in files if f.is_file()]


# -- actions --------------------------------------------------------------------------------
def take_database_backup(configuration: Configuration = None, secrets: Secrets = None) -> dict:
    """A base backup of the control-plane database; its restore point is when it started."""
    ctx = _ctx(configuration)
    meta = _backups(ctx).take()
    _save(ctx, "backup", meta)
    return meta


def lose_database(configuration: Configuration = None, secrets: Secrets = None) -> dict:
    """Both database members and their data gone: only the backup can bring the store back."""
    return _backups(_ctx(configuration)).lose()


def restore_database_from_backup(backup: str = "latest", configuration: Configuration = None,
                                 secrets: Secrets = None) -> dict:
    """Restore order steps 1-4; intake stays closed (clients get 503) until the reopen."""
    ctx = _ctx(configuration)
    backup_id = backup
    if backup == "taken":  # the one this experiment took
        taken = _report(ctx).get("backup")
        if not taken:
            raise ChaosError("no backup was taken in this experiment (run take_database_backup first)")
        backup_id = taken["id"]
    details = _backups(ctx).restore(backup_id)
    _save(ctx, "restore", details)
    return details


def reconcile_after_restore(configuration: Configuration = None, secrets: Secrets = None) -> dict:
    """Step 5: quarantine artifacts the restored store does not know; list the acknowledged
    submissions it lost (from this run's client ledgers) for replay after the reopen."""
    ctx = _ctx(configuration)
    restored = _report(ctx).get("restore")
    if not restored:
        raise ChaosError("nothing was restored in this experiment: reconcile runs after the restore")
    report = _backups(ctx).reconcile(restored, _ledger_files(ctx.run_dir))
    _save(ctx, "reconciliation", report)
    return report


def reopen_after_restore(configuration: Configuration = None, secrets: Secrets = None) -> dict:
    """Step 6: reconciler, agents, then intake; then the lost acknowledgements are replayed
    with their idempotency keys (only the API creates operations)."""
    ctx = _ctx(configuration)
    pending = (_report(ctx).get("reconciliation") or {}).get("replay_pending", [])
    out = _backups(ctx).reopen_and_replay(pending)
    out["replay_failed"] = [r for r in out["replayed"] if r["error"]]
    _save(ctx, "reopen", out)
    if out["replay_failed"]:
        raise ChaosError(f"{len(out['replay_failed'])} lost acknowledged submissions could not be "
                         f"replayed: {out['replay_failed'][:3]}")
    return out


# -- probes ---------------------------------------------------------------------------------
def acknowledged_submissions_present(configuration: Configuration = None,
                                     secrets: Secrets = None) -> dict:
    """Every acknowledged (project, idempotency key) in this run's client ledgers is in the
    store: the durability promise, checked right now rather than only at the end."""
    from environments.local.restore_reconcile import lost_acknowledgements
    from slo import ledger

    ctx = Context.from_configuration(configuration)
    entries = ledger.read(_ledger_files(ctx.run_dir), torn_tail_ok=True)
    missing = [x.idempotency_key for x in
               lost_acknowledgements(ctx.platform.stored_operations(), entries)]
    return {"acknowledged": len({(x.project, x.idempotency_key) for x in entries}),
            "missing": missing[:20], "missing_count": len(missing), "all_present": not missing}
