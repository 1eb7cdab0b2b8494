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
--
-- Topics in %(exclude)s (paused ones) are filtered out while the index is
-- walked in due order; the walk passes over their due rows, so a large paused
-- backlog at the head of the queue costs a claim that many index entries.
-- An index led by topic could skip them but could not give the global due
-- order a claim needs.
WITH due AS MATERIALIZED (
    SELECT id, due_at
    FROM outbox_messages
    WHERE buried_at IS NULL
      AND due_at <= %(now)s
      AND NOT (topic = ANY(%(exclude)s::text[]))
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
       due_at, leased_until, last_error, buried_at, requeues, requeued_at
FROM outbox_messages
WHERE id = %(id)s;

-- buried_list --
-- Buried messages, newest first, optionally of one topic and buried since a time.
SELECT id, topic, payload::text, created_at, attempts,
       due_at, leased_until, last_error, buried_at, requeues, requeued_at
FROM outbox_messages
WHERE buried_at IS NOT NULL
  AND (%(topic)s::text IS NULL OR topic = %(topic)s)
  AND (%(since)s::timestamptz IS NULL OR buried_at >= %(since)s)
ORDER BY buried_at DESC, id DESC
LIMIT %(limit)s;

-- buried_requeue --
-- Make buried messages due at %(now)s with attempts reset; keep the last error.
-- Only buried rows match, so running it twice changes nothing the second time.
UPDATE outbox_messages
SET buried_at = NULL,
    due_at = %(now)s,
    attempts = 0,
    leased_until = NULL,
    requeues = requeues + 1,
    requeued_at = %(now)s
WHERE buried_at IS NOT NULL
  AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s))
  AND (%(topic)s::text IS NULL OR topic = %(topic)s)
RETURNING id;

-- buried_purge --
-- Delete buried messages buried before %(before)s.
DELETE FROM outbox_messages
WHERE buried_at IS NOT NULL
  AND buried_at < %(before)s
  AND (%(topic)s::text IS NULL OR topic = %(topic)s);

-- topic_stats --
-- Backlog per topic: pending and buried counts, the oldest pending message.
-- A scan of the whole table: run it every few seconds, not per message.
SELECT topic,
       count(*) FILTER (WHERE buried_at IS NULL) AS pending,
       count(*) FILTER (WHERE buried_at IS NOT NULL) AS buried,
       min(created_at) FILTER (WHERE buried_at IS NULL) AS oldest_pending
FROM outbox_messages
GROUP BY topic
ORDER BY topic;

-- topic_list --
-- The whole topic registry.
SELECT topic, enabled, handler, config, max_attempts, timeout, source, updated_at
FROM outbox_topics
ORDER BY topic;

-- topic_upsert --
-- Create or replace one topic's registry entry.
INSERT INTO outbox_topics (topic, enabled, handler, config, max_attempts, timeout, source, updated_at)
VALUES (%(topic)s, %(enabled)s, %(handler)s, %(config)s, %(max_attempts)s, %(timeout)s,
        %(source)s, %(now)s)
ON CONFLICT (topic) DO UPDATE
SET enabled = excluded.enabled,
    handler = excluded.handler,
    config = excluded.config,
    max_attempts = excluded.max_attempts,
    timeout = excluded.timeout,
    source = excluded.source,
    updated_at = excluded.updated_at;

-- topic_delete --
-- Remove a topic's registry entry (it falls back to its built-in handler).
DELETE FROM outbox_topics WHERE topic = %(topic)s;
