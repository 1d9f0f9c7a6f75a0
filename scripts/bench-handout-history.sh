#!/usr/bin/env bash
# The runner API's hand-out on PostgreSQL with an empty store and with a long
# history (scripts/handout-history-seed.sql: 1,000,000 finished jobs, 200,000
# ended runners), two-phase, one-step and with completions that start the
# next job (`--next`), alternating in one run: the per-request writes must
# cost the same whatever the history.
#
#   scripts/bench-handout-history.sh [ROUNDS]   (release build first:
#                                                cargo build --release --locked -p runway -p runway-bench)
set -euo pipefail
ROUNDS=${1:-2}
SEED=$(realpath scripts/handout-history-seed.sql)
DB=runway_bench_history
PORT=18770
source "$(dirname "$0")/bench-common.sh"
trap 'bench_cleanup runway-bench-history "$DB"' EXIT
bench_config

# run empty|history [--start-at-once | --next]
run() {
  local store=$1
  shift
  fresh_database "$DB"
  bench_serve runway-bench-history "$RUNWAY" "$PG_URL/$DB" "$PORT" "$DIR/server.log"
  if [ "$store" = history ]; then
    psql -q "$PG_URL/$DB" -f "$SEED" >/dev/null
  fi
  RUNWAY_TOKEN=$ADMIN "$BENCH" drain --url "http://127.0.0.1:$PORT" --jobs 2000 \
    --runners 16 "$@" | awk '/^drain/ {print $2}'
  pkill -f "runway-bench-history" || true
  wait 2>/dev/null || true
}

echo "round mode empty history (jobs/s)"
for round in $(seq 1 "$ROUNDS"); do
  for mode in two-phase one-step next; do
    flag=()
    [ "$mode" = one-step ] && flag=(--start-at-once)
    [ "$mode" = next ] && flag=(--next)
    empty=$(run empty "${flag[@]}")
    history=$(run history "${flag[@]}")
    echo "$round $mode $empty $history"
  done
done
