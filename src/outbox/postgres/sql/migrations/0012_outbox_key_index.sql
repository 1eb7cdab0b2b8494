-- outbox: no transaction
-- Serves the head check (is there an earlier live message of this key?) and
-- finding the next message of a key to unpark. Keyed messages only: an
-- unkeyed insert enters no more indexes than before.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_key_idx
    ON outbox_messages (topic, key, seq)
    WHERE key IS NOT NULL;
