-- The topic registry: one row per governed topic. The controller (or
-- `outbox topics`) writes it; every relay reads it at most once an interval.
-- A topic without a row is delivered by its built-in handler with the
-- OUTBOX_* defaults, or buried with "no handler" when it has none.
CREATE TABLE IF NOT EXISTS outbox_topics (
    topic        text        PRIMARY KEY,
    enabled      boolean     NOT NULL DEFAULT true,
    handler      text,
    config       jsonb       NOT NULL DEFAULT '{}'::jsonb,
    max_attempts integer     CHECK (max_attempts >= 1),
    timeout      interval    CHECK (timeout > interval '0'),
    source       text,
    updated_at   timestamptz NOT NULL
);
