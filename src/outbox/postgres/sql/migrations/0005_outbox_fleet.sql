-- Fenced leases, poison isolation and fleet-aware routing.
--
-- lease_token is set afresh by every claim. A relay's retry, bury and release
-- apply only while the row still carries the token of the claim they answer,
-- so a relay that stalled past its lease cannot undo what the current holder
-- does. lease_solo says the claim delivered the message on its own: when such
-- a lease runs out unsettled, the message alone may have killed its relay.
ALTER TABLE outbox_messages ADD COLUMN IF NOT EXISTS lease_token uuid;
ALTER TABLE outbox_messages ADD COLUMN IF NOT EXISTS lease_solo boolean NOT NULL DEFAULT false;

-- A per-topic cap on deliveries in flight in one relay.
ALTER TABLE outbox_topics ADD COLUMN IF NOT EXISTS max_in_flight integer
    CHECK (max_in_flight >= 1);

-- One row per running relay process, refreshed every interval and removed on
-- a clean exit. A row whose expires_at has passed belongs to a relay that
-- died or stalled: it no longer counts as serving its topics.
CREATE TABLE IF NOT EXISTS outbox_relays (
    id         uuid        PRIMARY KEY,
    host       text        NOT NULL,
    pid        integer     NOT NULL,
    version    text        NOT NULL,
    topics     text[]      NOT NULL,
    kinds      text[]      NOT NULL,
    started_at timestamptz NOT NULL,
    seen_at    timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);

-- Topics with due messages that no live relay serves and no registry entry
-- governs, since when. Their messages are buried with "no handler" once the
-- topic has stayed unserved for OUTBOX_UNSERVED_GRACE, so a rolling deploy
-- (an old relay without the topic's handler, the new one not up yet) buries
-- nothing.
CREATE TABLE IF NOT EXISTS outbox_unserved (
    topic text        PRIMARY KEY,
    since timestamptz NOT NULL
);
