-- outbox: no transaction
-- Index builds run CONCURRENTLY, outside a transaction: producers keep
-- inserting while they run.
-- A claim leaves due_at alone, so a message keeps its place in line while a
-- relay holds it. The claim index then holds only the rows no lease holds:
-- the rows in flight leave it while they are leased, instead of sitting at
-- its front where every claim would step over them one by one. Orphans (a
-- lease that ran out unsettled) are found through the small index of leased
-- rows.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_ready_idx
    ON outbox_messages (due_at, id)
    WHERE buried_at IS NULL AND leased_until IS NULL;

CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_leased_idx
    ON outbox_messages (leased_until)
    WHERE buried_at IS NULL AND leased_until IS NOT NULL;

DROP INDEX CONCURRENTLY IF EXISTS outbox_messages_due_idx;
