-- Who may send a topic elsewhere. outbox_topics.reroute records whether the
-- entry's source may replace a built-in or application handler with a
-- handler kind (a webhook, a broker): an operator's `outbox topics` entry
-- may, an OutboxTopic only with a grant that says :reroute. A relay never
-- lets an entry without it replace a handler of its own. outbox_relays.handlers
-- lists the topics a relay has such a handler for, so the controller can mark
-- a resource that would reroute one of them Invalid.
--
-- New columns with constant defaults: instant, whatever the tables' size.
-- Existing operator entries (source 'cli', or none) keep rerouting; the
-- controller rewrites its own entries at its next pass.
ALTER TABLE outbox_topics ADD COLUMN IF NOT EXISTS reroute boolean NOT NULL DEFAULT false;
ALTER TABLE outbox_relays ADD COLUMN IF NOT EXISTS handlers text[] NOT NULL DEFAULT '{}';
UPDATE outbox_topics SET reroute = true
WHERE source IS NULL OR source NOT LIKE 'kubernetes:%';
