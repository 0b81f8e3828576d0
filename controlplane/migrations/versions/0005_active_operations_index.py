"""A partial index over the operations in an active state (dispatched, running).

Every routing pass counts each queue's active operations (its concurrency limit), and the
reconciler's gauges count every open state. The waiting states already had an index
(``operations_waiting``); the active ones had none, so both counts read the whole table: a
cost that grew with every operation ever submitted, on every pass, busy or idle (measured
with 500,000 operations: 91.5 ms per routing pass without this index, 0.2 ms with it;
docs/DESIGN.md section 4.3).
Rows leave the index when they finish, so it stays as small as the work in flight.

A plain CREATE INDEX (it blocks writes to ``operations`` while it builds): the tables here are
small. A large one would be indexed CONCURRENTLY, outside the migration's transaction.

Revision ID: 0005
"""
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE INDEX IF NOT EXISTS operations_active ON operations (state, queue)"
               " WHERE state IN ('dispatched','running');")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS operations_active;")
