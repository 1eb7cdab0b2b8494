-- Storage for a queue table: every message is inserted, updated by its claim
-- and deleted by its ack, so dead row versions pile up at the rate messages
-- pass through, whatever the backlog. Autovacuum's defaults wait for 20% of
-- the table to be dead, which a large backlog makes a long wait; here it
-- vacuums once a fixed number of row versions died, so the table and
-- its indexes stop growing under a steady load whatever the backlog.
--
-- The fillfactor stays at 100: no update of a message can be HOT (a claim
-- sets leased_until, which takes the row out of the claim indexes; a retry
-- moves due_at), so room left on each page would only make the table larger.
ALTER TABLE outbox_messages SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 2000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 2000
);
