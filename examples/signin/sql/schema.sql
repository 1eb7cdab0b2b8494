-- The example application's tables, behind the mail topics: accounts, sign-in
-- codes (only their hashes) and pending email changes (only their token
-- hashes). The example creates them itself (examples.signin.create_schema).
CREATE TABLE IF NOT EXISTS user_accounts (
    id         uuid        PRIMARY KEY,
    email      text        NOT NULL,
    created_at timestamptz NOT NULL
);

CREATE UNIQUE INDEX IF NOT EXISTS user_accounts_email_idx ON user_accounts (lower(email));

CREATE TABLE IF NOT EXISTS user_login_codes (
    id         uuid        PRIMARY KEY,
    account_id uuid        NOT NULL REFERENCES user_accounts (id) ON DELETE CASCADE,
    code_hash  bytea       NOT NULL,
    expires_at timestamptz NOT NULL,
    used_at    timestamptz,
    created_at timestamptz NOT NULL
);

CREATE INDEX IF NOT EXISTS user_login_codes_account_idx
    ON user_login_codes (account_id)
    WHERE used_at IS NULL;

CREATE TABLE IF NOT EXISTS user_email_changes (
    id           uuid        PRIMARY KEY,
    account_id   uuid        NOT NULL REFERENCES user_accounts (id) ON DELETE CASCADE,
    new_email    text        NOT NULL,
    token_hash   bytea       NOT NULL UNIQUE,
    expires_at   timestamptz NOT NULL,
    confirmed_at timestamptz,
    created_at   timestamptz NOT NULL
);
