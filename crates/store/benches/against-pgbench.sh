#!/usr/bin/env bash
# The PostgreSQL queue benchmarks beside pgbench, in one run on the same
# machine: pgbench's simple-update transactions per second (-N, 8 clients,
# 2 threads; and 1 client), then `cargo bench -p runway-store --bench queue
# -- postgres`, then pgbench again, so a neighbour that slowed the disk
# during the run shows as a gap between the two pgbench figures.
#
#   crates/store/benches/against-pgbench.sh [postgres://…/db]
#
# Works in a database of its own (runway_pgbench), dropped at the end.
set -euo pipefail
url="${1:-${RUNWAY_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}}"
db=runway_pgbench
scratch="${url%/*}/$db"
psql "$url" -qc "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" 2>/dev/null
trap 'psql "$url" -qc "DROP DATABASE IF EXISTS $db" 2>/dev/null || true' EXIT
pgbench -i -q "$scratch" >/dev/null 2>&1

run_pgbench() {
  for clients in 8 1; do
    threads=$(( clients > 1 ? 2 : 1 ))
    tps=$(pgbench -N -c "$clients" -j "$threads" -T 10 "$scratch" 2>/dev/null |
      sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    echo "pgbench -N -c $clients -j $threads -T 10: $tps transactions/s"
  done
}

echo "== pgbench, before"
run_pgbench
echo "== runway store, PostgreSQL"
cargo bench -q -p runway-store --bench queue -- postgres 2>&1 |
  grep -E '^(enqueue|claim|handout)|thrpt:'
echo "== pgbench, after"
run_pgbench
