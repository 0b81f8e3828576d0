"""Operation redirects: an operation id a database restore could not re-create under its own
id (its idempotency key was re-used for another operation after the restore) answers with a
308 to the operation that holds the key now.

Revision ID: 0002
"""
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    CREATE TABLE operation_redirects (
        old_id uuid PRIMARY KEY,
        new_id uuid NOT NULL REFERENCES operations(id),
        project_id uuid NOT NULL REFERENCES projects(id),
        idempotency_key text NOT NULL,
        restore_id text NOT NULL,
        acknowledged_at timestamptz NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        CHECK (old_id <> new_id)
    );
    """)


def downgrade() -> None:
    op.execute("DROP TABLE operation_redirects;")
