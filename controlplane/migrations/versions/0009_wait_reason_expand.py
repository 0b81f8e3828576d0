"""Expand step of renaming operations.pending_reason to operations.wait_reason (release N+1,
docs/upgrades.md): add the new column, keep both columns equal with a trigger whichever
release writes, backfill. Release N keeps working on this schema; the contract (dropping
pending_reason) waits for the release after N+1.

The seeded defect ``contract-too-early`` (controlplane/defects.py, test only) makes this step
rename the column in place instead: exactly the migration that breaks every N process still
running beside N+1.

Revision ID: 0009
"""
from alembic import op

from controlplane import defects

revision = "0009"
down_revision = "0006"
branch_labels = None
depends_on = None

SYNC = """
CREATE FUNCTION operations_wait_reason_sync() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.wait_reason := coalesce(NEW.wait_reason, NEW.pending_reason);
        NEW.pending_reason := coalesce(NEW.pending_reason, NEW.wait_reason);
    ELSIF NEW.wait_reason IS DISTINCT FROM OLD.wait_reason THEN
        NEW.pending_reason := NEW.wait_reason;      -- written by N+1
    ELSIF NEW.pending_reason IS DISTINCT FROM OLD.pending_reason THEN
        NEW.wait_reason := NEW.pending_reason;      -- written by N
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER operations_wait_reason_sync BEFORE INSERT OR UPDATE ON operations
    FOR EACH ROW EXECUTE FUNCTION operations_wait_reason_sync();
"""


def upgrade() -> None:
    if defects.enabled("contract-too-early"):
        op.execute("ALTER TABLE operations RENAME COLUMN pending_reason TO wait_reason;")
        return
    op.execute("ALTER TABLE operations ADD COLUMN wait_reason text;")
    op.execute(SYNC)
    # small tables here; a large one would backfill in batches outside this transaction
    op.execute("UPDATE operations SET wait_reason = pending_reason "
               "WHERE pending_reason IS NOT NULL;")


def downgrade() -> None:
    # Back to the N schema whichever upgrade ran (the defect's rename included).
    op.execute("""
    DO $$
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM information_schema.columns
                       WHERE table_name = 'operations' AND column_name = 'pending_reason'
                         AND table_schema = current_schema()) THEN
            ALTER TABLE operations RENAME COLUMN wait_reason TO pending_reason;
        ELSE
            DROP TRIGGER IF EXISTS operations_wait_reason_sync ON operations;
            ALTER TABLE operations DROP COLUMN wait_reason;
        END IF;
        DROP FUNCTION IF EXISTS operations_wait_reason_sync();
    END $$;
    """)
