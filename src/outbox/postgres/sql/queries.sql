-- Every query the PostgreSQL store runs. Each starts with a `-- name --`
-- header and a one-line description; parameters are named. The current time
-- is the database's, coalesce(%(now)s, now()): production passes NULL, so
-- every relay shares one clock; tests pass the time of their injected clock.

-- message_insert --
-- Add a message; it is first due at its deliver_at, or else its creation time.
INSERT INTO outbox_messages (id, topic, payload, created_at, due_at)
VALUES (%(id)s, %(topic)s, %(payload)s::json, %(created_at)s,
        coalesce(%(deliver_at)s::timestamptz, %(created_at)s));

-- message_insert_full_one --
-- Add one message with a key or headers: a keyed one takes its place in its
-- key from outbox_messages_seq.
INSERT INTO outbox_messages (id, topic, payload, created_at, due_at, key, seq, headers)
VALUES (%(id)s, %(topic)s, %(payload)s::json, %(created_at)s,
        coalesce(%(deliver_at)s::timestamptz, %(created_at)s), %(key)s,
        CASE WHEN %(key)s::text IS NOT NULL THEN nextval('outbox_messages_seq') END,
        %(headers)s::json);

-- message_insert_many --
-- Add several messages in one statement (one round trip); each is first due
-- at its deliver_at, or else its creation time. Written with CAST() and no
-- `::`, so the same statement serves SQLAlchemy and Django placeholders.
INSERT INTO outbox_messages (id, topic, payload, created_at, due_at)
SELECT m.id, m.topic, CAST(m.payload AS json), m.created_at, m.due_at
FROM unnest(CAST(%(ids)s AS uuid[]), CAST(%(topics)s AS text[]), CAST(%(payloads)s AS text[]),
            CAST(%(created)s AS timestamptz[]), CAST(%(due)s AS timestamptz[]))
     AS m(id, topic, payload, created_at, due_at);

-- message_insert_full --
-- Add several messages, some with a key or headers (message_insert_many's
-- form): a keyed message takes its place in its key from
-- outbox_messages_seq, in the order given (volatile output is computed after
-- the ORDER BY); an unkeyed one calls nothing.
INSERT INTO outbox_messages (id, topic, payload, created_at, due_at, key, seq, headers)
SELECT m.id, m.topic, CAST(m.payload AS json), m.created_at, m.due_at, m.key,
       CASE WHEN m.key IS NULL THEN NULL ELSE nextval('outbox_messages_seq') END,
       CAST(m.headers AS json)
FROM unnest(CAST(%(ids)s AS uuid[]), CAST(%(topics)s AS text[]), CAST(%(payloads)s AS text[]),
            CAST(%(created)s AS timestamptz[]), CAST(%(due)s AS timestamptz[]),
            CAST(%(keys)s AS text[]), CAST(%(headers)s AS text[]))
     WITH ORDINALITY AS m(id, topic, payload, created_at, due_at, key, headers, n)
ORDER BY m.n;

-- message_claim --
-- Lease up to %(limit)s due messages, earliest due first, for %(lease)s under
-- a fresh %(token)s; report the orphans it left.
--
-- Two claimers can never get the same row. FOR UPDATE locks every row the
-- selection returns until the claiming statement's transaction ends, and SKIP
-- LOCKED makes a concurrent claimer pass over rows another claimer holds
-- instead of waiting for them. A claimer whose snapshot predates another
-- claim's commit re-checks each row it locks against the newest committed
-- version (READ COMMITTED re-evaluates the WHERE clause on locked rows); that
-- version's leased_until is the other lease's end, in the future, so the row
-- drops out.
--
-- A claim leaves due_at alone: a message keeps its place in line while it is
-- leased, so one whose relay died is claimed again (once its lease ends) ahead
-- of everything that became due after it, not behind the backlog. Rows no
-- lease holds come from the ready index (rows in flight are not in it, so a
-- claim never steps over them); orphans from the small index of leased rows.
-- MATERIALIZED fences each limited, locked selection: without it the planner
-- may inline the CTE into the UPDATE and lock and update more rows than the
-- limit.
--
-- Time is the database's (now()) unless a test passes %(now)s, so a relay
-- with a skewed clock cannot cut another relay's lease short or write a
-- lease that has already ended: relays pass durations, never instants.
--
-- %(topics)s (NULL: every topic) are the topics the relay can deliver now,
-- joined by commas (a topic name has none): one text parameter costs the
-- relay far less to send than an array of a thousand, and `IN (SELECT
-- unnest(...))` is one hashed look-up per row for the executor and nothing
-- for the planner to estimate, where `= ANY(array)` made the planner weigh
-- every element of the array on every claim;
-- %(capped)s are topics claimed at most %(caps)s each (their maxInFlight
-- headroom). An orphan is a due row whose lease ran out unsettled (its relay
-- died or stalled). With %(isolate)s it is left for a %(solo)s claim, which
-- takes only orphans, so the one that kills its relay is found on its own
-- (and nothing behind it in line is claimed before it);
-- a solo claim of an orphan whose lease was shared does not count the lost
-- attempt: another message may have been the one that crashed.
--
-- %(after)s (NULL: none) is a low-watermark on the ready rows' order: the
-- ready index is read from there, so a claim does not walk the entries of
-- what earlier claims passed, which a held snapshot keeps from being vacuumed
-- (each is a heap visit that finds nothing). The leased rows' index is read
-- from there too: every message acked under the snapshot left an entry whose
-- lease has ended, and an orphan whose lease ended before the watermark was
-- there for the claims since (what SKIP LOCKED or a cap passed over waits
-- for the next claim without one). The picked rows' due times are returned,
-- for the next watermark.
-- %(a)s is the watermark, '-infinity' for none. Each read's bounds are
-- written out, not read from t (the statement's time for its writes): a
-- bound the planner can see makes it expect the rows a claim finds, so it
-- reads the partitions of the ring (%(slots)s, below) index by index in
-- order and stops at the limit, where bounds it cannot see made it expect a
-- few and sort them all.
--
-- %(slots)s are the partitions of the outbox's ring a claim reads
-- (outbox.postgres.ring): a constant, so the planner prunes the others and
-- plans one partition where it could plan three. Each row's slot is
-- returned: the relay's write-backs go to that partition alone.
-- (Each form of the statement stays under the 4,096 bytes psycopg caches
-- the parse of.)
WITH t AS MATERIALIZED (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
),
ready AS MATERIALIZED (
    SELECT id, due_at, false AS orphan, octet_length(payload::text) AS size,
           key, seq, slot, topic
    FROM outbox_messages
    WHERE NOT %(by_topic)s AND buried_at IS NULL AND leased_until IS NULL AND slot = ANY(%(slots)s::int2[])
      AND due_at BETWEEN %(a)s::timestamptz AND coalesce(%(now)s::timestamptz, now())
      AND (%(topics)s::text IS NULL OR topic IN (SELECT unnest(string_to_array(%(topics)s::text, ','))))
      AND NOT %(solo)s
    ORDER BY due_at, id
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
),
-- The same rows, found topic by topic (%(by_topic)s: a few topics), so rows of
-- topics not in %(topics)s are never walked; the merge below restores the order.
ready_by_topic AS MATERIALIZED (
    SELECT c.*, k.topic
    FROM unnest(CASE WHEN %(by_topic)s AND NOT %(solo)s
                     THEN string_to_array(%(topics)s::text, ',') END) AS k(topic)
    CROSS JOIN LATERAL (
        SELECT id, due_at, false AS orphan, octet_length(payload::text) AS size, key, seq, slot
        FROM outbox_messages
        WHERE buried_at IS NULL AND leased_until IS NULL AND slot = ANY(%(slots)s::int2[])
          AND due_at BETWEEN %(a)s::timestamptz AND coalesce(%(now)s::timestamptz, now())
          AND topic = k.topic
        ORDER BY due_at, id
        LIMIT %(limit)s
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS c
),
orphans AS MATERIALIZED (
    SELECT id, due_at, true AS orphan, octet_length(payload::text) AS size,
           key, seq, slot, topic
    FROM outbox_messages
    WHERE buried_at IS NULL AND slot = ANY(%(slots)s::int2[]) AND leased_until BETWEEN %(a)s::timestamptz AND coalesce(%(now)s::timestamptz, now())
      AND (%(topics)s::text IS NULL OR topic IN (SELECT unnest(string_to_array(%(topics)s::text, ','))))
    ORDER BY due_at, id
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
),
capped AS MATERIALIZED (
    SELECT c.*, k.topic
    FROM unnest(%(capped)s::text[], %(caps)s::integer[]) AS k(topic, n)
    CROSS JOIN LATERAL (
        SELECT * FROM (
            SELECT id, due_at, false AS orphan,
                   octet_length(payload::text) AS size, key, seq, slot
            FROM outbox_messages
            WHERE buried_at IS NULL AND leased_until IS NULL AND slot = ANY(%(slots)s::int2[])
              AND due_at BETWEEN %(a)s::timestamptz AND coalesce(%(now)s::timestamptz, now())
              AND topic = k.topic
              AND NOT %(solo)s
            ORDER BY due_at, id
            LIMIT k.n
            FOR NO KEY UPDATE SKIP LOCKED
        ) AS r
        UNION ALL
        SELECT * FROM (
            SELECT id, due_at, true AS orphan, octet_length(payload::text) AS size,
                   key, seq, slot
            FROM outbox_messages
            WHERE buried_at IS NULL AND slot = ANY(%(slots)s::int2[]) AND leased_until BETWEEN %(a)s::timestamptz AND coalesce(%(now)s::timestamptz, now())
              AND topic = k.topic
            ORDER BY due_at, id
            LIMIT k.n
            FOR NO KEY UPDATE SKIP LOCKED
        ) AS o
        ORDER BY due_at, id
        LIMIT k.n
    ) AS c
),
candidates AS MATERIALIZED (
    SELECT * FROM ready
    UNION ALL
    SELECT * FROM ready_by_topic
    UNION ALL
    SELECT * FROM orphans
    UNION ALL
    SELECT * FROM capped
    ORDER BY due_at, id
    LIMIT %(limit)s
),
-- A keyed candidate behind an earlier message of its key that is not acked
-- (nor buried, where its topic skips buried messages) waits: it is parked
-- (leased until 'infinity', no token), so no claim walks it again until the
-- head's ack unparks it. The earlier rows are read FOR KEY SHARE: an ack in
-- progress is waited for (then the row is gone), and a retry or burial that
-- committed after this statement began is seen as it is now. Candidates are
-- locked FOR NO KEY UPDATE, which these share-locks do not wait for.
behind AS MATERIALIZED (
    SELECT c.id FROM candidates AS c
    WHERE c.key IS NOT NULL AND EXISTS (
        SELECT 1 FROM outbox_messages AS e
        WHERE e.topic = c.topic AND e.key = c.key AND e.seq < c.seq
          AND (e.buried_at IS NULL
               OR e.topic NOT IN (SELECT topic FROM outbox_topics WHERE on_buried = 'skip'))
        FOR KEY SHARE OF e
    )
),
-- Bounded by bytes too: candidates in order while the payloads before them
-- add up to less than %(max_bytes)s (the first is always taken). The rest
-- stay unclaimed; their row locks end with the statement.
picked AS MATERIALIZED (
    SELECT id, due_at, orphan FROM (
        SELECT *, sum(size) OVER (ORDER BY due_at, id) - size AS b
        FROM candidates
        WHERE id NOT IN (SELECT id FROM behind)
    ) AS s
    WHERE %(max_bytes)s::bigint IS NULL OR s.b < %(max_bytes)s
),
first_orphan AS MATERIALIZED (
    SELECT due_at, id FROM picked WHERE orphan ORDER BY due_at, id LIMIT 1
),
-- One UPDATE claims what was picked and parks what waits behind a head (a
-- second data-modifying statement cost every claim a tenth, keys or none).
-- Rows are found by id through the primary key, and joined to nothing: a
-- join with the picked rows was planned, by the planner's guess of their
-- number, as a hash of the whole table or as a loop comparing every pair.
-- What the join brought is the row's own (locked above, so unchanged): an
-- orphan is a picked row under a lease (leased_until <= now), its lease_solo
-- the row's; a parked row is one of behind (a hashed look-up).
claimed AS (
    UPDATE outbox_messages AS m
    SET attempts = CASE
            WHEN m.id IN (SELECT id FROM behind)
                 OR %(solo)s AND m.leased_until IS NOT NULL AND NOT m.lease_solo THEN m.attempts
            ELSE m.attempts + 1
        END,
        leased_until = CASE WHEN m.id IN (SELECT id FROM behind) THEN 'infinity'
                            ELSE t.now + %(lease)s END,
        lease_token = CASE WHEN m.id NOT IN (SELECT id FROM behind) THEN %(token)s::uuid END,
        lease_solo = %(solo)s AND m.id NOT IN (SELECT id FROM behind)
    FROM t
    WHERE m.slot = ANY(%(slots)s::int2[])
      AND m.id = ANY(ARRAY(SELECT id FROM picked UNION ALL SELECT id FROM behind))
      -- Isolating, an orphan is left for a solo claim, and nothing behind it
      -- in line is taken before it is delivered (a parked row is not taken).
      AND (%(solo)s OR NOT %(isolate)s OR m.id IN (SELECT id FROM behind)
           OR m.leased_until IS NULL AND NOT EXISTS (
               SELECT 1 FROM first_orphan AS f WHERE (m.due_at, m.id) > (f.due_at, f.id)))
    RETURNING m.id, m.topic, m.payload::text, m.created_at, m.attempts, m.key, m.seq, m.headers,
              m.slot, m.id IN (SELECT id FROM picked WHERE orphan), m.due_at
)
-- What was claimed (not what was parked), then each row picked and left
-- (its id NULL: an orphan left for a solo claim, or what was behind it), in
-- order; each side a hashed look-up, where a join of picked with claimed
-- was planned, by the planner's guess of their rows, as a loop comparing
-- every pair (16 ms for 400).
SELECT * FROM claimed WHERE id NOT IN (SELECT id FROM behind)
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, p.orphan, p.due_at
FROM picked AS p
WHERE p.id NOT IN (SELECT id FROM claimed)
ORDER BY 11, 1;

-- message_claim_run --
-- Lease, under the same %(token)s, the messages right after each key head a
-- claim just took (%(topics)s, %(keys)s, %(seqs)s: the heads), in order, while
-- each is due and waiting: up to %(run)s a key, %(limit)s and %(max_bytes)s in
-- all. The relay hands them over one after another, each only once the one
-- before it was acked, so a busy key is not one message a claim. Safe apart
-- from the claim: while this relay holds a key's head, no other claim leases
-- a later message of that key (it parks it), and only the head's ack unparks.
WITH clock AS MATERIALIZED (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
),
run AS MATERIALIZED (
    SELECT r.id FROM (
        SELECT f.id, h.n, f.seq,
               bool_and(f.ok) OVER (PARTITION BY h.n ORDER BY f.seq) AS whole,
               sum(f.size) OVER (ORDER BY h.n, f.seq) AS b
        FROM unnest(%(topics)s::text[], %(keys)s::text[], %(seqs)s::bigint[])
             WITH ORDINALITY AS h(topic, key, seq, n)
        CROSS JOIN LATERAL (
            SELECT e.id, e.seq, octet_length(e.payload::text) AS size,
                   e.buried_at IS NULL AND e.due_at <= (SELECT now FROM clock)
                   AND (e.leased_until IS NULL OR e.leased_until = 'infinity') AS ok
            FROM outbox_messages AS e
            WHERE e.topic = h.topic AND e.key = h.key AND e.seq > h.seq
            ORDER BY e.seq
            LIMIT %(run)s
        ) AS f
    ) AS r
    WHERE r.whole AND (%(max_bytes)s::bigint IS NULL OR r.b <= %(max_bytes)s)
    ORDER BY r.n, r.seq
    LIMIT %(limit)s
),
ran AS (
    UPDATE outbox_messages AS m
    SET attempts = m.attempts + 1,
        leased_until = (SELECT now FROM clock) + %(lease)s,
        lease_token = %(token)s,
        lease_solo = false
    -- By id through the primary key. A join with the CTE, or a condition the
    -- partial claim indexes match, may be planned as a walk of every waiting
    -- row (once per row of the run, for a join): tens of milliseconds.
    WHERE m.id = ANY(ARRAY(SELECT id FROM run))
      AND coalesce(m.leased_until, 'infinity') = 'infinity' AND m.buried_at IS NULL
    RETURNING m.id, m.topic, m.payload::text, m.created_at, m.attempts, m.key, m.seq, m.headers,
              m.slot
)
SELECT * FROM ran ORDER BY topic, key, seq;

-- message_ack_unkeyed --
-- message_ack_keyed for messages without a key: nothing to fence, nothing to
-- unpark. Returns the ids it did not remove (as a rule none: a short answer;
-- another relay acked them after their lease ran out, or an operator did).
WITH gone AS (
    DELETE FROM outbox_messages
    WHERE slot = ANY(%(slots)s::int2[]) AND id = ANY(%(ids)b::uuid[])
    RETURNING id
)
SELECT CASE WHEN (SELECT count(*) FROM gone) < cardinality(%(ids)b::uuid[]) THEN
           ARRAY(SELECT i FROM unnest(%(ids)b::uuid[]) AS i WHERE i NOT IN (SELECT id FROM gone))
       ELSE '{}' END;

-- message_ack_run --
-- message_ack_keyed for messages of a run, which need no unparking (each ack
-- lets the next message of its key start); returns the ids removed.
-- Committed without waiting for the WAL flush: visible to every session at
-- once, so a relay that dies after it leaves nothing to
-- redeliver; only a crash of PostgreSQL itself within a fraction of a second
-- (wal_writer_delay) may lose it, and then the key's messages from the
-- first lost ack on are delivered again, in order. set_config(..., true)
-- lasts until this statement's own commit: one round trip, nothing left on
-- the connection (safe behind a transaction pooler).
DELETE FROM outbox_messages
WHERE slot = ANY(%(slots)s::int2[]) AND id = ANY(%(ids)b::uuid[])
  AND (key IS NULL OR %(tokens)b::uuid[] IS NULL OR lease_token = ANY(%(tokens)b::uuid[]))
  AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'
RETURNING id;

-- message_ack_run_one --
-- message_ack_run for one message (a busy key's run acks one at a time):
-- scalar parameters, where a one-element array costs the relay a dump and
-- the server a scan of it; the row count says whether it was removed.
DELETE FROM outbox_messages
WHERE slot = %(slot)s::int2 AND id = %(id)s
  AND (key IS NULL OR %(token)s::uuid IS NULL OR lease_token = %(token)s::uuid)
  AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off';

-- message_ack_keyed --
-- Remove a batch of delivered messages, some keyed, in one round trip. A
-- message without a key is not fenced: once delivered it needs no further
-- delivery, whoever holds it now. A keyed one is removed only while one of
-- the leases %(tokens)s (the acking relay's; NULL: any) holds it: a relay
-- that stalled past its lease must not end the current holder's delivery
-- early, which would let the key's next message start beside it.
-- Ids go in binary (%(ids)b, as in the other batched writes): 16 bytes each,
-- no text to quote and parse. Returns the ids it did not remove (as a rule
-- none: a short answer) and leaves the removed keys, as key_unpark's pairs,
-- in the transaction's setting outbox.unpark. key_unpark follows in the
-- same transaction (pipelined: one round trip) and reads them there: the
-- DELETE waits for every claim that read a removed head FOR KEY SHARE, and
-- key_unpark, a statement of its own with a snapshot taken after that, sees
-- every message they parked; a claim that comes later waits for this
-- transaction and then finds the head gone. Ack and unpark commit together,
-- and the relay sends no key (a stale ack, which removes nothing, unparks
-- nothing). The pairs are in the rows' order, neither sorted nor distinct
-- (each would double the statement's cost): an ack unparks behind the keys
-- whose message it removed, and a key has one message in flight, so no two
-- acks unpark behind one key at once.
WITH gone AS (
    DELETE FROM outbox_messages
    WHERE slot = ANY(%(slots)s::int2[]) AND id = ANY(%(ids)b::uuid[])
      AND (key IS NULL OR %(tokens)b::uuid[] IS NULL OR lease_token = ANY(%(tokens)b::uuid[]))
    RETURNING id, topic, key
)
SELECT CASE WHEN (SELECT count(*) FROM gone) < cardinality(%(ids)b::uuid[]) THEN
           ARRAY(SELECT i FROM unnest(%(ids)b::uuid[]) AS i WHERE i NOT IN (SELECT id FROM gone))
       ELSE '{}' END,
       set_config('outbox.unpark', coalesce((
           SELECT json_agg(json_build_array(topic, key))::text FROM gone
           WHERE key IS NOT NULL), ''), true);

-- key_unpark --
-- Unpark the head of each key of %(pairs)s (a JSON array of [topic, key]
-- pairs: one text the relay's json module writes, where two text arrays cost
-- it a dump of every element; in the order given; NULL: the pairs
-- message_ack_keyed left earlier in this transaction): its first
-- message that is not acked (nor buried, where its topic skips buried ones),
-- if a claim parked it. Run after the ack, burial or purge that removed the
-- earlier head, in a statement of its own (after that one committed, or later
-- in its transaction, as message_ack_keyed's): a claim parks a message
-- only behind an earlier one it read FOR KEY SHARE, which the ack's or
-- purge's DELETE waits for, so every parking behind the removed head
-- committed before this statement began and is in its snapshot. The key's
-- first parked message (outbox_messages_parked_idx) is its head when nothing
-- live comes before it: a key with nothing parked costs one look into an
-- empty range of that index, and with nothing parked anywhere (a drain of
-- keys whose heads are acked before a claim reaches their next) the pairs
-- are not even read: one look into the empty index. Nothing is locked but
-- what is unparked.
UPDATE outbox_messages AS m SET leased_until = NULL
FROM (
    SELECT e->>0 AS topic, e->>1 AS key
    FROM json_array_elements(coalesce(
        %(pairs)s::json, nullif(current_setting('outbox.unpark', true), '')::json)) AS e
    WHERE EXISTS (SELECT FROM outbox_messages WHERE leased_until = 'infinity')
) AS k
CROSS JOIN LATERAL (
    SELECT p.id, p.seq FROM outbox_messages AS p
    WHERE p.topic = k.topic AND p.key = k.key AND p.leased_until = 'infinity'
      AND p.buried_at IS NULL
    ORDER BY p.seq
    LIMIT 1
) AS h
-- The head check is a subquery per parked key, never a join the planner may
-- turn into a walk of the whole table.
WHERE m.id = h.id AND m.leased_until = 'infinity'
  AND h.seq = (
      SELECT e.seq FROM outbox_messages AS e
      WHERE e.topic = k.topic AND e.key = k.key
        AND (e.buried_at IS NULL
             OR e.topic NOT IN (SELECT topic FROM outbox_topics WHERE on_buried = 'skip'))
      ORDER BY e.seq
      LIMIT 1);

-- message_retry --
-- An operator's write, unfenced: make one message due again at %(at)s,
-- keeping the reason. (A relay's write-backs are the fenced *_many ones.)
UPDATE outbox_messages
SET due_at = %(at)s, leased_until = NULL, last_error = %(reason)s
WHERE id = %(id)s;

-- message_retry_many --
-- Make messages due again after their delays, each only while its lease
-- token still holds it; returns the ids written (the rest lost their lease).
-- An uncounted retry gives the attempt back: the receiver failed, not the message.
UPDATE outbox_messages AS m
SET due_at = coalesce(%(now)s::timestamptz, now()) + o.delay,
    leased_until = NULL,
    last_error = o.reason,
    attempts = CASE WHEN o.counted THEN m.attempts ELSE greatest(m.attempts - 1, 0) END
FROM unnest(%(ids)b::uuid[], %(tokens)b::uuid[], %(delays)s::interval[], %(reasons)s::text[],
            %(counted)s::boolean[])
     AS o(id, token, delay, reason, counted)
WHERE m.slot = ANY(%(slots)s::int2[]) AND m.id = o.id AND m.lease_token = o.token
  AND m.buried_at IS NULL
RETURNING m.id;

-- message_bury --
-- An operator's write, unfenced: stop delivering one message and keep it
-- with the reason; returns its topic and key (key_unpark follows, for a
-- topic that skips past buried messages).
UPDATE outbox_messages
SET buried_at = coalesce(%(at)s::timestamptz, now()), leased_until = NULL,
    last_error = %(reason)s
WHERE id = %(id)s
RETURNING topic, key;

-- message_bury_many --
-- Bury messages, each only while its lease token still holds it; returns the
-- ids written.
UPDATE outbox_messages AS m
SET buried_at = coalesce(%(now)s::timestamptz, now()), leased_until = NULL,
    last_error = o.reason
FROM unnest(%(ids)b::uuid[], %(tokens)b::uuid[], %(reasons)s::text[]) AS o(id, token, reason)
WHERE m.slot = ANY(%(slots)s::int2[]) AND m.id = o.id AND m.lease_token = o.token
  AND m.buried_at IS NULL
RETURNING m.id, m.topic, m.key;

-- message_release --
-- Hand leased messages back, due at once in their old place in line, without
-- counting the attempt; a message with a token only while that lease still
-- holds it.
UPDATE outbox_messages AS m
SET leased_until = NULL,
    attempts = greatest(m.attempts - 1, 0)
FROM unnest(%(ids)b::uuid[], %(tokens)b::uuid[]) AS o(id, token)
WHERE m.slot = ANY(%(slots)s::int2[]) AND m.id = o.id
  AND m.buried_at IS NULL
  AND (o.token IS NULL OR m.lease_token = o.token)
RETURNING m.id;

-- message_get --
-- One message with its delivery state. A parked message's lease (leased until
-- 'infinity', which Python's datetime cannot hold) is NULL here, and the last
-- column says it is parked: message_list's columns, and buried_list's.
SELECT id, topic, payload::text, created_at, attempts,
       due_at, nullif(leased_until, 'infinity') AS leased_until, last_error, buried_at, requeues,
       requeued_at, octet_length(payload::text), key, headers,
       leased_until = 'infinity' AS parked
FROM outbox_messages
WHERE id = %(id)s;

-- message_list --
-- Messages in the order of their ids (time-ordered) after %(after)s (NULL:
-- from the first), of %(topic)s, %(key)s, %(state)s, a last error containing
-- %(error_contains)s and created (buried, of state buried) longer than
-- %(older_than)s ago (NULL: any): pending
-- (due, no lease), due_later, in_flight (leased; an orphan's lease has
-- ended), parked (behind an earlier message of its key) or buried. A page
-- of %(limit)s read on from the last one's id (no OFFSET); payloads stay in
-- the table: only their size is read. The caller bounds its time
-- (statement_timeout): a filter that matches little in a large outbox reads
-- it all.
SELECT id, topic, '' AS payload, created_at, attempts,
       due_at, nullif(leased_until, 'infinity') AS leased_until, last_error, buried_at, requeues,
       requeued_at, octet_length(payload::text), key, headers,
       leased_until = 'infinity' AS parked
FROM outbox_messages
WHERE (%(after)s::uuid IS NULL OR id > %(after)s)
  AND (%(topic)s::text IS NULL OR topic = %(topic)s)
  AND (%(key)s::text IS NULL OR key = %(key)s)
  AND (%(error_contains)s::text IS NULL
       OR strpos(lower(last_error), lower(%(error_contains)s)) > 0)
  AND (%(older_than)s::interval IS NULL
       OR CASE WHEN %(state)s::text = 'buried' THEN buried_at ELSE created_at END
          < coalesce(%(now)s::timestamptz, now()) - %(older_than)s::interval)
  AND CASE %(state)s::text
        WHEN 'pending' THEN buried_at IS NULL AND leased_until IS NULL
                            AND due_at <= coalesce(%(now)s::timestamptz, now())
        WHEN 'due_later' THEN buried_at IS NULL AND leased_until IS NULL
                              AND due_at > coalesce(%(now)s::timestamptz, now())
        WHEN 'in_flight' THEN buried_at IS NULL AND leased_until <> 'infinity'
        WHEN 'parked' THEN buried_at IS NULL AND leased_until = 'infinity'
        WHEN 'buried' THEN buried_at IS NOT NULL
        ELSE true
      END
ORDER BY id
LIMIT %(limit)s;

-- message_list_due --
-- message_list of the due (pending) or due later, in the order relays claim
-- them: by due time, then id, read from the index of ready rows (a topic's
-- from its topic index), the page after (%(after_due)s, %(after)s).
SELECT id, topic, '' AS payload, created_at, attempts,
       due_at, nullif(leased_until, 'infinity') AS leased_until, last_error, buried_at, requeues,
       requeued_at, octet_length(payload::text), key, headers,
       leased_until = 'infinity' AS parked
FROM outbox_messages
WHERE buried_at IS NULL AND leased_until IS NULL
  AND (%(state)s::text <> 'pending' OR due_at <= coalesce(%(now)s::timestamptz, now()))
  AND (%(state)s::text <> 'due_later' OR due_at > coalesce(%(now)s::timestamptz, now()))
  AND (%(after)s::uuid IS NULL OR (due_at, id) > (%(after_due)s::timestamptz, %(after)s::uuid))
  AND (%(topic)s::text IS NULL OR topic = %(topic)s)
  AND (%(key)s::text IS NULL OR key = %(key)s)
  AND (%(error_contains)s::text IS NULL
       OR strpos(lower(last_error), lower(%(error_contains)s)) > 0)
  AND (%(older_than)s::interval IS NULL
       OR created_at < coalesce(%(now)s::timestamptz, now()) - %(older_than)s::interval)
ORDER BY due_at, id
LIMIT %(limit)s;

-- message_list_buried --
-- message_list of the buried, newest burial first (where an operator looks):
-- read from the index of buried rows, the page after %(after)s continuing
-- from that message's burial (none: from the newest; no longer buried: an
-- empty page). Older than %(older_than)s: buried longer ago.
SELECT id, topic, '' AS payload, created_at, attempts,
       due_at, nullif(leased_until, 'infinity') AS leased_until, last_error, buried_at, requeues,
       requeued_at, octet_length(payload::text), key, headers,
       leased_until = 'infinity' AS parked
FROM outbox_messages
WHERE buried_at IS NOT NULL
  AND (%(after)s::uuid IS NULL
       OR (buried_at <= (SELECT buried_at FROM outbox_messages WHERE id = %(after)s)
           AND (buried_at, id) < (SELECT buried_at, id FROM outbox_messages
                                  WHERE id = %(after)s)))
  AND (%(topic)s::text IS NULL OR topic = %(topic)s)
  AND (%(key)s::text IS NULL OR key = %(key)s)
  AND (%(error_contains)s::text IS NULL
       OR strpos(lower(last_error), lower(%(error_contains)s)) > 0)
  AND (%(older_than)s::interval IS NULL
       OR buried_at < coalesce(%(now)s::timestamptz, now()) - %(older_than)s::interval)
  AND %(state)s::text = 'buried'
ORDER BY buried_at DESC, id DESC
LIMIT %(limit)s;

-- buried_list --
-- Buried messages, newest first, optionally of one topic and buried within
-- %(within)s of the database's time. Payloads stay in the table: only their
-- size is read, so listing large buried messages costs what their ids cost.
SELECT id, topic, '' AS payload, created_at, attempts,
       due_at, nullif(leased_until, 'infinity') AS leased_until, last_error, buried_at, requeues,
       requeued_at, octet_length(payload::text) AS size, key, headers,
       leased_until = 'infinity' AS parked
FROM outbox_messages
WHERE buried_at IS NOT NULL
  AND (%(topic)s::text IS NULL OR topic = %(topic)s)
  AND (%(within)s::interval IS NULL
       OR buried_at >= coalesce(%(now)s::timestamptz, now()) - %(within)s::interval)
ORDER BY buried_at DESC, id DESC
LIMIT %(limit)s;

-- buried_count --
-- How many buried messages a requeue or purge of the same selection would
-- touch, and when the newest of them was buried (the confirmed action's
-- %(buried_by)s). The selection, here and in buried_requeue and buried_purge:
-- %(ids)s, %(topic)s, buried longer than %(older_than)s ago, buried by
-- %(buried_by)s, and a last error containing %(error)s in any case (strpos:
-- no pattern characters to escape); NULL narrows nothing.
SELECT count(*), max(buried_at)
FROM outbox_messages
WHERE buried_at IS NOT NULL
  AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s))
  AND (%(topic)s::text IS NULL OR topic = %(topic)s)
  AND (%(older_than)s::interval IS NULL
       OR buried_at < coalesce(%(now)s::timestamptz, now()) - %(older_than)s::interval)
  AND (%(buried_by)s::timestamptz IS NULL OR buried_at <= %(buried_by)s)
  AND (%(error)s::text IS NULL OR strpos(lower(last_error), lower(%(error)s)) > 0);

-- buried_requeue --
-- Make at most %(limit)s buried messages of the selection (buried_count's)
-- due now (the database's time) with attempts reset; keep the last error.
-- Only buried rows match, so a batch never matches what an earlier one
-- requeued, and running it twice changes nothing the second time. The caller repeats it, a commit a batch.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
),
batch AS (
    SELECT id
    FROM outbox_messages
    WHERE buried_at IS NOT NULL
      AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s))
      AND (%(topic)s::text IS NULL OR topic = %(topic)s)
      AND (%(older_than)s::interval IS NULL
           OR buried_at < coalesce(%(now)s::timestamptz, now()) - %(older_than)s::interval)
      AND (%(buried_by)s::timestamptz IS NULL OR buried_at <= %(buried_by)s)
      AND (%(error)s::text IS NULL OR strpos(lower(last_error), lower(%(error)s)) > 0)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox_messages AS m
SET buried_at = NULL,
    due_at = clock.now,
    attempts = 0,
    -- A keyed message whose key went on past it (its topic skips buried
    -- ones) waits, parked, while a later message of its key is in flight:
    -- that message's ack unparks it, so it goes next, before the rest.
    leased_until = CASE WHEN m.key IS NOT NULL AND coalesce((
        SELECT e.lease_token IS NOT NULL AND e.leased_until <> 'infinity'
        FROM outbox_messages AS e
        WHERE e.topic = m.topic AND e.key = m.key AND e.seq > m.seq AND e.buried_at IS NULL
        ORDER BY e.seq
        LIMIT 1
    ), false) THEN 'infinity'::timestamptz END,
    lease_token = NULL,
    lease_solo = false,
    requeues = requeues + 1,
    requeued_at = clock.now
FROM batch AS b, clock
WHERE m.id = b.id;

-- buried_purge --
-- Delete at most %(limit)s buried messages of the selection (buried_count's);
-- the caller repeats it, a commit a batch.
DELETE FROM outbox_messages
WHERE id IN (
    SELECT id
    FROM outbox_messages
    WHERE buried_at IS NOT NULL
      AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s))
      AND (%(topic)s::text IS NULL OR topic = %(topic)s)
      AND (%(older_than)s::interval IS NULL
           OR buried_at < coalesce(%(now)s::timestamptz, now()) - %(older_than)s::interval)
      AND (%(buried_by)s::timestamptz IS NULL OR buried_at <= %(buried_by)s)
      AND (%(error)s::text IS NULL OR strpos(lower(last_error), lower(%(error)s)) > 0)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING topic, key;

-- key_repair --
-- Unpark the first parked message of each key whose head is gone without
-- unparking it (its relay died between the ack and key_unpark). Looks at
-- %(limit)s parked rows at most. Unparking is always safe: a claim parks
-- again what still waits behind a head.
UPDATE outbox_messages AS m SET leased_until = NULL
FROM (
    SELECT DISTINCT ON (p.topic, p.key) p.id
    FROM (
        SELECT id, topic, key, seq FROM outbox_messages
        WHERE leased_until = 'infinity' AND buried_at IS NULL
        LIMIT %(limit)s
    ) AS p
    WHERE NOT EXISTS (
        SELECT 1 FROM outbox_messages AS e
        WHERE e.topic = p.topic AND e.key = p.key AND e.seq < p.seq
          AND e.leased_until IS DISTINCT FROM 'infinity'
          AND (e.buried_at IS NULL
               OR e.topic NOT IN (SELECT topic FROM outbox_topics WHERE on_buried = 'skip'))
    )
    ORDER BY p.topic, p.key, p.seq
) AS h
WHERE m.id = h.id AND m.leased_until = 'infinity';

-- keys_blocked --
-- Keys with messages parked behind a head that is buried (where its topic
-- blocks) or has failed at least once: the head, since when, why, and how many
-- wait. Reads at most %(scan)s parked rows (the leased index's 'infinity' end),
-- then one look-up of each key's head.
WITH waiting AS (
    SELECT topic, key, count(*) AS n
    FROM (
        SELECT topic, key FROM outbox_messages
        WHERE leased_until = 'infinity' AND buried_at IS NULL
          AND (%(topic)s::text IS NULL OR topic = %(topic)s)
        LIMIT %(scan)s
    ) AS p
    GROUP BY topic, key
)
SELECT w.topic, w.key, h.id, coalesce(h.buried_at, h.created_at), h.last_error,
       h.buried_at IS NOT NULL, w.n
FROM waiting AS w
CROSS JOIN LATERAL (
    SELECT e.id, e.buried_at, e.created_at, e.last_error
    FROM outbox_messages AS e
    WHERE e.topic = w.topic AND e.key = w.key AND e.leased_until IS DISTINCT FROM 'infinity'
      AND (e.buried_at IS NULL
           OR e.topic NOT IN (SELECT topic FROM outbox_topics WHERE on_buried = 'skip'))
    ORDER BY e.seq
    LIMIT 1
) AS h
WHERE h.buried_at IS NOT NULL OR h.last_error IS NOT NULL
ORDER BY 4, 1, 2
LIMIT %(limit)s;

-- backlog_read --
-- The last backlog measurement, whether it was taken within %(max_age)s (by
-- the database's clock, which took it), and its due-later counts (as
-- backlog_last reads them).
SELECT stats, measured_at > now() - %(max_age)s AS fresh,
       CASE WHEN due_later_at = measured_at THEN due_later END
FROM outbox_backlog;

-- backlog_last --
-- The last backlog measurement and when it was taken, whatever its age, with
-- its due-later counts when the relay that took it kept them (NULL when a
-- relay of an earlier release measured last).
SELECT measured_at, stats, CASE WHEN due_later_at = measured_at THEN due_later END
FROM outbox_backlog;

-- backlog_measure --
-- Backlog per topic: pending and buried counts, the oldest pending message;
-- what the controller's grant can read (no due-later counts: NULL).
-- A scan of the whole table: run it every few seconds, not per message. With
-- %(keep)s it is stored as the last measurement, for the other relays to read.
WITH stats AS MATERIALIZED (
    SELECT topic,
           count(*) FILTER (WHERE buried_at IS NULL) AS pending,
           count(*) FILTER (WHERE buried_at IS NOT NULL) AS buried,
           min(created_at) FILTER (WHERE buried_at IS NULL) AS oldest_pending
    FROM outbox_messages
    GROUP BY topic
),
kept AS (
    INSERT INTO outbox_backlog (id, measured_at, stats, due_later, due_later_at)
    SELECT true, now(),
           coalesce(jsonb_agg(jsonb_build_array(topic, pending, buried, oldest_pending)
                              ORDER BY topic), '[]'),
           NULL, NULL
    FROM stats
    HAVING %(keep)s
    ON CONFLICT (id) DO UPDATE SET measured_at = excluded.measured_at, stats = excluded.stats,
                                   due_later = NULL, due_later_at = NULL
)
SELECT topic, pending, buried, oldest_pending FROM stats ORDER BY topic;

-- backlog_measure_blocked --
-- backlog_measure, with each topic's blocked keys (as keys_blocked finds them,
-- from at most %(scan)s parked rows) and the oldest block's start. What a
-- relay measures; the controller's grant reads none of the key columns, so it
-- measures with backlog_measure and takes these from a relay's measurement.
WITH stats AS MATERIALIZED (
    SELECT topic,
           count(*) FILTER (WHERE buried_at IS NULL) AS pending,
           count(*) FILTER (WHERE buried_at IS NOT NULL) AS buried,
           min(created_at) FILTER (WHERE buried_at IS NULL) AS oldest_pending
    FROM outbox_messages
    GROUP BY topic
),
later AS MATERIALIZED (
    -- From the index of ready rows: only the part not yet due is read.
    SELECT topic, count(*) AS due_later
    FROM outbox_messages
    WHERE buried_at IS NULL AND leased_until IS NULL AND due_at > now()
    GROUP BY topic
),
waiting AS MATERIALIZED (
    SELECT DISTINCT topic, key
    FROM (
        SELECT topic, key FROM outbox_messages
        WHERE leased_until = 'infinity' AND buried_at IS NULL
        LIMIT %(scan)s
    ) AS p
),
blocked AS MATERIALIZED (
    SELECT w.topic, count(*) AS keys, min(coalesce(h.buried_at, h.created_at)) AS since
    FROM waiting AS w
    CROSS JOIN LATERAL (
        SELECT e.buried_at, e.created_at, e.last_error
        FROM outbox_messages AS e
        WHERE e.topic = w.topic AND e.key = w.key AND e.leased_until IS DISTINCT FROM 'infinity'
          AND (e.buried_at IS NULL
               OR e.topic NOT IN (SELECT topic FROM outbox_topics WHERE on_buried = 'skip'))
        ORDER BY e.seq
        LIMIT 1
    ) AS h
    WHERE h.buried_at IS NOT NULL OR h.last_error IS NOT NULL
    GROUP BY w.topic
),
joined AS MATERIALIZED (
    SELECT s.topic, s.pending, s.buried, s.oldest_pending,
           coalesce(b.keys, 0) AS blocked_keys, b.since AS oldest_blocked,
           coalesce(l.due_later, 0) AS due_later
    FROM stats AS s
    LEFT JOIN blocked AS b ON b.topic = s.topic
    LEFT JOIN later AS l ON l.topic = s.topic
),
kept AS (
    INSERT INTO outbox_backlog (id, measured_at, stats, due_later, due_later_at)
    SELECT true, now(),
           coalesce(jsonb_agg(jsonb_build_array(topic, pending, buried, oldest_pending,
                                                blocked_keys, oldest_blocked)
                              ORDER BY topic), '[]'),
           coalesce(jsonb_object_agg(topic, due_later), '{}'), now()
    FROM joined
    HAVING %(keep)s
    ON CONFLICT (id) DO UPDATE SET measured_at = excluded.measured_at, stats = excluded.stats,
                                   due_later = excluded.due_later,
                                   due_later_at = excluded.due_later_at
)
SELECT topic, pending, buried, oldest_pending, blocked_keys, oldest_blocked, due_later
FROM joined ORDER BY topic;

-- backlog_in_flight --
-- Messages a lease holds (an orphan's lease has ended; a parked one is not
-- held), per topic: read from the small index of leased rows.
SELECT topic, count(*)
FROM outbox_messages
WHERE leased_until IS NOT NULL AND leased_until <> 'infinity' AND buried_at IS NULL
GROUP BY topic;

-- may_change --
-- Whether this session's role may do an operator's writes: requeue and purge
-- buried messages, set and delete topics' entries.
SELECT has_table_privilege('outbox_messages', 'UPDATE')
       AND has_table_privilege('outbox_messages', 'DELETE')
       AND has_table_privilege('outbox_topics', 'INSERT, UPDATE, DELETE');

-- topic_list --
-- The whole topic registry.
SELECT topic, enabled, handler, config, max_attempts, timeout, max_in_flight, source, updated_at,
       owner_since, on_buried, reroute
FROM outbox_topics
ORDER BY topic;

-- topic_upsert --
-- Create or replace one topic's registry entry.
INSERT INTO outbox_topics
    (topic, enabled, handler, config, max_attempts, timeout, max_in_flight, source, updated_at,
     on_buried, reroute)
VALUES (%(topic)s, %(enabled)s, %(handler)s, %(config)s, %(max_attempts)s, %(timeout)s,
        %(max_in_flight)s, %(source)s, coalesce(%(now)s::timestamptz, now()), %(on_buried)s,
        %(reroute)s)
ON CONFLICT (topic) DO UPDATE
SET enabled = excluded.enabled,
    reroute = excluded.reroute,
    on_buried = excluded.on_buried,
    handler = excluded.handler,
    config = excluded.config,
    max_attempts = excluded.max_attempts,
    timeout = excluded.timeout,
    max_in_flight = excluded.max_in_flight,
    source = excluded.source,
    owner_since = NULL,
    updated_at = excluded.updated_at;

-- topic_govern --
-- Write an OutboxTopic's entry unless an older resource governs the topic;
-- return who governs it afterwards. Ties go to the lower source (namespace/
-- name); a resource without a creation time counts as the newest. Entries
-- written by `outbox topics` never give way: an operator's entry is a
-- conflict the operator resolves (outbox topics delete). When
-- two controllers race, the second waits for the first's row lock and
-- re-checks the WHERE against what the first wrote, so the older still wins.
WITH written AS (
    INSERT INTO outbox_topics
        (topic, enabled, handler, config, max_attempts, timeout, max_in_flight, source,
         owner_since, updated_at, on_buried, reroute)
    VALUES (%(topic)s, %(enabled)s, %(handler)s, %(config)s, %(max_attempts)s, %(timeout)s,
            %(max_in_flight)s, %(source)s, %(owner_since)s,
            coalesce(%(now)s::timestamptz, now()), %(on_buried)s, %(reroute)s)
    ON CONFLICT (topic) DO UPDATE
    SET enabled = excluded.enabled,
        reroute = excluded.reroute,
        on_buried = excluded.on_buried,
        handler = excluded.handler,
        config = excluded.config,
        max_attempts = excluded.max_attempts,
        timeout = excluded.timeout,
        max_in_flight = excluded.max_in_flight,
        source = excluded.source,
        owner_since = excluded.owner_since,
        updated_at = excluded.updated_at
    WHERE outbox_topics.source IS NOT DISTINCT FROM excluded.source
       OR outbox_topics.source IS NULL
       OR (outbox_topics.source LIKE 'kubernetes:%%'
           AND (coalesce(excluded.owner_since, 'infinity'), excluded.source)
              < (coalesce(outbox_topics.owner_since, 'infinity'), outbox_topics.source))
    RETURNING source
)
SELECT source FROM written
UNION ALL
SELECT source FROM outbox_topics
WHERE topic = %(topic)s AND NOT EXISTS (SELECT 1 FROM written);

-- topic_holder --
-- Who governs a topic now (after topic_govern lost a race it could not see:
-- its snapshot predates the winner's commit).
SELECT source FROM outbox_topics WHERE topic = %(topic)s;

-- topic_delete --
-- Remove a topic's registry entry (it falls back to its built-in handler).
DELETE FROM outbox_topics WHERE topic = %(topic)s;

-- relay_register --
-- Record (or refresh) one running relay and what it serves; it counts as
-- live for %(ttl)s. Returns the database's time, to measure the relay's skew.
INSERT INTO outbox_relays
    (id, host, pid, version, topics, kinds, started_at, seen_at, expires_at, handlers)
VALUES (%(id)s, %(host)s, %(pid)s, %(version)s, %(topics)s, %(kinds)s,
        coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()),
        coalesce(%(now)s::timestamptz, now()) + %(ttl)s, %(handlers)s)
ON CONFLICT (id) DO UPDATE
SET topics = excluded.topics,
    kinds = excluded.kinds,
    handlers = excluded.handlers,
    seen_at = excluded.seen_at,
    expires_at = excluded.expires_at
RETURNING seen_at;

-- relay_unregister --
-- Remove a relay that exits cleanly.
DELETE FROM outbox_relays WHERE id = %(id)s;

-- relay_list --
-- The live relays, oldest first.
SELECT id, host, pid, version, topics, kinds, started_at, seen_at, expires_at, handlers
FROM outbox_relays
WHERE expires_at > coalesce(%(now)s::timestamptz, now())
ORDER BY started_at, id;

-- relay_forget_dead --
-- Drop rows of relays that died (no clean exit) an hour ago or more.
DELETE FROM outbox_relays
WHERE expires_at < coalesce(%(now)s::timestamptz, now()) - interval '1 hour';

-- try_lock --
-- One relay at a time does a round of fleet-wide work (the unserved sweep,
-- the backlog measurement); the others skip that round.
SELECT pg_try_advisory_xact_lock(%(key)s);

-- unserved_note --
-- Note the topics with due messages that no live relay serves and no registry
-- entry governs (forget those served again); return how many are unserved
-- for %(grace)s. Reads each waiting topic once (a DISTINCT over the due
-- messages), never a row per message.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
),
live AS (
    SELECT DISTINCT unnest(r.topics) AS topic
    FROM outbox_relays AS r, clock
    WHERE r.expires_at > clock.now
),
waiting AS (
    SELECT DISTINCT m.topic
    FROM outbox_messages AS m, clock
    WHERE m.buried_at IS NULL AND m.due_at <= clock.now
      AND (m.leased_until IS NULL OR m.leased_until <= clock.now)
),
unserved AS (
    SELECT w.topic
    FROM waiting AS w
    WHERE NOT EXISTS (SELECT 1 FROM live AS l WHERE l.topic = w.topic)
      AND NOT EXISTS (SELECT 1 FROM outbox_topics AS t WHERE t.topic = w.topic)
),
noted AS (
    INSERT INTO outbox_unserved (topic, since)
    SELECT u.topic, clock.now FROM unserved AS u, clock
    ON CONFLICT (topic) DO NOTHING
),
served_again AS (
    DELETE FROM outbox_unserved AS o
    WHERE NOT EXISTS (SELECT 1 FROM unserved AS u WHERE u.topic = o.topic)
)
SELECT count(*)
FROM outbox_unserved AS o
JOIN unserved AS u ON u.topic = o.topic, clock
WHERE o.since <= clock.now - %(grace)s;

-- unserved_bury --
-- Bury at most %(limit)s due messages of the topics unserved for %(grace)s:
-- noted that long ago, served by no live relay and governed by no registry
-- entry (checked again in each batch, so a relay that starts serving a topic
-- meanwhile stops its burial). A message a relay claims meanwhile is leased
-- or locked; SKIP LOCKED and the re-check leave it alone. Returns a count per
-- topic, never a row per message.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
),
expired AS (
    SELECT o.topic
    FROM outbox_unserved AS o, clock
    WHERE o.since <= clock.now - %(grace)s
      AND NOT EXISTS (SELECT 1 FROM outbox_topics AS t WHERE t.topic = o.topic)
      AND NOT EXISTS (
          SELECT 1 FROM outbox_relays AS r
          WHERE r.expires_at > clock.now AND o.topic = ANY(r.topics)
      )
),
batch AS (
    SELECT m.id
    FROM outbox_messages AS m
    JOIN expired AS e ON e.topic = m.topic, clock
    WHERE m.buried_at IS NULL AND m.due_at <= clock.now
      AND (m.leased_until IS NULL OR m.leased_until <= clock.now)
    LIMIT %(limit)s
    FOR UPDATE OF m SKIP LOCKED
),
done AS (
    UPDATE outbox_messages AS m
    SET buried_at = clock.now,
        leased_until = NULL,
        last_error = 'no handler for topic ' || m.topic || %(why)s
    FROM batch AS b, clock
    WHERE m.id = b.id
    RETURNING m.topic
)
SELECT topic, count(*) FROM done GROUP BY topic;

-- wake_notify --
-- Wake the relays LISTENing on %(channel)s (outbox.wake): sent in the
-- producer's transaction, delivered at its commit; a listener's own probe too.
SELECT pg_notify(%(channel)s, %(payload)s);

-- store_ping --
-- Readiness: the pool hands out a connection that answers.
SELECT 1;

-- schema_current --
-- The schema unqualified names resolve to (OUTBOX_DATABASE_SCHEMA's check).
SELECT current_schema();

-- schema_bookkeeping --
-- Which shipped migrations a database has applied (`outbox migrate`, the
-- relays' start-up check and the Django migrations all fill and read it).
CREATE TABLE IF NOT EXISTS outbox_schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- schema_record --
-- Record one applied migration (in its own transaction where it has one).
INSERT INTO outbox_schema_migrations (version, name) VALUES (%(version)s, %(name)s)
ON CONFLICT (version) DO NOTHING;

-- schema_missing --
SELECT to_regclass('outbox_schema_migrations') IS NULL;

-- schema_applied --
SELECT version FROM outbox_schema_migrations;

-- schema_lock_timeout --
-- How long each statement of a migration waits for a lock (%(local)s: until
-- the transaction ends, else for the session).
SELECT set_config('lock_timeout', %(timeout)s, %(local)s);

-- schema_lock_timeout_reset --
RESET lock_timeout;

-- schema_session_mark --
-- Mark this server session, to tell whether the next statement runs in it
-- (behind a transaction pooler it may not).
SELECT set_config('outbox.session', %(token)s, false);

-- schema_session_read --
SELECT current_setting('outbox.session', true);

-- schema_lock_try --
-- The migration lock: a session-level advisory lock on %(lock)s.
SELECT pg_try_advisory_lock(%(lock)s);

-- schema_unlock --
SELECT pg_advisory_unlock(%(lock)s);

-- schema_lock_held --
-- Whether this session holds the migration lock (it does, unless a pooler ran
-- the statement that took it in another session).
SELECT EXISTS (
    SELECT 1 FROM pg_locks
    WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
      AND ((classid::bigint << 32) | objid::bigint) = %(lock)s::bigint
);

-- schema_blockers --
-- Sessions holding or waiting for locks on the outbox's tables, or the
-- migration lock, other than this one: who a timed-out statement waited for.
SELECT DISTINCT a.pid, coalesce(a.state, '?'),
       extract(epoch FROM now() - coalesce(a.xact_start, a.backend_start))::int
FROM pg_locks AS l
JOIN pg_stat_activity AS a ON a.pid = l.pid
LEFT JOIN pg_class AS c ON c.oid = l.relation
WHERE l.pid <> pg_backend_pid() AND l.granted
  -- This database's: another database's outbox on the same server blocks nothing here.
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND (c.relname LIKE 'outbox\_%%' OR (l.locktype = 'advisory'
       AND ((l.classid::bigint << 32) | l.objid::bigint) = %(lock)s::bigint))
ORDER BY 1
LIMIT 5;

-- schema_foreign --
-- Outbox objects of the migration's schema (tables, views, indexes,
-- sequences, functions, free-standing types: every name that starts with
-- outbox_) owned by another role than the migrating one: (kind, name,
-- owner). The owner must be current_user itself: membership is not enough,
-- since a superuser is a member of every role and would adopt what a role
-- with CREATE on the schema made first (IF NOT EXISTS keeps its triggers).
SELECT kind, name, pg_get_userbyid(owner)
FROM (
    SELECT CASE WHEN c.relkind IN ('i', 'I') THEN 'index'
                WHEN c.relkind = 'S' THEN 'sequence'
                WHEN c.relkind IN ('v', 'm') THEN 'view'
                ELSE 'table' END AS kind,
           c.relname AS name, c.relowner AS owner
    FROM pg_class AS c
    WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
      AND c.relname LIKE 'outbox\_%%' AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'i', 'I', 'S')
    UNION ALL
    SELECT 'function', p.proname, p.proowner
    FROM pg_proc AS p
    WHERE p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
      AND p.proname LIKE 'outbox\_%%'
    UNION ALL
    SELECT 'type', t.typname, t.typowner
    FROM pg_type AS t
    WHERE t.typnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
      AND t.typname LIKE 'outbox\_%%' AND t.typrelid = 0
) AS o
WHERE owner <> (SELECT oid FROM pg_roles WHERE rolname = current_user)
ORDER BY name, kind;

-- schema_triggers --
-- Triggers on outbox tables other than those named in %(allowed)s: the
-- product creates none, and one it did not create sees every payload (a
-- DBA's own audit trigger is allowed by naming it). One on the partitioned
-- outbox_messages counts once, not again on each partition it is cloned to.
SELECT t.tgname, c.relname
FROM pg_trigger AS t
JOIN pg_class AS c ON c.oid = t.tgrelid
WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
  AND c.relname LIKE 'outbox\_%%' AND NOT t.tgisinternal AND t.tgparentid = 0
  AND NOT t.tgname = ANY(%(allowed)s::text[])
ORDER BY 2, 1;

-- schema_invalid_indexes --
-- A concurrent index build that failed leaves an INVALID index behind, which
-- CREATE INDEX ... IF NOT EXISTS would then keep: drop those first.
SELECT c.relname
FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
WHERE NOT i.indisvalid AND c.relname = ANY(%(names)s)
  AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema());

-- storage_health --
-- What holds this database's horizon back, and what the outbox holds. A
-- snapshot holder is a session with a backend_xmin (a transaction in
-- REPEATABLE READ, pg_dump, one idle in transaction; a standby's feedback
-- through its walsender), a prepared transaction or a replication slot's
-- xmin: while one is held, no row deleted after it began can be vacuumed.
-- Seconds come from those with a start time (sessions, prepared
-- transactions); transactions from all of them. Sessions of other roles show
-- no backend_xmin unless the role has pg_read_all_stats (pg_monitor).
WITH holders AS (
    SELECT coalesce(xact_start, backend_start) AS since, backend_xmin AS xmin
    FROM pg_stat_activity
    WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid()
      AND (datname = current_database() OR backend_type = 'walsender')
    UNION ALL
    SELECT prepared, transaction FROM pg_prepared_xacts WHERE database = current_database()
    UNION ALL
    SELECT NULL, xmin FROM pg_replication_slots WHERE xmin IS NOT NULL
), tables AS (
    SELECT relid, n_dead_tup FROM pg_stat_user_tables
    WHERE relname LIKE 'outbox\_%%' AND schemaname = current_schema()
)
SELECT coalesce(extract(epoch FROM now() - min(since)), 0)::float8,
       coalesce(max(age(xmin)), 0)::bigint,
       (SELECT coalesce(sum(n_dead_tup), 0) FROM tables)::bigint,
       (SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM tables)::bigint
FROM holders;

-- ring_state --
-- The ring (outbox_ring: how many slots, how many seconds each) and the
-- database's clock in seconds since the epoch (the clock an insert's slot is
-- read from), and when the long-stay partition next holds a message to claim:
-- the earliest due time of its ready rows or the earliest end of a lease in
-- it (NULL: none). Each is one look into an index of the long-stay partition.
SELECT r.slots, r.seconds, extract(epoch FROM clock_timestamp())::float8,
       extract(epoch FROM least(
           (SELECT min(due_at) FROM outbox_messages
            WHERE slot = -1 AND buried_at IS NULL AND leased_until IS NULL),
           (SELECT min(leased_until) FROM outbox_messages
            WHERE slot = -1 AND buried_at IS NULL AND leased_until IS NOT NULL
              AND leased_until <> 'infinity')))::float8
FROM outbox_ring AS r;

-- ring_move --
-- Move up to %(limit)s messages out of ring slot %(slot)s into the long-stay
-- partition (slot -1), so that the slot can be emptied: each one no lease
-- holds (buried, parked behind its key, waiting, due later) or whose lease
-- ended (an orphan), but one due within %(later)s from now that has been due
-- for at most %(waited)s (NULL: any due one). A message in flight stays: its
-- relay settles it where it is. The rotation passes zero for both, unless the
-- relay's claims are taking messages from the slot (a backlog being drained:
-- what they take is not written twice). An UPDATE of the partition key, which PostgreSQL carries out as a
-- delete from the slot and an insert into the long-stay partition (the
-- UPDATE privilege is all it needs); rows a claim or a write holds are
-- passed over. Read in the order of ids from %(from)s (NULL: the first), the
-- last batch's highest: what a batch moved stays behind as dead rows, which
-- the next batch does not walk again (a held snapshot keeps them). Returns
-- the ids moved.
WITH picked AS MATERIALIZED (
    SELECT id FROM outbox_messages
    WHERE slot = %(slot)s::int2 AND (%(from)s::uuid IS NULL OR id > %(from)s::uuid)
      AND (buried_at IS NOT NULL OR leased_until = 'infinity'
           OR leased_until <= coalesce(%(now)s::timestamptz, now())
           OR leased_until IS NULL
              AND (due_at > coalesce(%(now)s::timestamptz, now()) + %(later)s::interval
                   OR due_at < coalesce(%(now)s::timestamptz, now()) - %(waited)s::interval))
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox_messages AS m SET slot = -1
WHERE m.slot = %(slot)s::int2 AND m.id = ANY(ARRAY(SELECT id FROM picked))
RETURNING m.id;

-- ring_empty --
-- Whether ring slot %(slot)s holds no message, and the size of its
-- partition's table (zero once truncated: its indexes keep a page each, so
-- their size never says whether it is worth emptying). Under the
-- partition's ACCESS EXCLUSIVE lock no insert into it is in progress, so the
-- answer holds until the TRUNCATE that follows in the same transaction.
SELECT NOT EXISTS (SELECT 1 FROM outbox_messages WHERE slot = %(slot)s::int2),
       pg_relation_size(to_regclass(%(partition)s::text));
