-- The user domain's queries. Same conventions as the outbox's: a `-- name --`
-- header, named parameters, the time always passed in.

-- account_upsert --
-- The account for an email, created on first use (sign-in links sign people up).
INSERT INTO user_accounts (id, email, created_at)
VALUES (%(id)s, %(email)s, %(now)s)
ON CONFLICT ((lower(email))) DO UPDATE SET email = user_accounts.email
RETURNING id, email;

-- account_get --
-- One account by id.
SELECT id, email FROM user_accounts WHERE id = %(id)s;

-- account_by_email --
-- One account by email, case-insensitively.
SELECT id, email FROM user_accounts WHERE lower(email) = lower(%(email)s);

-- account_set_email --
-- Change an account's email.
UPDATE user_accounts SET email = %(email)s WHERE id = %(id)s;

-- login_code_insert --
-- Store a sign-in code's hash and expiry.
INSERT INTO user_login_codes (id, account_id, code_hash, expires_at, created_at)
VALUES (%(id)s, %(account_id)s, %(code_hash)s, %(expires_at)s, %(now)s);

-- login_code_redeem --
-- Use an unexpired, unused code of the account once; returns it if it matched.
UPDATE user_login_codes
SET used_at = %(now)s
WHERE id = (
    SELECT id FROM user_login_codes
    WHERE account_id = %(account_id)s
      AND code_hash = %(code_hash)s
      AND used_at IS NULL
      AND expires_at > %(now)s
    ORDER BY created_at DESC
    LIMIT 1
    FOR UPDATE
)
RETURNING id;

-- email_change_insert --
-- Store a pending email change with its token's hash and expiry.
INSERT INTO user_email_changes (id, account_id, new_email, token_hash, expires_at, created_at)
VALUES (%(id)s, %(account_id)s, %(new_email)s, %(token_hash)s, %(expires_at)s, %(now)s);

-- email_change_confirm --
-- Confirm a pending, unexpired change once; returns the account and new email.
UPDATE user_email_changes
SET confirmed_at = %(now)s
WHERE token_hash = %(token_hash)s
  AND confirmed_at IS NULL
  AND expires_at > %(now)s
RETURNING account_id, new_email;
