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

-- Events (issue 4) ---------------------------------------------------------

-- Monthly usage (issue 5) --------------------------------------------------

-- Sessions, identities, attribution (issue 6) ------------------------------

PRAGMA user_version = 1;
