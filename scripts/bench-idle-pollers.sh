#!/usr/bin/env bash
# Idle runners long-polling for jobs that start at once ("start": true)
# while jobs trickle in one at a time: every submission wakes every waiting
# runner of its pool, so what a wake-up costs is paid once per idle runner;
# OTHER idle runners of another pool (which no job is for) should cost
# nothing. Counts the transactions PostgreSQL committed for the whole run
# (pg_stat_database; the server is stopped first, so every backend has
# reported) and divides by the jobs. With BASE=path/to/another/runway,
# that build is measured in the same rounds, alternating.
#
#   scripts/bench-idle-pollers.sh [ROUNDS]   (release build first:
#                                             cargo build --release --locked -p runway -p runway-bench)
#
# RUNNERS (default 32) pollers of the jobs' pool, OTHER (default 0) of
# another pool, JOBS (default 100) jobs, one every 0.1 s.
# PG_URL (default postgres://postgres@127.0.0.1:5432) names the server; the
# script creates and drops its own database `runway_bench_pollers`.
set -euo pipefail
ROUNDS=${1:-2}
RUNNERS=${RUNNERS:-32}
OTHER=${OTHER:-0}
JOBS=${JOBS:-100}
DB=runway_bench_pollers
PORT=18760
API="http://127.0.0.1:$PORT/api/v1"
source "$(dirname "$0")/bench-common.sh"
cleanup() {
  [ -f "$DIR/pollers" ] && xargs -r kill 2>/dev/null < "$DIR/pollers" || true
  bench_cleanup runway-bench-pollers "$DB"
}
trap cleanup EXIT
bench_config
cat >> "$DIR/runway.toml" <<TOML
[[pools]]
name = "other"
labels = ["self-hosted", "gpu"]
TOML

commits() {
  psql "$PG_URL/postgres" -Atc "SELECT xact_commit FROM pg_stat_database WHERE datname = '$DB'"
}

# A runner: long-polls with "start": true, completes what it gets, again.
poller() {
  local token=$1 answer id
  while true; do
    answer=$(curl -s -w '\n%{http_code}' -X POST "$API/jobs/request" \
      -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
      -d '{"start": true}') || continue
    if [ "${answer##*$'\n'}" = 201 ]; then
      id=$(printf '%s' "${answer%$'\n'*}" | jq -r .id)
      curl -s -o /dev/null -X POST "$API/jobs/$id/complete" \
        -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
        -d '{"exit_code": 0}'
    fi
  done
}

# run BINARY: prints transactions committed per job.
run() {
  local binary=$1 before after token runner i pool labels
  fresh_database "$DB"
  bench_serve runway-bench-pollers "$binary" "$PG_URL/$DB" "$PORT" "$DIR/server.log"
  : > "$DIR/pollers"
  for i in $(seq 1 $((RUNNERS + OTHER))); do
    pool=default labels='"self-hosted", "linux", "x64"'
    [ "$i" -gt "$RUNNERS" ] && pool=other labels='"self-hosted", "gpu"'
    token=$(curl -s -X POST "$API/registration-tokens" -H "Authorization: Bearer $ADMIN" \
      -H 'Content-Type: application/json' -d "{\"pool\": \"$pool\", \"ttl\": 600}" | jq -r .token)
    runner=$(curl -s -X POST "$API/runners/register" -H 'Content-Type: application/json' \
      -d "{\"token\": \"$token\", \"name\": \"poller-$i\", \"labels\": [$labels]}" |
      jq -r .runner_token)
    poller "$runner" &
    echo $! >> "$DIR/pollers"
  done
  sleep 1 # the pollers reach their wait
  before=$(commits)
  for i in $(seq 1 "$JOBS"); do
    curl -s -o /dev/null -X POST "$API/jobs" -H "Authorization: Bearer $ADMIN" \
      -H 'Content-Type: application/json' \
      -d "{\"labels\": [\"linux\"], \"script\": \"true\", \"external_id\": \"trickle-$i\"}"
    sleep 0.1
  done
  sleep 1 # the last jobs complete
  xargs -r kill < "$DIR/pollers" 2>/dev/null || true
  pkill -f "runway-bench-pollers" || true
  wait 2>/dev/null || true
  after=$(commits)
  echo $(( (after - before) / JOBS ))
}

echo "round ${BASE:+base }this (transactions a job, $RUNNERS idle runners of the jobs' pool, $OTHER of another)"
for round in $(seq 1 "$ROUNDS"); do
  base=""
  if [ -n "$BASE" ]; then
    base="$(run "$BASE") "
  fi
  echo "$round $base$(run "$RUNWAY")"
done
