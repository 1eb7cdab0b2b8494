-- The last backlog measurement: pending and buried counts and the oldest
-- pending message per topic, as one JSON array. Counting means reading the
-- whole table, so one relay at a time measures (under an advisory lock) and
-- writes it here; the other relays and the controller read this row.
CREATE TABLE IF NOT EXISTS outbox_backlog (
    id          boolean     PRIMARY KEY DEFAULT true CHECK (id),
    measured_at timestamptz NOT NULL,
    stats       jsonb       NOT NULL
);
