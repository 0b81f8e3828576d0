"""Pipelines: a DAG of steps submitted with one Idempotency-Key; each started step is an
ordinary operation. Step rows keep the completion manifest a downstream step starts from;
the cache maps a step's cache key (controlplane/pipelines/cache_key.py) to the manifest of the
run that produced it, per project.

Revision ID: 0004
"""
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    CREATE TABLE pipelines (
        id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
        project_id uuid NOT NULL REFERENCES projects(id),
        idempotency_key text NOT NULL,
        payload_hash text NOT NULL,
        name text NOT NULL,
        spec jsonb NOT NULL,
        state text NOT NULL CHECK (state IN ('running','succeeded','failed')),
        state_reason text,
        report jsonb,
        created_at timestamptz NOT NULL DEFAULT now(),
        updated_at timestamptz NOT NULL DEFAULT now(),
        UNIQUE (project_id, idempotency_key)
    );
    CREATE INDEX pipelines_running ON pipelines (created_at) WHERE state = 'running';
    CREATE TABLE pipeline_steps (
        pipeline_id uuid NOT NULL REFERENCES pipelines(id),
        name text NOT NULL,
        position int NOT NULL,
        state text NOT NULL CHECK (state IN
            ('waiting','running','succeeded','reused','failed','skipped')),
        state_reason text,
        operation_id uuid REFERENCES operations(id),
        cache_key text,
        inputs jsonb,
        manifest jsonb,
        report jsonb,
        started_at timestamptz,
        finished_at timestamptz,
        updated_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (pipeline_id, name)
    );
    CREATE INDEX pipeline_steps_operation ON pipeline_steps (operation_id);
    CREATE TABLE pipeline_cache (
        project_id uuid NOT NULL REFERENCES projects(id),
        cache_key text NOT NULL,
        components jsonb NOT NULL,
        manifest jsonb NOT NULL,
        source_pipeline_id uuid NOT NULL REFERENCES pipelines(id),
        source_step text NOT NULL,
        source_operation_id uuid NOT NULL REFERENCES operations(id),
        created_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (project_id, cache_key)
    );
    """)


def downgrade() -> None:
    op.execute("DROP TABLE pipeline_cache; DROP TABLE pipeline_steps; DROP TABLE pipelines;")
