-- The outbox becomes a ring of partitions (0018). This prepares the table as
-- it is, which stays as the ring's long-stay partition, slot -1: its rows are
-- delivered from where they are, nothing is copied.
--
-- A NOT NULL column with a constant default: instant, whatever the table's
-- size. The CHECK is added NOT VALID (instant) and validated by 0017 without
-- blocking producers, so attaching the table as slot -1 reads nothing.
-- Both are no-ops once outbox_messages is the partitioned table.
ALTER TABLE outbox_messages ADD COLUMN IF NOT EXISTS slot smallint NOT NULL DEFAULT -1;

DO $$
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = to_regclass('outbox_messages')) = 'r'
       AND NOT EXISTS (SELECT 1 FROM pg_constraint
                       WHERE conrelid = to_regclass('outbox_messages')
                         AND conname = 'outbox_messages_stay_slot') THEN
        ALTER TABLE outbox_messages ADD CONSTRAINT outbox_messages_stay_slot
            CHECK (slot IS NOT NULL AND slot = -1) NOT VALID;
    END IF;
END
$$;
