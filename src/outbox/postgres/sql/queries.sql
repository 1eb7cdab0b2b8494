-- Every query the PostgreSQL store runs. Each starts with a `-- name --`
-- header and a one-line description; parameters are named, and the current
-- time is always passed in (%(now)s), never read with now(), so the relay's
-- clock stays injectable.

-- message_insert --
-- Add a message; it is first due at its creation time.
INSERT INTO outbox_messages (id, topic, payload, created_at, due_at)
VALUES (%(id)s, %(topic)s, %(payload)s::json, %(created_at)s, %(created_at)s);

-- message_claim --
-- Lease up to %(limit)s due messages, earliest due first, until %(leased_until)s.
--
-- Two claimers can never get the same row. FOR UPDATE locks every row the
-- selection returns until the claiming statement's transaction ends, and SKIP
-- LOCKED makes a concurrent claimer pass over rows another claimer holds
-- instead of waiting for them. A claimer whose snapshot predates another
-- claim's commit re-checks each row it locks against the newest committed
-- version (READ COMMITTED re-evaluates the WHERE clause on locked rows); that
-- version's due_at is the other lease's end, in the future, so the row drops
-- out. MATERIALIZED fences the limited, locked selection: without it the
-- planner may inline the CTE into the UPDATE and lock and update more rows
-- than the limit.
WITH due AS MATERIALIZED (
    SELECT id, due_at
    FROM outbox_messages
    WHERE buried_at IS NULL AND due_at <= %(now)s
    ORDER BY due_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox_messages AS m
SET attempts = m.attempts + 1,
    due_at = %(leased_until)s,
    leased_until = %(leased_until)s
FROM due
WHERE m.id = due.id
RETURNING m.id, m.topic, m.payload::text, m.created_at, m.attempts, due.due_at;

-- message_ack --
-- Remove a delivered message.
DELETE FROM outbox_messages WHERE id = %(id)s;

-- message_ack_many --
-- Remove a batch of delivered messages in one round trip.
DELETE FROM outbox_messages WHERE id = ANY(%(ids)s);

-- message_retry --
-- End a message's lease and make it due again at %(at)s, keeping the reason.
UPDATE outbox_messages
SET due_at = %(at)s, leased_until = NULL, last_error = %(reason)s
WHERE id = %(id)s;

-- message_bury --
-- Stop delivering a message; keep it and the reason for an operator.
UPDATE outbox_messages
SET buried_at = %(at)s, leased_until = NULL, last_error = %(reason)s
WHERE id = %(id)s;

-- message_release --
-- Hand leased messages back, due at %(now)s, without counting the attempt.
UPDATE outbox_messages
SET due_at = %(now)s, leased_until = NULL, attempts = greatest(attempts - 1, 0)
WHERE id = ANY(%(ids)s) AND buried_at IS NULL;

-- message_get --
-- One message with its delivery state.
SELECT id, topic, payload::text, created_at, attempts,
       due_at, leased_until, last_error, buried_at
FROM outbox_messages
WHERE id = %(id)s;
