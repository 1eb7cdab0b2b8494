-- Storage for a queue table: every message is inserted, updated by its claim
-- and deleted by its ack, so dead row versions pile up at the rate messages
-- pass through, whatever the backlog. Autovacuum's defaults wait for 20% of
-- the table to be dead, which a large backlog makes a long wait; here it runs
-- once a fixed number of versions died, so the table and its indexes stop
-- growing under a steady load. Pages are filled to 80% so that a claim's or a
-- retry's new row version fits beside the old one on the same page.
ALTER TABLE outbox_messages SET (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 2000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 2000
);
