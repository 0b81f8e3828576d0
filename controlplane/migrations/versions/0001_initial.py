"""Initial schema: projects, tokens, queues, agents, operations, attempts, events, side effects.

Revision ID: 0001
"""
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

STATES = "'accepted','queued','dispatched','running','retrying','blocked','canceled','succeeded','failed'"
ATTEMPT_STATES = "'dispatched','running','succeeded','failed','lost','canceled'"


def upgrade() -> None:
    op.execute(f"""
    CREATE TABLE projects (
        id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
        name text NOT NULL UNIQUE,
        created_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE tokens (
        token_hash text PRIMARY KEY,
        role text NOT NULL CHECK (role IN ('user','agent','admin')),
        project_id uuid REFERENCES projects(id),
        created_at timestamptz NOT NULL DEFAULT now(),
        CHECK ((role = 'user') = (project_id IS NOT NULL))
    );
    CREATE TABLE queues (
        name text PRIMARY KEY,
        priority int NOT NULL DEFAULT 0,
        concurrency int NOT NULL DEFAULT 100 CHECK (concurrency > 0)
    );
    CREATE TABLE agents (
        id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
        name text NOT NULL UNIQUE,
        pool text NOT NULL, zone text NOT NULL, region text NOT NULL,
        cpu_slots int NOT NULL,
        accelerator_type text,
        accelerator_count int NOT NULL DEFAULT 0,
        datasets text[] NOT NULL DEFAULT '{{}}',
        registries text[] NOT NULL DEFAULT '{{}}',
        registered_at timestamptz NOT NULL DEFAULT now(),
        last_heartbeat_at timestamptz NOT NULL DEFAULT now(),
        consecutive_failures int NOT NULL DEFAULT 0,
        breaker_open_until timestamptz,
        breaker_override text CHECK (breaker_override IN ('open','closed'))
    );
    CREATE SEQUENCE fencing_tokens;
    CREATE TABLE operations (
        id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
        project_id uuid NOT NULL REFERENCES projects(id),
        idempotency_key text NOT NULL,
        payload_hash text NOT NULL,
        name text NOT NULL,
        queue text NOT NULL REFERENCES queues(name),
        priority int NOT NULL DEFAULT 0,
        spec jsonb NOT NULL,
        state text NOT NULL CHECK (state IN ({STATES})),
        state_reason text,
        pending_reason text,
        attempt_count int NOT NULL DEFAULT 0,
        max_retries int NOT NULL,
        timeout_seconds int NOT NULL,
        current_attempt_id uuid,
        pinned_agent text,
        next_eligible_at timestamptz,
        waiting_since timestamptz NOT NULL DEFAULT now(),
        last_error jsonb,
        first_error jsonb,
        result jsonb,
        created_at timestamptz NOT NULL DEFAULT now(),
        updated_at timestamptz NOT NULL DEFAULT now(),
        UNIQUE (project_id, idempotency_key)
    );
    CREATE INDEX operations_waiting ON operations (state, next_eligible_at)
        WHERE state IN ('accepted','queued','blocked','retrying');
    CREATE INDEX operations_list ON operations (project_id, created_at, id);
    CREATE TABLE attempts (
        id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
        operation_id uuid NOT NULL REFERENCES operations(id),
        number int NOT NULL,
        agent_id uuid NOT NULL REFERENCES agents(id),
        state text NOT NULL CHECK (state IN ({ATTEMPT_STATES})),
        fencing_token bigint,
        lease_expires_at timestamptz NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        claimed_at timestamptz,
        started_at timestamptz,
        finished_at timestamptz,
        last_progress_at timestamptz,
        progress jsonb,
        error jsonb,
        result jsonb,
        UNIQUE (operation_id, number)
    );
    CREATE INDEX attempts_active ON attempts (agent_id, state) WHERE state IN ('dispatched','running');
    CREATE INDEX attempts_lease ON attempts (lease_expires_at) WHERE state IN ('dispatched','running');
    CREATE TABLE events (
        id bigserial PRIMARY KEY,
        operation_id uuid NOT NULL,
        attempt_id uuid,
        time timestamptz NOT NULL DEFAULT clock_timestamp(),
        actor text NOT NULL,
        kind text NOT NULL,
        from_state text,
        to_state text,
        reason text,
        data jsonb
    );
    CREATE INDEX events_operation ON events (operation_id, id);
    CREATE TABLE side_effects (
        operation_id uuid NOT NULL REFERENCES operations(id),
        action_id text NOT NULL,
        kind text NOT NULL,
        payload jsonb NOT NULL,
        receipt jsonb NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (operation_id, action_id)
    );
    """)


def downgrade() -> None:
    op.execute("""
    DROP TABLE side_effects; DROP TABLE events; DROP TABLE attempts; DROP TABLE operations;
    DROP SEQUENCE fencing_tokens; DROP TABLE agents; DROP TABLE queues; DROP TABLE tokens;
    DROP TABLE projects;
    """)
