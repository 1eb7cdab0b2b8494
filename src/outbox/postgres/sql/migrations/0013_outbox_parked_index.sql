-- outbox: no transaction
-- Serves key_unpark: the messages a claim parked (leased until 'infinity'
-- behind an earlier message of their key), by key. Nothing else enters it, so
-- neither producers nor claims that park nothing pay for it, and the ack of a
-- key with nothing parked (the common case) costs one look into an empty range
-- instead of a walk to the key's next message.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_parked_idx
    ON outbox_messages (topic, key, seq)
    WHERE leased_until = 'infinity';
