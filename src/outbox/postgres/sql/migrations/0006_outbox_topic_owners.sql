-- Who governs a topic's registry entry, decided in one statement: among
-- OutboxTopic resources the oldest (creation time, then namespace/name) wins,
-- whatever order the controller sees them in. owner_since is the governing
-- resource's creation time; NULL for entries written by `outbox topics`.
ALTER TABLE outbox_topics ADD COLUMN IF NOT EXISTS owner_since timestamptz;
