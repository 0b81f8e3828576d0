"""Held queues: a queue's concurrency may be 0, which holds its work (accepted and stored,
never routed: controlplane/store/queues.py). A CHECK constraint is relaxed (no row changes),
and the waiting work is indexed by queue as well, so that a routing pass reads the waiting
work of the queues it routes and not a held backlog (measured: 20,009 rows read per pass with
20,000 held operations through ``operations_waiting`` alone, tests/controlplane/
test_held_queue.py). Release N+1's expand (0009) follows on top of it unchanged.

Revision ID: 0006
"""
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE queues DROP CONSTRAINT IF EXISTS queues_concurrency_check,"
               " ADD CONSTRAINT queues_concurrency_check CHECK (concurrency >= 0)")
    op.execute("CREATE INDEX IF NOT EXISTS operations_waiting_queue ON operations"
               " (queue, state, created_at) WHERE state IN ('accepted','queued','blocked')")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS operations_waiting_queue")
    # a held queue cannot be expressed before this revision: it gets a concurrency of 1
    op.execute("UPDATE queues SET concurrency = 1 WHERE concurrency = 0")
    op.execute("ALTER TABLE queues DROP CONSTRAINT IF EXISTS queues_concurrency_check,"
               " ADD CONSTRAINT queues_concurrency_check CHECK (concurrency > 0)")
