#!/usr/bin/env bash
# The console's cost with an empty store, with eight days of the pool's
# sampled history only (console-history-seed.sql: what the charts read),
# and with that and a long history: a million finished jobs and 200,000
# ended runners (handout-history-seed.sql); each with 300 jobs queued in a
# paused pool. Measures, alternating the two in
# one run: the pool page over a week, a day and an hour (p50 and p99 of
# REQUESTS requests each, by curl), and the live view's snapshot (the
# `runway_console_snapshot_duration_seconds` mean over TABS tabs streaming
# for 10 s, each following the jobs page's 50 jobs).
#
#   scripts/bench-console-history.sh [ROUNDS] [REQUESTS] [TABS]
#   (release build first: cargo build --release --locked -p runway -p runway-bench)
set -euo pipefail
ROUNDS=${1:-2}
REQUESTS=${2:-200}
TABS=${3:-5}
JOBS_SEED=$(realpath scripts/handout-history-seed.sql)
CONSOLE_SEED=$(realpath scripts/console-history-seed.sql)
DB=runway_bench_console
PORT=18771
source "$(dirname "$0")/bench-common.sh"
trap 'bench_cleanup runway-bench-console "$DB"' EXIT
bench_config
URL="http://127.0.0.1:$PORT"

# p50 and p99 (ms) of the times (s) on stdin.
percentiles() {
  sort -n | awk '{ t[NR] = $1 } END {
    p50 = t[int((NR + 1) * 0.50)]; p99 = t[int(NR * 0.99 + 0.5)];
    printf "%.1f %.1f", p50 * 1000, p99 * 1000 }'
}

# run empty|samples|history: prints "week_p50 week_p99 day_p50 day_p99 hour_p50 hour_p99 snapshot_mean_ms"
run() {
  local store=$1
  fresh_database "$DB"
  bench_serve runway-bench-console "$RUNWAY" "$PG_URL/$DB" "$PORT" "$DIR/server.log"
  if [ "$store" = history ]; then
    psql -q "$PG_URL/$DB" -f "$JOBS_SEED" >/dev/null
  fi
  if [ "$store" != empty ]; then
    psql -q "$PG_URL/$DB" -f "$CONSOLE_SEED" >/dev/null
  fi
  curl -fs -X POST -H "Authorization: Bearer $ADMIN" "$URL/api/v1/pools/default/pause" >/dev/null
  local ids=()
  for n in $(seq 1 300); do
    ids+=("$(curl -fs -H "Authorization: Bearer $ADMIN" -H 'content-type: application/json' \
      -d '{"labels":["self-hosted","linux"],"script":"true"}' "$URL/api/v1/jobs" | sed 's/.*"id":\([0-9]*\).*/\1/')")
  done
  local cookie
  cookie=$(curl -s -o /dev/null -D - -H "Origin: $URL" --data-urlencode "token=$ADMIN" "$URL/console/login" \
    | awk -F'[ ;]' 'tolower($1) == "set-cookie:" { print $2 }')
  local out=()
  for range in week day hour; do
    for _ in $(seq 1 "$REQUESTS"); do
      curl -s -o /dev/null -w '%{time_total}\n' -H "Cookie: $cookie" "$URL/console/pools/default?range=$range"
    done > "$DIR/$range.times"
    out+=("$(percentiles < "$DIR/$range.times")")
  done
  local followed
  followed=$(IFS=,; echo "${ids[*]:250:50}")
  local tabs=()
  for _ in $(seq 1 "$TABS"); do
    timeout 10 curl -sN -H "Cookie: $cookie" "$URL/console/stream?page=jobs&jobs=$followed" >/dev/null &
    tabs+=($!)
  done
  wait "${tabs[@]}" 2>/dev/null || true
  local mean
  mean=$(curl -fs "$URL/metrics" | awk '
    /^runway_console_snapshot_duration_seconds_sum/ { s = $2 }
    /^runway_console_snapshot_duration_seconds_count/ { c = $2 }
    END { if (c > 0) printf "%.2f (%d snapshots)", s / c * 1000, c; else print "-" }')
  echo "${out[*]} $mean"
  pkill -f "runway-bench-console" || true
  wait 2>/dev/null || true
}

echo "round store week_p50 week_p99 day_p50 day_p99 hour_p50 hour_p99 (ms) snapshot_mean_ms"
for round in $(seq 1 "$ROUNDS"); do
  for store in empty samples history; do
    echo "$round $store $(run $store)"
  done
done
