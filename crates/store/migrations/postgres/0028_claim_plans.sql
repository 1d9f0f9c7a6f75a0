-- Two plans that made the claim of a queued job cost more than it should
-- (issue 59: the 8-worker chained hand-out ran at 0.50-0.54x its rate
-- before fair share).
--
-- 1. The per-key index (migration 0021) is partial on `state = 'queued'`,
--    which every claim (`pool = $1 AND state = 'queued' ORDER BY
--    share_tag, id LIMIT 1`) implies, so a claim could read it. Whenever
--    the statistics said the pool had no queued job (a queue that was
--    empty at the last ANALYZE and has filled since: a burst, a new pool;
--    with a long history ANALYZE waits for 10 % of it to change) the
--    planner guessed one row, found this index the smallest, and so read
--    every queued job of the pool and sorted them for each claim: 1.2 ms
--    at 3,000 queued where `jobs_live` reads one entry. In the hand-out
--    benchmark 14 of 16 sampled claims planned so. The sort also widened
--    the time between a claim's snapshot and its row locks, in which
--    another runner's start commits; the claim then locks that (now
--    running) row before it finds it no longer queued, and that runner's
--    completion waits for the claimer's commit (10x the lock waits of the
--    build before). A predicate no claim implies keeps every claim off
--    it: `share_key IS NOT NULL` holds for every row (the column is NOT
--    NULL), and the lookups the index is for (a key's last queued tag,
--    `share_key = $k`, in the trigger and in a bulk enqueue) imply it,
--    since `=` is strict. Leading with the key instead is not enough: a
--    partial index whose predicate a query implies may be scanned whole.
DROP INDEX IF EXISTS jobs_share;
CREATE INDEX jobs_share ON jobs (pool, share_key, share_tag)
    WHERE state = 'queued' AND share_key IS NOT NULL;

-- 2. PL/pgSQL plans a function's statement with its arguments for the
--    first five calls and then keeps a generic plan only if it does not
--    look dearer than those. The cap's subquery (a count per candidate
--    row, costed for every row the generic plan might read) makes the
--    generic plan of the chained completion's claim look dearer every
--    time, so each call planned the statement again: 0.2-0.4 ms of a
--    completion's 0.5. The generic plan reads `jobs_live` in tag order
--    (the only index that gives that order for a pool's queued jobs) and
--    evaluates the cap only for a candidate, so it is the plan to keep.
ALTER FUNCTION runway_start_next(text, bigint, text, bigint, bigint, text, bigint)
    SET plan_cache_mode = force_generic_plan;
