-- Webhook deliveries seen, for deduplication by X-GitHub-Delivery and for
-- analysing the order in which GitHub delivered events.
CREATE TABLE deliveries (
    delivery_id  TEXT   PRIMARY KEY,
    event        TEXT   NOT NULL,
    action       TEXT,
    external_id  TEXT,
    outcome      TEXT   NOT NULL,
    received_at  INTEGER NOT NULL
);
CREATE INDEX deliveries_received ON deliveries (received_at);
