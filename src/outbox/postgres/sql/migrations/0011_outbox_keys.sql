-- Ordering per key: messages of one topic that share a key are delivered one
-- at a time, in the order they were added. A keyed message takes its place
-- from outbox_messages_seq at insert (unkeyed ones leave seq NULL and call
-- nothing); only the first live message of a key (its head) is claimed.
--
-- A keyed message a claim finds behind its key's head is parked: its
-- leased_until is 'infinity' with no lease token, so it leaves the claim
-- indexes (they hold rows no lease holds) and the orphan search, which reads
-- leased_until <= now, never reaches it. Claims then never walk a blocked
-- key's waiting messages. The head's ack (or burial, where the topic skips)
-- unparks the next one.
--
-- Nullable columns without defaults: instant, whatever the table's size.
ALTER TABLE outbox_messages ADD COLUMN IF NOT EXISTS key text;
ALTER TABLE outbox_messages ADD COLUMN IF NOT EXISTS seq bigint;
CREATE SEQUENCE IF NOT EXISTS outbox_messages_seq;
-- What a buried head does to its key's successors: 'block' (NULL, the
-- default) or 'skip' (checked by the registry's writers).
ALTER TABLE outbox_topics ADD COLUMN IF NOT EXISTS on_buried text;
