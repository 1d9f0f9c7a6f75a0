#!/usr/bin/env bash
# Intake and hand-out throughput with 1, 2 and 3 replicas on one PostgreSQL
# database, measured in one run, alternating replica counts each round so
# the machine's noise falls on all of them alike. Every replica, the
# database and the load generator share this machine.
#
#   scripts/bench-replicas.sh [ROUNDS]      (release build first:
#                                            cargo build --release --locked -p runway -p runway-bench)
#
# PG_URL (default postgres://postgres@127.0.0.1:5432) names the server; the
# script creates and drops its own database `runway_bench_replicas`.
set -euo pipefail
ROUNDS=${1:-3}
DB=runway_bench_replicas
SECRET=bench-webhook-secret
source "$(dirname "$0")/bench-common.sh"
trap 'bench_cleanup runway-bench-replicas' EXIT
bench_config "[github]
webhook_secrets = [\"$SECRET\"]"

run() {
  local replicas=$1 urls="" hooks=""
  fresh_database "$DB"
  for i in $(seq 1 "$replicas"); do
    local port=$((18700 + i))
    # The marker in argv lets the trap find every replica.
    bench_serve runway-bench-replicas "$RUNWAY" "$PG_URL/$DB" "$port" "$DIR/replica-$i.log"
    urls+="${urls:+,}http://127.0.0.1:$port"
    hooks+="${hooks:+,}http://127.0.0.1:$port/webhooks/github"
  done
  local intake drain
  intake=$(RUNWAY_BENCH_SECRET=$SECRET "$BENCH" intake --url "$hooks" --count 5000 \
    --concurrency 32 | awk '/^throughput/ {print $2}')
  drain=$(RUNWAY_TOKEN=$ADMIN "$BENCH" drain --url "$urls" --jobs 2000 --runners 16 \
    | awk '/^drain/ {print $2}')
  echo "$replicas $intake $drain"
  pkill -f "runway-bench-replicas" || true
  wait 2>/dev/null || true
}

echo "replicas webhooks/s drain-jobs/s"
for round in $(seq 1 "$ROUNDS"); do
  for replicas in 1 2 3; do
    echo -n "round $round: "
    run "$replicas"
  done
done
psql "$PG_URL/postgres" -qc "DROP DATABASE IF EXISTS $DB" >/dev/null
