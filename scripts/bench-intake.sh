#!/usr/bin/env bash
# Webhook intake, several builds compared in the same rounds: for each
# round and each BINARY, a fresh store, one `BINARY serve` with a webhook
# secret, then `runway-bench intake` (10,000 signed 7 kB `queued` webhooks,
# 16 connections) with the server's pid, so it reports the server's CPU
# time per webhook beside throughput and latency. Prints one line per run:
# round, binary, the bench's summary.
#
#   scripts/bench-intake.sh STORE ROUNDS BINARY [BINARY…]
#
# STORE: `sqlite` (a new file a run) or `postgres` (a fresh database
# `runway_bench_intake_pg` on PG_URL, default
# postgres://postgres@127.0.0.1:5432, dropped at the end).
set -euo pipefail
STORE=${1:?store: sqlite or postgres}
ROUNDS=${2:?rounds}
shift 2
DB=runway_bench_intake_pg
PORT=18770
source "$(dirname "$0")/bench-common.sh"
trap 'bench_cleanup runway-bench-intake "$DB"' EXIT
bench_config '[github]
webhook_secrets = ["bench-secret"]'
for round in $(seq 1 "$ROUNDS"); do
  for binary in "$@"; do
    binary=$(realpath "$binary")
    case "$STORE" in
      postgres) fresh_database "$DB"; database="$PG_URL/$DB" ;;
      sqlite) rm -f "$DIR"/intake.db*; database="sqlite://$DIR/intake.db" ;;
      *) echo "STORE must be sqlite or postgres, not $STORE" >&2; exit 2 ;;
    esac
    bench_serve runway-bench-intake "$binary" "$database" "$PORT" "$DIR/server.log"
    pid=$(pgrep -f runway-bench-intake | head -1)
    summary=$("$BENCH" intake --url "http://127.0.0.1:$PORT/webhooks/github" \
      --secret bench-secret --count 10000 --concurrency 16 --server-pid "$pid" 2>&1 | tr -s ' \n' ' ')
    echo "$round $binary $summary"
    pkill -f runway-bench-intake || true
    wait 2>/dev/null || true
  done
done
