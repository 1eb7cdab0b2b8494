-- outbox: no transaction
-- Index builds run CONCURRENTLY, outside a transaction: producers keep
-- inserting while they run.
-- The rows no lease holds, topic by topic, in the order they are claimed. A
-- relay that claims a few topics reads each topic's front here, so a backlog
-- of other topics (paused, or served only by other relays) is never walked.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_topic_ready_idx
    ON outbox_messages (topic, due_at, id)
    WHERE buried_at IS NULL AND leased_until IS NULL;
