#!/usr/bin/env bash
# Hand-out through the runner API over HTTP, end to end: one `runway serve`
# on PostgreSQL (a fresh database each round) or SQLite (a fresh file), and
# `runway-bench drain` (2,000 jobs submitted, then taken by 16 runners),
# once with the two-phase start (request → accept → complete), once with
# jobs that start at once (request with "start": true → complete) and once
# with completions that start the next job (`--next`: complete with
# "next": true, one call a job). Rounds
# alternate the variants so the machine's noise falls on all of them alike.
# With BASE=path/to/another/runway, that binary's two-phase run is measured
# in the same rounds (a build of an earlier commit, say); each server is
# driven by its own binary's `bench drain`.
#
#   scripts/bench-handout.sh [ROUNDS]       (release build first:
#                                            cargo build --release --locked -p runway -p runway-bench)
#
# PG_URL (default postgres://postgres@127.0.0.1:5432) names the server; the
# script creates and drops its own database `runway_bench_handout`.
set -euo pipefail
ROUNDS=${1:-3}
DB=runway_bench_handout
PORT=18750
source "$(dirname "$0")/bench-common.sh"
trap 'bench_cleanup runway-bench-handout "$DB"' EXIT
bench_config

# run BINARY BACKEND [--start-at-once]: prints the drain rate in jobs/s.
run() {
  local binary=$1 backend=$2 database
  shift 2
  if [ "$backend" = postgres ]; then
    fresh_database "$DB"
    database="$PG_URL/$DB"
  else
    rm -f "$DIR"/handout.db*
    database="$DIR/handout.db"
  fi
  # The marker in argv lets the trap find the server.
  bench_serve runway-bench-handout "$binary" "$database" "$PORT" "$DIR/server.log"
  RUNWAY_TOKEN=$ADMIN "$BENCH" drain --url "http://127.0.0.1:$PORT" --jobs 2000 \
    --runners 16 "$@" | awk '/^drain/ {print $2}'
  pkill -f "runway-bench-handout" || true
  wait 2>/dev/null || true
}

echo "round backend ${BASE:+base-two-phase }two-phase start-at-once next (jobs/s)"
for round in $(seq 1 "$ROUNDS"); do
  for backend in postgres sqlite; do
    base=""
    if [ -n "$BASE" ]; then
      base="$(run "$BASE" "$backend") "
    fi
    two=$(run "$RUNWAY" "$backend")
    once=$(run "$RUNWAY" "$backend" --start-at-once)
    next=$(run "$RUNWAY" "$backend" --next)
    echo "$round $backend $base$two $once $next"
  done
done
