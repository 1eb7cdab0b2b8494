-- outbox: no transaction
-- Validating reads the table under a lock producers do not wait for (SHARE
-- UPDATE EXCLUSIVE), so that attaching it as slot -1 (0018) reads nothing. A
-- no-op once the table is the long-stay partition. (One line: statements
-- split at a semicolon that ends a line.)
DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = to_regclass('outbox_messages') AND conname = 'outbox_messages_stay_slot' AND NOT convalidated) THEN ALTER TABLE outbox_messages VALIDATE CONSTRAINT outbox_messages_stay_slot; END IF; END $$;
