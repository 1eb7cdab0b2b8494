-- The candidate layout of `python -m bench ring_layout`, applied to a fresh
-- schema after the shipped migrations: outbox_messages partitioned by slot,
-- {slots} ring partitions with the indexes a claim and an ack use, and the
-- table as it was as the long-stay partition (slot -1). Not a migration: it
-- rewrites nothing online and copies no grants.
ALTER TABLE outbox_messages ADD COLUMN slot smallint NOT NULL DEFAULT -1;
ALTER TABLE outbox_messages ADD CONSTRAINT outbox_messages_stay_slot CHECK (slot = -1);
ALTER TABLE outbox_messages RENAME TO outbox_messages_stay;
CREATE TABLE outbox_messages (LIKE outbox_messages_stay INCLUDING DEFAULTS)
    PARTITION BY LIST (slot);
ALTER TABLE outbox_messages ALTER COLUMN slot SET DEFAULT
    (floor(extract(epoch FROM clock_timestamp()) / 10)::bigint % {slots})::smallint;
ALTER TABLE outbox_messages ATTACH PARTITION outbox_messages_stay FOR VALUES IN (-1);
DO $$
BEGIN
    FOR i IN 0..{last} LOOP
        EXECUTE format('CREATE TABLE outbox_messages_%s PARTITION OF outbox_messages'
                       ' FOR VALUES IN (%s)', i, i);
        EXECUTE format('CREATE UNIQUE INDEX ON outbox_messages_%s (id)', i);
        EXECUTE format('CREATE INDEX ON outbox_messages_%s (due_at, id)'
                       ' WHERE buried_at IS NULL AND leased_until IS NULL', i);
        EXECUTE format('CREATE INDEX ON outbox_messages_%s (topic, due_at, id)'
                       ' WHERE buried_at IS NULL AND leased_until IS NULL', i);
        EXECUTE format('CREATE INDEX ON outbox_messages_%s (leased_until)'
                       ' WHERE buried_at IS NULL AND leased_until IS NOT NULL', i);
        EXECUTE format('CREATE INDEX ON outbox_messages_%s (topic, key, seq)'
                       ' WHERE key IS NOT NULL', i);
    END LOOP;
END
$$;
