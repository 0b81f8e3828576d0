"""Token expiry and revocation: every token has an expiry (existing tokens get 90 days from
this migration) and may be revoked; a revoked token's row stays, so a refusal can say when it
was revoked and an audit can say who held what.

Revision ID: 0003
"""
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    ALTER TABLE tokens
        ADD COLUMN expires_at timestamptz NOT NULL DEFAULT now() + interval '90 days',
        ADD COLUMN revoked_at timestamptz;
    """)


def downgrade() -> None:
    op.execute("ALTER TABLE tokens DROP COLUMN revoked_at, DROP COLUMN expires_at;")
