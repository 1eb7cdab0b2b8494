-- The outbox table. One row per message until it is delivered (then deleted)
-- or buried (then kept, with its last error, for an operator).
--
-- due_at is the single time that decides when a row can be claimed: its
-- creation time at first, the lease's end while a relay holds it, the retry
-- time after a failure. So "due" is one comparison and one index serves claim.
CREATE TABLE IF NOT EXISTS outbox_messages (
    id           uuid        PRIMARY KEY,
    topic        text        NOT NULL,
    payload      json        NOT NULL,
    created_at   timestamptz NOT NULL,
    due_at       timestamptz NOT NULL,
    attempts     integer     NOT NULL DEFAULT 0,
    leased_until timestamptz,
    last_error   text,
    buried_at    timestamptz
);

-- Serves message_claim: the live rows in the order they are claimed. Buried
-- rows are left out, so a backlog of them never slows a claim down.
CREATE INDEX IF NOT EXISTS outbox_messages_due_idx
    ON outbox_messages (due_at, id)
    WHERE buried_at IS NULL;

-- Serves listing and purging buried messages.
CREATE INDEX IF NOT EXISTS outbox_messages_buried_idx
    ON outbox_messages (buried_at)
    WHERE buried_at IS NOT NULL;
