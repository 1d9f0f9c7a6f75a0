#!/usr/bin/env bash
# Webhook intake on PostgreSQL, several builds compared in the same rounds:
# for each round and each BINARY, a fresh database `runway_bench_intake_pg`,
# one `BINARY serve` with a webhook secret, then `runway-bench intake`
# (10,000 signed 7 kB `queued` webhooks, 16 connections). Prints one line
# per run: round, binary, the bench's summary.
#
#   scripts/bench-intake-postgres.sh ROUNDS BINARY [BINARY…]
#
# PG_URL (default postgres://postgres@127.0.0.1:5432) names the server; the
# database is dropped at the end.
set -euo pipefail
ROUNDS=${1:?rounds}
shift
DB=runway_bench_intake_pg
PORT=18770
source "$(dirname "$0")/bench-common.sh"
trap 'bench_cleanup runway-bench-intake "$DB"' EXIT
bench_config '[github]
webhook_secrets = ["bench-secret"]'
for round in $(seq 1 "$ROUNDS"); do
  for binary in "$@"; do
    binary=$(realpath "$binary")
    fresh_database "$DB"
    bench_serve runway-bench-intake "$binary" "$PG_URL/$DB" "$PORT" "$DIR/server.log"
    summary=$("$BENCH" intake --url "http://127.0.0.1:$PORT/webhooks/github" \
      --secret bench-secret --count 10000 --concurrency 16 2>&1 | tr -s ' \n' ' ')
    echo "$round $binary $summary"
    pkill -f runway-bench-intake || true
    wait 2>/dev/null || true
  done
done
