-- Messages due later (waiting for a retry's backoff or a delay) per topic,
-- beside the shared backlog measurement: a JSON object of topic to count, and
-- the measurement it belongs to. Relays of earlier releases rewrite stats and
-- measured_at without it, so a reader believes it only while due_later_at
-- equals measured_at. A new nullable column: instant, and the table holds one
-- row.
ALTER TABLE outbox_backlog ADD COLUMN IF NOT EXISTS due_later jsonb;
ALTER TABLE outbox_backlog ADD COLUMN IF NOT EXISTS due_later_at timestamptz;
