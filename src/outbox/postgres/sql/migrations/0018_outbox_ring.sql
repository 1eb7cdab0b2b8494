-- A ring of partitions, emptied by TRUNCATE, so that what a held snapshot
-- keeps of settled messages (a report, pg_dump, a standby's feedback) is
-- returned at once instead of piling up as dead rows no vacuum may remove
-- (docs/design/held-snapshots.md).
--
-- outbox_messages becomes a table partitioned by slot, so producers keep
-- inserting into the name they know, with the grants they have (copied here,
-- table and column by column). An insert's slot defaults to the ring's
-- current one, from the database's clock: two slots of ten seconds
-- (outbox_ring says so to the relays; outbox.postgres.ring changes both).
-- Relays empty the slot that is not current with TRUNCATE once it holds no
-- message; whatever would keep it from emptying (a backlog, a parked key, a
-- buried message, a retry or deliver_at far off, an orphan) is moved, once,
-- to the long-stay partition, slot -1: the table as it was, deleted from row
-- by row and vacuumed as before. Its rows are delivered from where they are.
--
-- Every step takes its locks for an instant and reads no rows: the table was
-- prepared by 0016 and 0017. Roles that may DELETE from outbox_messages may
-- TRUNCATE the ring's partitions (the same power over their rows).
CREATE TABLE IF NOT EXISTS outbox_ring (
    slots   smallint NOT NULL,
    seconds integer  NOT NULL CHECK (seconds > 0)
);
INSERT INTO outbox_ring (slots, seconds)
SELECT 2, 10 WHERE NOT EXISTS (SELECT 1 FROM outbox_ring);

DO $$
DECLARE
    g record;
    i integer;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = to_regclass('outbox_messages')) <> 'r' THEN
        RETURN;
    END IF;
    ALTER TABLE outbox_messages RENAME TO outbox_messages_stay;
    ALTER TABLE outbox_messages_stay RENAME CONSTRAINT outbox_messages_pkey
        TO outbox_messages_stay_pkey;
    ALTER INDEX IF EXISTS outbox_messages_buried_idx RENAME TO outbox_messages_stay_buried_idx;
    ALTER INDEX IF EXISTS outbox_messages_ready_idx RENAME TO outbox_messages_stay_ready_idx;
    ALTER INDEX IF EXISTS outbox_messages_leased_idx RENAME TO outbox_messages_stay_leased_idx;
    ALTER INDEX IF EXISTS outbox_messages_topic_ready_idx
        RENAME TO outbox_messages_stay_topic_ready_idx;
    ALTER INDEX IF EXISTS outbox_messages_key_idx RENAME TO outbox_messages_stay_key_idx;
    ALTER INDEX IF EXISTS outbox_messages_parked_idx RENAME TO outbox_messages_stay_parked_idx;

    CREATE TABLE outbox_messages (LIKE outbox_messages_stay INCLUDING DEFAULTS)
        PARTITION BY LIST (slot);
    ALTER TABLE outbox_messages ALTER COLUMN slot SET DEFAULT
        (floor(extract(epoch FROM clock_timestamp()) / 10)::bigint % 2)::smallint;
    ALTER TABLE outbox_messages ATTACH PARTITION outbox_messages_stay FOR VALUES IN (-1);
    ALTER TABLE outbox_messages_stay DROP CONSTRAINT outbox_messages_stay_slot;

    -- The ring's partitions have the indexes claims, acks and keys use; none
    -- for buried messages, which leave for the long-stay partition.
    FOR i IN 0..1 LOOP
        EXECUTE format(
            'CREATE TABLE outbox_messages_%s PARTITION OF outbox_messages '
            '(PRIMARY KEY (id)) FOR VALUES IN (%s) '
            'WITH (autovacuum_vacuum_scale_factor = 0.0, autovacuum_vacuum_threshold = 2000, '
            'autovacuum_analyze_scale_factor = 0.02, autovacuum_analyze_threshold = 2000)', i, i);
        EXECUTE format('CREATE INDEX outbox_messages_%s_ready_idx ON outbox_messages_%s '
                       '(due_at, id) WHERE buried_at IS NULL AND leased_until IS NULL', i, i);
        EXECUTE format('CREATE INDEX outbox_messages_%s_topic_ready_idx ON outbox_messages_%s '
                       '(topic, due_at, id) WHERE buried_at IS NULL AND leased_until IS NULL', i, i);
        EXECUTE format('CREATE INDEX outbox_messages_%s_leased_idx ON outbox_messages_%s '
                       '(leased_until) WHERE buried_at IS NULL AND leased_until IS NOT NULL', i, i);
        EXECUTE format('CREATE INDEX outbox_messages_%s_key_idx ON outbox_messages_%s '
                       '(topic, key, seq) WHERE key IS NOT NULL', i, i);
        EXECUTE format('CREATE INDEX outbox_messages_%s_parked_idx ON outbox_messages_%s '
                       '(topic, key, seq) WHERE leased_until = ''infinity''', i, i);
    END LOOP;

    FOR g IN
        SELECT a.privilege_type AS privilege, a.grantee, a.is_grantable, NULL::name AS col
        FROM pg_class AS c, aclexplode(c.relacl) AS a
        WHERE c.oid = 'outbox_messages_stay'::regclass AND a.grantee <> c.relowner
        UNION ALL
        SELECT a.privilege_type, a.grantee, a.is_grantable, t.attname
        FROM pg_attribute AS t, aclexplode(t.attacl) AS a
        WHERE t.attrelid = 'outbox_messages_stay'::regclass AND t.attacl IS NOT NULL
    LOOP
        EXECUTE format('GRANT %s %s ON outbox_messages TO %s %s', g.privilege,
            CASE WHEN g.col IS NOT NULL THEN format('(%I)', g.col) ELSE '' END,
            CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(g.grantee)) END,
            CASE WHEN g.is_grantable THEN 'WITH GRANT OPTION' ELSE '' END);
        IF g.privilege = 'DELETE' AND g.col IS NULL THEN
            FOR i IN 0..1 LOOP
                EXECUTE format('GRANT TRUNCATE ON outbox_messages_%s TO %s', i,
                    CASE WHEN g.grantee = 0 THEN 'PUBLIC'
                         ELSE quote_ident(pg_get_userbyid(g.grantee)) END);
            END LOOP;
            EXECUTE format('GRANT SELECT ON outbox_ring TO %s',
                CASE WHEN g.grantee = 0 THEN 'PUBLIC'
                     ELSE quote_ident(pg_get_userbyid(g.grantee)) END);
        END IF;
    END LOOP;
END
$$;
