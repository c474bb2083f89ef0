-- Tally's schema. Applied idempotently by every process on first use
-- (storage/db.py); bump the user_version at the end when it changes.
-- Times are integers: unix milliseconds unless a column says otherwise.

-- Accounts, sites and API keys --------------------------------------------

CREATE TABLE IF NOT EXISTS accounts (
    id          INTEGER PRIMARY KEY,
    public_id   TEXT    NOT NULL UNIQUE,
    name        TEXT    NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    plan        TEXT    NOT NULL DEFAULT 'free'
                        CHECK (plan IN ('free', 'starter', 'growth', 'scale')),
    created_at  INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS sites (
    id          INTEGER PRIMARY KEY,
    public_id   TEXT    NOT NULL UNIQUE,
    account_id  INTEGER NOT NULL REFERENCES accounts (id),
    created_at  INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS sites_account ON sites (account_id);

CREATE TABLE IF NOT EXISTS site_hosts (
    site_id     INTEGER NOT NULL REFERENCES sites (id),
    host        TEXT    NOT NULL CHECK (host = lower(host) AND length(host) BETWEEN 1 AND 253),
    PRIMARY KEY (site_id, host)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS api_keys (
    id          INTEGER PRIMARY KEY,
    public_id   TEXT    NOT NULL UNIQUE,
    site_id     INTEGER NOT NULL REFERENCES sites (id),
    secret_hash BLOB    NOT NULL UNIQUE CHECK (length(secret_hash) = 32),
    prefix      TEXT    NOT NULL,
    scopes      TEXT    NOT NULL CHECK (length(scopes) > 0),
    created_at  INTEGER NOT NULL,
    revoked_at  INTEGER
);
CREATE INDEX IF NOT EXISTS api_keys_site ON api_keys (site_id);

-- Payments, customers, subscriptions (issue 3) -----------------------------
-- Amounts are exact decimal text in major units, plain digits with at most one point and
-- no trailing zeros ("10.5", "100"; validation/common.decimal_text): add them up with
-- Decimal, never as REAL. Instants are kept as the caller's RFC 3339 text plus unix ms.

CREATE TABLE IF NOT EXISTS customers (
    id          INTEGER PRIMARY KEY,
    site_id     INTEGER NOT NULL REFERENCES sites (id),
    customer_id TEXT    NOT NULL CHECK (length(customer_id) BETWEEN 1 AND 128),
    email       TEXT    CHECK (email = lower(email) AND instr(email, '@') > 0),
    user_id     TEXT,
    visitor_id  TEXT,
    name        TEXT,
    country     TEXT    CHECK (length(country) = 2 AND country = upper(country)),
    metadata    TEXT    CHECK (metadata IS NULL OR json_valid(metadata)),
    -- paid_at (ms) of the newest payment whose values the fields hold
    as_of_ms    INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    UNIQUE (site_id, customer_id)
);
CREATE INDEX IF NOT EXISTS customers_user ON customers (site_id, user_id);
CREATE INDEX IF NOT EXISTS customers_visitor ON customers (site_id, visitor_id);

CREATE TABLE IF NOT EXISTS payments (
    id              INTEGER PRIMARY KEY,
    site_id         INTEGER NOT NULL REFERENCES sites (id),
    payment_id      TEXT    NOT NULL CHECK (length(payment_id) BETWEEN 1 AND 128),
    customer_id     TEXT    NOT NULL,
    amount          TEXT    NOT NULL CHECK (amount GLOB '[0-9]*' AND amount NOT GLOB '*[^0-9.]*'
                                            AND amount GLOB '*[1-9]*'),
    currency        TEXT    NOT NULL CHECK (length(currency) = 3 AND currency = upper(currency)),
    fee             TEXT    CHECK (fee GLOB '[0-9]*' AND fee NOT GLOB '*[^0-9.]*'),
    kind            TEXT    NOT NULL CHECK (kind IN ('charge', 'refund', 'chargeback')),
    status          TEXT    NOT NULL CHECK (status IN ('succeeded', 'pending', 'failed')),
    paid_at         TEXT    NOT NULL,
    paid_at_ms      INTEGER NOT NULL,
    metadata        TEXT    CHECK (metadata IS NULL OR json_valid(metadata)),
    subscription_id TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    UNIQUE (site_id, payment_id),
    FOREIGN KEY (site_id, customer_id) REFERENCES customers (site_id, customer_id)
);
CREATE INDEX IF NOT EXISTS payments_paid ON payments (site_id, paid_at_ms);
CREATE INDEX IF NOT EXISTS payments_customer ON payments (site_id, customer_id);

-- Every subscription block received, effective at its payment's paid_at: MRR at a past
-- date is computed from these. One per payment: re-sending a payment replaces its own.
-- A state known without a payment (a Stripe customer.subscription.* event, an invoice
-- whose charge is not named) has no payment_id but the event_id that brought it, and is
-- effective at that event's time. Version 9 made payment_id optional (storage/migrations.py).
CREATE TABLE IF NOT EXISTS subscription_observations (
    id                    INTEGER PRIMARY KEY,
    site_id               INTEGER NOT NULL REFERENCES sites (id),
    payment_id            TEXT,
    event_id              TEXT    CHECK ((payment_id IS NULL) <> (event_id IS NULL)),
    subscription_id       TEXT    NOT NULL CHECK (length(subscription_id) BETWEEN 1 AND 128),
    customer_id           TEXT    NOT NULL,
    effective_at_ms       INTEGER NOT NULL,
    currency              TEXT    NOT NULL,
    plan                  TEXT,
    interval              TEXT    CHECK (interval IN ('day', 'week', 'month', 'year')),
    status                TEXT    NOT NULL CHECK (status IN ('active', 'trialing', 'past_due',
                                                             'paused', 'canceled', 'ended')),
    amount                TEXT    CHECK (amount GLOB '[0-9]*' AND amount NOT GLOB '*[^0-9.]*'),
    started_at            TEXT    NOT NULL,
    started_at_ms         INTEGER NOT NULL,
    current_period_end    TEXT,
    current_period_end_ms INTEGER,
    canceled_at           TEXT,
    canceled_at_ms        INTEGER,
    ended_at              TEXT,
    ended_at_ms           INTEGER,
    received_at           INTEGER NOT NULL,
    UNIQUE (site_id, payment_id),
    FOREIGN KEY (site_id, payment_id) REFERENCES payments (site_id, payment_id)
);
CREATE INDEX IF NOT EXISTS subscription_observations_sub
    ON subscription_observations (site_id, subscription_id, effective_at_ms);
CREATE INDEX IF NOT EXISTS subscription_observations_time
    ON subscription_observations (site_id, effective_at_ms);
CREATE UNIQUE INDEX IF NOT EXISTS subscription_observations_event
    ON subscription_observations (site_id, event_id) WHERE event_id IS NOT NULL;

-- The latest state of each subscription: a copy of its observation with the greatest
-- effective_at_ms (the later received on a tie), so a late retry of an old payment
-- never rolls a subscription back.
CREATE TABLE IF NOT EXISTS subscriptions (
    id                    INTEGER PRIMARY KEY,
    site_id               INTEGER NOT NULL REFERENCES sites (id),
    subscription_id       TEXT    NOT NULL CHECK (length(subscription_id) BETWEEN 1 AND 128),
    customer_id           TEXT    NOT NULL,
    payment_id            TEXT,
    effective_at_ms       INTEGER NOT NULL,
    currency              TEXT    NOT NULL,
    plan                  TEXT,
    interval              TEXT    CHECK (interval IN ('day', 'week', 'month', 'year')),
    status                TEXT    NOT NULL CHECK (status IN ('active', 'trialing', 'past_due',
                                                             'paused', 'canceled', 'ended')),
    amount                TEXT    CHECK (amount GLOB '[0-9]*' AND amount NOT GLOB '*[^0-9.]*'),
    started_at            TEXT    NOT NULL,
    started_at_ms         INTEGER NOT NULL,
    current_period_end    TEXT,
    current_period_end_ms INTEGER,
    canceled_at           TEXT,
    canceled_at_ms        INTEGER,
    ended_at              TEXT,
    ended_at_ms           INTEGER,
    updated_at            INTEGER NOT NULL,
    UNIQUE (site_id, subscription_id)
);
CREATE INDEX IF NOT EXISTS subscriptions_customer ON subscriptions (site_id, customer_id);


-- Events (issue 4) ---------------------------------------------------------
-- One row per stored event, written only by the flush threads (storage/events.py).
-- visitor_id: signed 64-bit, (daily salt, site, ip, ua) under a keyed hash: since version
-- 25 bit 63 clear, bits 48..62 the day (1 + day % 32767), bits 0..47 the hash, so the
-- index on it takes a day's new visitors in one range (enrichment/visitor.py); NULL
-- without ip or ua. The raw IP is never stored. session_id is filled by the attribution step of
-- the flush (issue 6). One index: reports read a site's events over a time range.
-- anonymous: 1 for an event of the public POST /api/v1/collect, whose `$identify` counts
-- toward the monthly quota too; NULL for one sent with a key (version 16 added it).
CREATE TABLE IF NOT EXISTS events (
    id            INTEGER PRIMARY KEY,
    site_id       INTEGER NOT NULL REFERENCES sites (id),
    ts            INTEGER NOT NULL,
    name          TEXT    NOT NULL CHECK (length(name) BETWEEN 1 AND 64),
    visitor_id    INTEGER,
    pathname      TEXT    NOT NULL,
    url           TEXT    NOT NULL,
    hostname      TEXT    NOT NULL,
    referrer      TEXT,
    referrer_host TEXT,
    title         TEXT,
    width         INTEGER CHECK (width BETWEEN 0 AND 32767),
    language      TEXT,
    uid           TEXT,
    props         TEXT,
    country       TEXT    CHECK (length(country) = 2),
    browser       TEXT,
    os            TEXT,
    device        TEXT    CHECK (device = 'desktop' OR device = 'mobile' OR device = 'tablet'),
    utm_source    TEXT,
    utm_medium    TEXT,
    utm_campaign  TEXT,
    utm_term      TEXT,
    utm_content   TEXT,
    gclid         TEXT,
    gbraid        TEXT,
    wbraid        TEXT,
    msclkid       TEXT,
    fbclid        TEXT,
    session_id    INTEGER,
    anonymous     INTEGER CHECK (anonymous = 1)
);
CREATE INDEX IF NOT EXISTS events_site_ts ON events (site_id, ts);

-- The secret salt of each UTC day (days since 1970-01-01), shared by every worker;
-- rows of days before yesterday are deleted (enrichment/visitor.py). dated: 1 when the
-- day's visitor ids carry the day in their high bits (every salt made since version 25);
-- 0 for a salt an older release made, whose day keeps the plain 64-bit hash.
CREATE TABLE IF NOT EXISTS visitor_salts (
    day         INTEGER PRIMARY KEY,
    salt        BLOB    NOT NULL CHECK (length(salt) = 32),
    created_at  INTEGER NOT NULL,
    dated       INTEGER NOT NULL DEFAULT 0 CHECK (dated IN (0, 1))
);

-- Monthly usage (issue 5) --------------------------------------------------
-- Counted events (all but a keyed $identify, and bots) per account and UTC month,
-- incremented in the flush transaction that stores them; `anonymous` of them came through
-- POST /api/v1/collect (version 16; the quota keeps the keyed reserve with it).
CREATE TABLE IF NOT EXISTS monthly_usage (
    account_id  INTEGER NOT NULL REFERENCES accounts (id),
    month       TEXT    NOT NULL CHECK (month GLOB '[0-9][0-9][0-9][0-9]-[01][0-9]'),
    events      INTEGER NOT NULL CHECK (events >= 0),
    anonymous   INTEGER NOT NULL DEFAULT 0 CHECK (anonymous >= 0),
    PRIMARY KEY (account_id, month)
) WITHOUT ROWID;

-- Sessions, identities, attribution (issue 6) ------------------------------

-- A visit: a visitor's events with gaps of at most 30 minutes. Its source, channel,
-- referrer, landing page and UTM values are those of its earliest event.
CREATE TABLE IF NOT EXISTS sessions (
    id            INTEGER PRIMARY KEY,
    site_id       INTEGER NOT NULL REFERENCES sites (id),
    visitor_id    INTEGER NOT NULL,
    started_at    INTEGER NOT NULL,
    last_seen_at  INTEGER NOT NULL CHECK (last_seen_at >= started_at),
    channel       TEXT    NOT NULL CHECK (length(channel) BETWEEN 1 AND 40),
    source        TEXT,
    referrer      TEXT,
    landing_page  TEXT,
    entry_path    TEXT,
    utm_source    TEXT,
    utm_medium    TEXT,
    utm_campaign  TEXT,
    utm_term      TEXT,
    utm_content   TEXT,
    pageviews     INTEGER NOT NULL DEFAULT 0 CHECK (pageviews >= 0),
    custom_events INTEGER NOT NULL DEFAULT 0 CHECK (custom_events >= 0)
);
CREATE INDEX IF NOT EXISTS sessions_site_start ON sessions (site_id, started_at);
-- A visitor's sessions, for the flush and first touch. Without last_seen_at, which every
-- continued session changes: an index on it would be written on each of those updates.
CREATE INDEX IF NOT EXISTS sessions_site_visitor ON sessions (site_id, visitor_id);

-- Visitor ids are the events' signed 64-bit integers; a customer's visitor_id (text)
-- names one in decimal ("-4211997000335042181").
-- The visitor ids a session was seen under besides sessions.visitor_id (its first):
-- today's id of a session that crossed midnight UTC (when the daily salt, so the visitor
-- id, changed). Version 24 moved the first ids out: nearly every session has only one.
CREATE TABLE IF NOT EXISTS session_visitors (
    site_id    INTEGER NOT NULL REFERENCES sites (id),
    visitor_id INTEGER NOT NULL,
    session_id INTEGER NOT NULL REFERENCES sessions (id),
    PRIMARY KEY (site_id, visitor_id, session_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS session_visitors_session ON session_visitors (session_id);

-- Every visitor id of every session. Visitor id 0 is no visitor's: an erased visitor's
-- session kept as a customer's first touch (storage/maintenance.py).
CREATE VIEW IF NOT EXISTS session_links (site_id, visitor_id, session_id) AS
    SELECT site_id, visitor_id, id FROM sessions WHERE visitor_id <> 0
    UNION ALL
    SELECT site_id, visitor_id, session_id FROM session_visitors;

-- $identify: the caller's user id seen from a visitor (ip + ua under a daily salt).
CREATE TABLE IF NOT EXISTS visitor_identities (
    site_id    INTEGER NOT NULL REFERENCES sites (id),
    -- Bytes, as the validator counts them: length() counts characters and stops at a NUL.
    uid        TEXT    NOT NULL CHECK (length(CAST(uid AS BLOB)) BETWEEN 1 AND 128),
    visitor_id INTEGER NOT NULL,
    linked_at  INTEGER NOT NULL,
    PRIMARY KEY (site_id, uid, visitor_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS visitor_identities_visitor ON visitor_identities (site_id, visitor_id);

-- Each customer's first touch: the earliest session of any visitor linked to it now
-- (customer.visitor_id, or customer.user_id -> $identify -> visitor); NULL when none, so
-- Unattributed. The triggers below keep it current in the very transaction that changes
-- a customer, a link or a session, whoever writes it; reports join it per payment.
CREATE TABLE IF NOT EXISTS customer_first_touch (
    site_id     INTEGER NOT NULL REFERENCES sites (id),
    customer_id TEXT    NOT NULL,
    session_id  INTEGER REFERENCES sessions (id),
    PRIMARY KEY (site_id, customer_id)
) WITHOUT ROWID;

-- Inserting (site_id, customer_id) here recomputes that customer's first touch; the row
-- is removed by the same trigger, so the table stays empty. It is the one definition of
-- "first touch" that every trigger below calls.
CREATE TABLE IF NOT EXISTS first_touch_refresh (
    site_id     INTEGER NOT NULL,
    customer_id TEXT    NOT NULL
);
-- Version 24 reads session_links where session_visitors was read: the older body goes.
DROP TRIGGER IF EXISTS first_touch_refresh_run;
CREATE TRIGGER IF NOT EXISTS first_touch_refresh_run AFTER INSERT ON first_touch_refresh
BEGIN
    INSERT INTO customer_first_touch (site_id, customer_id, session_id)
    SELECT NEW.site_id, NEW.customer_id, (
        SELECT s.id FROM sessions s
         WHERE s.id IN (
            -- session_links, spelled out: joined, SQLite would read all of the site's.
            SELECT o.id
              FROM customers c CROSS JOIN sessions o
             WHERE c.site_id = NEW.site_id AND c.customer_id = NEW.customer_id
               AND o.site_id = c.site_id AND o.visitor_id = c.visitor_id AND o.visitor_id <> 0
            UNION ALL
            SELECT sv.session_id
              FROM customers c CROSS JOIN session_visitors sv
             WHERE c.site_id = NEW.site_id AND c.customer_id = NEW.customer_id
               AND sv.site_id = c.site_id AND sv.visitor_id = c.visitor_id
            UNION ALL
            SELECT o.id
              FROM customers c CROSS JOIN visitor_identities vi CROSS JOIN sessions o
             WHERE c.site_id = NEW.site_id AND c.customer_id = NEW.customer_id
               AND vi.site_id = c.site_id AND vi.uid = c.user_id
               AND o.site_id = vi.site_id AND o.visitor_id = vi.visitor_id AND o.visitor_id <> 0
            UNION ALL
            SELECT sv.session_id
              FROM customers c CROSS JOIN visitor_identities vi CROSS JOIN session_visitors sv
             WHERE c.site_id = NEW.site_id AND c.customer_id = NEW.customer_id
               AND vi.site_id = c.site_id AND vi.uid = c.user_id
               AND sv.site_id = vi.site_id AND sv.visitor_id = vi.visitor_id)
         ORDER BY s.started_at, s.id LIMIT 1)
    WHERE true
    ON CONFLICT (site_id, customer_id) DO UPDATE SET session_id = excluded.session_id;
    DELETE FROM first_touch_refresh WHERE rowid = NEW.rowid;
END;

CREATE TRIGGER IF NOT EXISTS first_touch_new_customer AFTER INSERT ON customers
BEGIN
    INSERT INTO first_touch_refresh (site_id, customer_id) VALUES (NEW.site_id, NEW.customer_id);
END;

CREATE TRIGGER IF NOT EXISTS first_touch_customer_links AFTER UPDATE OF user_id, visitor_id
    ON customers WHEN NEW.user_id IS NOT OLD.user_id OR NEW.visitor_id IS NOT OLD.visitor_id
BEGIN
    INSERT INTO first_touch_refresh (site_id, customer_id) VALUES (NEW.site_id, NEW.customer_id);
END;

CREATE TRIGGER IF NOT EXISTS first_touch_new_identity AFTER INSERT ON visitor_identities
BEGIN
    INSERT INTO first_touch_refresh (site_id, customer_id)
    SELECT site_id, customer_id FROM customers WHERE site_id = NEW.site_id AND user_id = NEW.uid;
END;

-- A session's new visitor id after midnight. A new session's own visitor id is refreshed
-- by its writer, once for all of a flush's new sessions (storage.sessions
-- first_touch_of_new_sessions): a row trigger on sessions cost ~1.5 us a new session.
-- The flush inserts links in bulk and most visitors are linked to no customer: WHEN skips the body
-- (whose UNION costs a temporary b-tree per row even when it finds nothing) unless the
-- visitor is a customer's or has an identity link. Version 8 replaced the unguarded one.
DROP TRIGGER IF EXISTS first_touch_new_session_visitor;
CREATE TRIGGER IF NOT EXISTS first_touch_new_session_visitor AFTER INSERT ON session_visitors
    WHEN EXISTS (SELECT 1 FROM customers
                  WHERE site_id = NEW.site_id AND visitor_id = CAST(NEW.visitor_id AS TEXT))
      OR EXISTS (SELECT 1 FROM visitor_identities
                  WHERE site_id = NEW.site_id AND visitor_id = NEW.visitor_id)
BEGIN
    INSERT INTO first_touch_refresh (site_id, customer_id)
    SELECT site_id, customer_id FROM customers
     WHERE site_id = NEW.site_id AND visitor_id = CAST(NEW.visitor_id AS TEXT)
    UNION
    SELECT c.site_id, c.customer_id
      FROM visitor_identities vi CROSS JOIN customers c
     WHERE vi.site_id = NEW.site_id AND vi.visitor_id = NEW.visitor_id
       AND c.site_id = vi.site_id AND c.user_id = vi.uid;
END;

-- An event older than a session's start arrived late and became its first event.
-- Version 24 replaced the body that read session_visitors.
DROP TRIGGER IF EXISTS first_touch_earlier_session;
CREATE TRIGGER IF NOT EXISTS first_touch_earlier_session AFTER UPDATE OF started_at ON sessions
    WHEN NEW.started_at < OLD.started_at
BEGIN
    INSERT INTO first_touch_refresh (site_id, customer_id)
    SELECT c.site_id, c.customer_id
      FROM session_links sv CROSS JOIN customers c
     WHERE sv.session_id = NEW.id AND c.site_id = sv.site_id
       AND c.visitor_id = CAST(sv.visitor_id AS TEXT)
    UNION
    SELECT c.site_id, c.customer_id
      FROM session_links sv CROSS JOIN visitor_identities vi CROSS JOIN customers c
     WHERE sv.session_id = NEW.id AND vi.site_id = sv.site_id AND vi.visitor_id = sv.visitor_id
       AND c.site_id = vi.site_id AND c.user_id = vi.uid;
END;

-- Customers stored before these tables existed get their first touch when the schema
-- is applied (a no-op on a new database).
INSERT INTO first_touch_refresh (site_id, customer_id) SELECT site_id, customer_id FROM customers;

-- Reports (issue 7) ----------------------------------------------------------
-- MRR reads, for a subscription stored without an amount, its latest succeeded charge
-- before an instant: a seek here instead of a walk over the site's payments.
CREATE INDEX IF NOT EXISTS payments_subscription
    ON payments (site_id, subscription_id, paid_at_ms) WHERE subscription_id IS NOT NULL;

-- Traffic of a UTC day (days since 1970-01-01), stored once the day can no longer change
-- (reports/days/traffic_days.py): the day's totals; and per breakdown dimension, a row saying its
-- values are stored, then one row per value.
CREATE TABLE IF NOT EXISTS traffic_days (
    site_id     INTEGER NOT NULL REFERENCES sites (id),
    day         INTEGER NOT NULL,
    visitors    INTEGER NOT NULL CHECK (visitors >= 0),
    pageviews   INTEGER NOT NULL CHECK (pageviews >= 0),
    sessions    INTEGER NOT NULL CHECK (sessions >= 0),
    events      INTEGER NOT NULL CHECK (events >= 0),
    bounces     INTEGER NOT NULL CHECK (bounces BETWEEN 0 AND sessions),
    duration_ms INTEGER NOT NULL CHECK (duration_ms >= 0),
    PRIMARY KEY (site_id, day)
) WITHOUT ROWID;

-- Version 15: the key's columns come first, in key order (storage/migrations.py), as in
-- every WITHOUT ROWID table here: SQLite 3.40's PRAGMA quick_check reports NULLs that are
-- not there in a WITHOUT ROWID table whose key lists its columns in another order
-- (tests/test_sqlite_gates.py).
CREATE TABLE IF NOT EXISTS traffic_day_dimensions (
    site_id     INTEGER NOT NULL REFERENCES sites (id),
    dimension   TEXT    NOT NULL CHECK (dimension IN ('channel', 'source', 'entry_page', 'page',
                                        'country', 'device', 'browser', 'os', 'event')),
    day         INTEGER NOT NULL,
    PRIMARY KEY (site_id, dimension, day)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS traffic_day_values (
    site_id     INTEGER NOT NULL,
    day         INTEGER NOT NULL,
    dimension   TEXT    NOT NULL,
    value       TEXT,
    visitors    INTEGER NOT NULL CHECK (visitors >= 0),
    pageviews   INTEGER NOT NULL CHECK (pageviews >= 0),
    events      INTEGER NOT NULL CHECK (events >= 0),
    FOREIGN KEY (site_id, dimension, day) REFERENCES traffic_day_dimensions (site_id, dimension, day)
);
CREATE INDEX IF NOT EXISTS traffic_day_values_read ON traffic_day_values (site_id, dimension, day);

-- Stripe webhooks (issue 17) -------------------------------------------------
-- Each site's webhook signing secret (whsec_...). HMAC verification needs the secret
-- itself, so it cannot be stored hashed: it is kept here, never logged or printed;
-- `tally` shows only its fingerprint (a SHA-256 prefix).
CREATE TABLE IF NOT EXISTS stripe_webhook_secrets (
    site_id     INTEGER PRIMARY KEY REFERENCES sites (id),
    secret      TEXT    NOT NULL CHECK (length(secret) BETWEEN 7 AND 256),
    fingerprint TEXT    NOT NULL,
    created_at  INTEGER NOT NULL
);

-- Every Stripe event applied, by its id, so a redelivery is answered without applying it
-- twice; written in the transaction that applies the event.
CREATE TABLE IF NOT EXISTS stripe_events (
    site_id     INTEGER NOT NULL REFERENCES sites (id),
    event_id    TEXT    NOT NULL CHECK (length(event_id) BETWEEN 1 AND 255),
    type        TEXT    NOT NULL,
    created     INTEGER NOT NULL,  -- the event's own time, unix seconds
    received_at INTEGER NOT NULL,
    PRIMARY KEY (site_id, event_id)
) WITHOUT ROWID;

-- The newest version applied of each Stripe charge, refund, dispute and invoice: (rank of
-- its status, time of its event). An older version arriving late is not applied, so
-- deliveries out of order end in the state of the newest.
CREATE TABLE IF NOT EXISTS stripe_objects (
    site_id     INTEGER NOT NULL REFERENCES sites (id),
    object_id   TEXT    NOT NULL,
    rank        INTEGER NOT NULL,
    created     INTEGER NOT NULL,  -- unix seconds
    PRIMARY KEY (site_id, object_id)
) WITHOUT ROWID;

-- Browser visitor ids (issue 13) ---------------------------------------------
-- The script's tally_vid cookie holds a random id; events that carry it are stored under
-- a keyed hash of (site, that id) with this one secret key, which never rotates, so a
-- browser stays one visitor across days (enrichment/browser_ids.py).
CREATE TABLE IF NOT EXISTS browser_id_key (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    key         BLOB    NOT NULL CHECK (length(key) = 32),
    created_at  INTEGER NOT NULL
);

-- The day's ip+ua visitor id (daily salt) seen from a browser id's visitor: events
-- without a browser id from that ip+ua are stored under the browser's visitor. The
-- latest browser seen wins. Rows of days before yesterday are deleted with the salts.
CREATE TABLE IF NOT EXISTS browser_links (
    site_id          INTEGER NOT NULL REFERENCES sites (id),
    daily_visitor_id INTEGER NOT NULL,
    visitor_id       INTEGER NOT NULL,
    day              INTEGER NOT NULL,
    seen_at          INTEGER NOT NULL,
    PRIMARY KEY (site_id, daily_visitor_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS browser_links_day ON browser_links (day);

-- Dashboard users, their sign-in sessions, failed sign-ins and shared links -----------
-- A user sees the sites of the accounts linked in user_accounts. Session ids and share
-- tokens are stored only as SHA-256 digests; passwords as argon2id hashes (dashboard/passwords.py).

CREATE TABLE IF NOT EXISTS users (
    id            INTEGER PRIMARY KEY,
    public_id     TEXT    NOT NULL UNIQUE,
    email         TEXT    NOT NULL UNIQUE CHECK (email = lower(email) AND length(email) BETWEEN 3 AND 254),
    password_hash TEXT    NOT NULL CHECK (password_hash LIKE '$argon2id$%'),
    created_at    INTEGER NOT NULL
);

-- role: what the user may do in the account (issue 30; version 19 added it, and every
-- earlier member became an owner): owner (everything, and its people), admin (sites,
-- hostnames, keys, shared links), viewer (dashboards only).
CREATE TABLE IF NOT EXISTS user_accounts (
    user_id     INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    account_id  INTEGER NOT NULL REFERENCES accounts (id),
    role        TEXT    NOT NULL DEFAULT 'owner' CHECK (role IN ('owner', 'admin', 'viewer')),
    PRIMARY KEY (user_id, account_id)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS user_sessions (
    id_hash     BLOB    PRIMARY KEY CHECK (length(id_hash) = 32),
    user_id     INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    csrf_token  TEXT    NOT NULL CHECK (length(csrf_token) >= 32),
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL CHECK (expires_at > created_at)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS user_sessions_user ON user_sessions (user_id);

-- One row per failed sign-in, by the email tried and by the client address.
CREATE TABLE IF NOT EXISTS login_failures (
    id          INTEGER PRIMARY KEY,
    email       TEXT    NOT NULL,
    client_ip   TEXT    NOT NULL,
    at_ms       INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS login_failures_email ON login_failures (email, at_ms);
CREATE INDEX IF NOT EXISTS login_failures_ip ON login_failures (client_ip, at_ms);

CREATE TABLE IF NOT EXISTS shared_links (
    id          INTEGER PRIMARY KEY,
    public_id   TEXT    NOT NULL UNIQUE,
    site_id     INTEGER NOT NULL REFERENCES sites (id),
    token_hash  BLOB    NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    revenue     INTEGER NOT NULL CHECK (revenue IN (0, 1)),
    created_at  INTEGER NOT NULL,
    revoked_at  INTEGER
);
CREATE INDEX IF NOT EXISTS shared_links_site ON shared_links (site_id);

-- Retention and erasure (issue 16) ------------------------------------------
-- Counted events deleted by `tally prune` or `tally visitor erase`, per account and UTC
-- month of their ts, with those near the month's start or end (storage/check.py): the
-- usage they were billed under stays, and `tally check` adds these to the stored events.
CREATE TABLE IF NOT EXISTS deleted_events (
    account_id  INTEGER NOT NULL REFERENCES accounts (id),
    month       TEXT    NOT NULL CHECK (length(month) = 7),
    events      INTEGER NOT NULL CHECK (events >= 0),
    early       INTEGER NOT NULL CHECK (early >= 0),
    late        INTEGER NOT NULL CHECK (late >= 0),
    PRIMARY KEY (account_id, month)
) WITHOUT ROWID;

-- Stats API v2 (issue 14) -----------------------------------------------------
-- Traffic of a segment (filters and/or a goal, reports/segments/filters.py segment_key) per UTC
-- day, stored like traffic_days once the day is final (reports/segments/segment_days.py). A site keeps
-- at most MAX_STORED_SEGMENTS segments; further segments are counted live every time.
CREATE TABLE IF NOT EXISTS traffic_segments (
    site_id     INTEGER NOT NULL REFERENCES sites (id),
    segment     TEXT    NOT NULL CHECK (length(segment) BETWEEN 1 AND 40000),
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (site_id, segment)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS traffic_segment_days (
    site_id     INTEGER NOT NULL,
    segment     TEXT    NOT NULL,
    day         INTEGER NOT NULL,
    visitors    INTEGER NOT NULL CHECK (visitors >= 0),
    pageviews   INTEGER NOT NULL CHECK (pageviews >= 0),
    sessions    INTEGER NOT NULL CHECK (sessions >= 0),
    events      INTEGER NOT NULL CHECK (events >= 0),
    bounces     INTEGER NOT NULL CHECK (bounces BETWEEN 0 AND sessions),
    duration_ms INTEGER NOT NULL CHECK (duration_ms >= 0),
    conversions INTEGER NOT NULL CHECK (conversions >= 0),
    goal_events INTEGER NOT NULL CHECK (goal_events >= 0),
    PRIMARY KEY (site_id, segment, day),
    FOREIGN KEY (site_id, segment) REFERENCES traffic_segments (site_id, segment)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS traffic_segment_dimensions (
    site_id     INTEGER NOT NULL,
    segment     TEXT    NOT NULL,
    dimension   TEXT    NOT NULL,
    day         INTEGER NOT NULL,
    PRIMARY KEY (site_id, segment, dimension, day),
    FOREIGN KEY (site_id, segment) REFERENCES traffic_segments (site_id, segment)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS traffic_segment_values (
    site_id     INTEGER NOT NULL,
    segment     TEXT    NOT NULL,
    dimension   TEXT    NOT NULL,
    day         INTEGER NOT NULL,
    value       TEXT,
    visitors    INTEGER NOT NULL CHECK (visitors >= 0),
    pageviews   INTEGER NOT NULL CHECK (pageviews >= 0),
    events      INTEGER NOT NULL CHECK (events >= 0),
    conversions INTEGER NOT NULL CHECK (conversions >= 0),
    goal_events INTEGER NOT NULL CHECK (goal_events >= 0),
    FOREIGN KEY (site_id, segment, dimension, day)
        REFERENCES traffic_segment_dimensions (site_id, segment, dimension, day)
);
CREATE INDEX IF NOT EXISTS traffic_segment_values_read
    ON traffic_segment_values (site_id, segment, dimension, day);
-- Robustness (issue 12) ---------------------------------------------------------
-- Version 14: visitor_identities.uid is checked in bytes (storage/migrations.py).
-- Accepted events the flush could not store (a constraint, a datatype, a bug: anything a
-- retry cannot fix), each set aside alone with the reason, so no event holds up another
-- (ingest/flusher.py). `event` is the validated event as JSON, without the raw IP address.
-- `tally check` counts them; `tally deadletter list` shows them.
CREATE TABLE IF NOT EXISTS dead_letters (
    id          INTEGER PRIMARY KEY,
    site_id     INTEGER NOT NULL,
    account_id  INTEGER NOT NULL,
    month       TEXT    NOT NULL,
    set_aside_at INTEGER NOT NULL,
    reason      TEXT    NOT NULL,
    event       TEXT    NOT NULL CHECK (json_valid(event))
);

-- Anonymous traffic (issue 26) -----------------------------------------------------
-- Version 16 added events.anonymous (storage/migrations.py) and these tables.
-- A site's identity secret: the HMAC-SHA256 key under which the site's server signs a
-- user id for the browser's `$identify`, so that it may link a customer. Tally computes
-- the HMAC itself, so the key is kept as it is (like browser_id_key), shown once.
CREATE TABLE IF NOT EXISTS site_identity_secrets (
    site_id     INTEGER PRIMARY KEY REFERENCES sites (id),
    secret      TEXT    NOT NULL CHECK (length(secret) BETWEEN 32 AND 128),
    created_at  INTEGER NOT NULL
);

-- The installation's key for the sign-in form's CSRF token, an HMAC of the nonce in the
-- form's cookie (dashboard/web.py); made on first use, never rotated.
CREATE TABLE IF NOT EXISTS sign_in_key (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    key         BLOB    NOT NULL CHECK (length(key) = 32),
    created_at  INTEGER NOT NULL
);

-- The client address blocks (IPv4 address, IPv6 /64) a user signed in from lately: the
-- email-wide limit on failed sign-ins never refuses those (storage/users.py).
CREATE TABLE IF NOT EXISTS sign_in_addresses (
    user_id     INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    address     TEXT    NOT NULL,
    last_at     INTEGER NOT NULL,
    PRIMARY KEY (user_id, address)
) WITHOUT ROWID;

-- First run and invitations (issue 30) ---------------------------------------------
-- One-time links, stored as SHA-256 digests of their tokens. A setup link creates the
-- first user of an installation that has none (all of them are deleted then); an
-- invitation makes its taker a member of one account with a role.
CREATE TABLE IF NOT EXISTS setup_tokens (
    id          INTEGER PRIMARY KEY,
    token_hash  BLOB    NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL CHECK (expires_at > created_at)
);

CREATE TABLE IF NOT EXISTS invitations (
    id          INTEGER PRIMARY KEY,
    public_id   TEXT    NOT NULL UNIQUE,
    account_id  INTEGER NOT NULL REFERENCES accounts (id),
    role        TEXT    NOT NULL CHECK (role IN ('owner', 'admin', 'viewer')),
    token_hash  BLOB    NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    invited_by  INTEGER REFERENCES users (id) ON DELETE SET NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL CHECK (expires_at > created_at),
    used_at     INTEGER,
    revoked_at  INTEGER
);
CREATE INDEX IF NOT EXISTS invitations_account ON invitations (account_id);


-- Funnels (issue 30) -----------------------------------------------------------------
-- Version 20 added it. A site's named funnels: `steps` is the JSON list of the funnel's
-- steps as GET /api/v1/stats/funnel takes them (reports/funnels/steps.py checks them).
CREATE TABLE IF NOT EXISTS funnels (
    id          INTEGER PRIMARY KEY,
    site_id     INTEGER NOT NULL REFERENCES sites (id),
    name        TEXT    NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
    steps       TEXT    NOT NULL CHECK (json_valid(steps)),
    created_at  INTEGER NOT NULL,
    UNIQUE (site_id, name)
);

PRAGMA user_version = 25;
