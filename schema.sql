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
CREATE TABLE IF NOT EXISTS subscription_observations (
    id                    INTEGER PRIMARY KEY,
    site_id               INTEGER NOT NULL REFERENCES sites (id),
    payment_id            TEXT    NOT NULL,
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

-- The latest state of each subscription: a copy of its observation with the greatest
-- effective_at_ms (the later received on a tie), so a late retry of an old payment
-- never rolls a subscription back.
CREATE TABLE IF NOT EXISTS subscriptions (
    id                    INTEGER PRIMARY KEY,
    site_id               INTEGER NOT NULL REFERENCES sites (id),
    subscription_id       TEXT    NOT NULL CHECK (length(subscription_id) BETWEEN 1 AND 128),
    customer_id           TEXT    NOT NULL,
    payment_id            TEXT    NOT NULL,
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
-- visitor_id: signed 64-bit keyed hash of (daily salt, site, ip, ua); NULL without ip
-- or ua. The raw IP is never stored. session_id is filled by the attribution step of
-- the flush (issue 6). One index: reports read a site's events over a time range.
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
    session_id    INTEGER
);
CREATE INDEX IF NOT EXISTS events_site_ts ON events (site_id, ts);

-- The secret salt of each UTC day (days since 1970-01-01), shared by every worker;
-- rows of days before yesterday are deleted (enrichment/visitor.py).
CREATE TABLE IF NOT EXISTS visitor_salts (
    day         INTEGER PRIMARY KEY,
    salt        BLOB    NOT NULL CHECK (length(salt) = 32),
    created_at  INTEGER NOT NULL
);

-- Monthly usage (issue 5) --------------------------------------------------
-- Counted events (all but $identify and bots) per account and UTC month, incremented
-- in the flush transaction that stores them.
CREATE TABLE IF NOT EXISTS monthly_usage (
    account_id  INTEGER NOT NULL REFERENCES accounts (id),
    month       TEXT    NOT NULL CHECK (month GLOB '[0-9][0-9][0-9][0-9]-[01][0-9]'),
    events      INTEGER NOT NULL CHECK (events >= 0),
    PRIMARY KEY (account_id, month)
) WITHOUT ROWID;

-- Sessions, identities, attribution (issue 6) ------------------------------

PRAGMA user_version = 3;
