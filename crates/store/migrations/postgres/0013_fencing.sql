-- Fencing: a session that set `runway.fence` to 'NAME:TERM' (the store a
-- leader gets from `Store::fenced`) may change runners and once-keys only
-- while TERM is still the current term of NAME. The check takes a share
-- lock on the term's row in the writing transaction itself, so a new
-- leader's `begin_term` (which updates that row) waits for writes of the
-- old term in flight, and every later write of the old term fails with
-- SQLSTATE RW001. Sessions without the setting are not checked.
CREATE FUNCTION runway_check_fence() RETURNS trigger AS $$
DECLARE
    fence text := current_setting('runway.fence', true);
BEGIN
    IF fence IS NOT NULL AND fence <> '' THEN
        PERFORM 1 FROM leader_terms
            WHERE name = split_part(fence, ':', 1)
              AND term = split_part(fence, ':', 2)::bigint
            FOR SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'leadership term % is over: another replica leads', fence
                USING ERRCODE = 'RW001';
        END IF;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER runners_fence BEFORE INSERT OR UPDATE OR DELETE ON runners
    FOR EACH ROW EXECUTE FUNCTION runway_check_fence();
CREATE TRIGGER once_keys_fence BEFORE INSERT OR UPDATE OR DELETE ON once_keys
    FOR EACH ROW EXECUTE FUNCTION runway_check_fence();
