-- Message headers: string names and values that travel with a message to
-- every kind (HTTP headers, NATS headers, AMQP properties, Redis fields),
-- among them the producer's trace context. NULL when a message has none, so
-- messages without headers take no more room than before.
--
-- A nullable column without a default: instant, whatever the table's size.
ALTER TABLE outbox_messages ADD COLUMN IF NOT EXISTS headers json;
