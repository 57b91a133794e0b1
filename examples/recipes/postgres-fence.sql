-- Fencing a PostgreSQL resource with zklock's tokens (docs/user-guide.md: "Fencing in your own
-- store"). Run once per database. Then every unit of work a holder does runs, in one transaction,
--     SELECT zklock_fence('<resource>', <its token>);  -- refuses a token below the last accepted
--     ... the work ...
-- so that a stale holder's late transaction is rolled back, whatever it did before the check.

CREATE TABLE IF NOT EXISTS zklock_fence (
    resource text PRIMARY KEY,
    token    bigint NOT NULL
);

-- Raises (SQLSTATE 40001, a serialization failure: the transaction is rolled back) unless
-- `p_token` is no lower than the token `p_resource` last accepted, and records it. The row's lock
-- orders two holders' transactions: the later one's check sees the earlier one's token once it
-- committed.
CREATE OR REPLACE FUNCTION zklock_fence(p_resource text, p_token bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO zklock_fence AS f (resource, token) VALUES (p_resource, p_token)
        ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token WHERE f.token <= EXCLUDED.token;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'zklock fencing: token % of % is below the token % it last accepted', p_token, p_resource,
            (SELECT f.token FROM zklock_fence f WHERE f.resource = p_resource)
            USING ERRCODE = '40001';
    END IF;
END
$$;
