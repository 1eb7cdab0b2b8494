-- Requeueing a buried message keeps its last error and counts the requeue,
-- so `outbox buried show` still tells why it was buried before.
ALTER TABLE outbox_messages ADD COLUMN IF NOT EXISTS requeues integer NOT NULL DEFAULT 0;
ALTER TABLE outbox_messages ADD COLUMN IF NOT EXISTS requeued_at timestamptz;
