# Shared by the scripts/bench-*.sh scripts (sourced, not run): the
# settings every one takes, the server configuration they measure, how
# they start a server and wait for it, and how they clean up.
#
# Sourcing sets RUNWAY (the binary measured, default the release build),
# BENCH (the load generators, default the runway-bench beside RUNWAY:
# cargo build --release --locked -p runway -p runway-bench),
# BASE (another binary to compare, if given), PG_URL (the PostgreSQL
# server, default the local one), ADMIN (the admin token) and DIR (a
# scratch directory).
RUNWAY=$(realpath "${RUNWAY:-target/release/runway}")
BENCH=$(realpath "${BENCH:-$(dirname "$RUNWAY")/runway-bench}")
BASE=${BASE:+$(realpath "$BASE")}
PG_URL=${PG_URL:-postgres://postgres@127.0.0.1:5432}
ADMIN=bench-admin-token-0123456789
DIR=$(mktemp -d)

# bench_cleanup MARKER [DATABASE]: stops the servers started as MARKER,
# drops DATABASE if given, removes $DIR. For `trap … EXIT`.
bench_cleanup() {
  pkill -f "$1" 2>/dev/null || true
  if [ -n "${2:-}" ]; then
    psql "$PG_URL/postgres" -qc "DROP DATABASE IF EXISTS $2" >/dev/null 2>&1 || true
  fi
  rm -rf "$DIR"
}

# bench_config [EXTRA_TOML]: writes $DIR/runway.toml — the admin token, a
# 30 s long poll, one pool `default` — with EXTRA_TOML after [server].
bench_config() {
  cat > "$DIR/runway.toml" <<TOML
[server]
admin_tokens = ["$ADMIN"]
${1:-}
[runner_api]
poll_timeout = "30s"
[[pools]]
name = "default"
labels = ["self-hosted", "linux", "x64"]
TOML
}

# fresh_database NAME: drops and creates database NAME on $PG_URL.
fresh_database() {
  psql "$PG_URL/postgres" -qc "DROP DATABASE IF EXISTS $1" -c "CREATE DATABASE $1" >/dev/null 2>&1
}

# bench_serve MARKER BINARY DATABASE PORT LOG: starts `BINARY serve` in the
# background from $DIR, named MARKER in argv (so `pkill -f MARKER` finds
# it), and waits up to 10 s for it to be ready.
bench_serve() {
  local marker=$1 binary=$2 database=$3 port=$4 log=$5
  (cd "$DIR" && exec -a "$marker" "$binary" serve --config runway.toml \
    --database "$database" --listen "127.0.0.1:$port" >"$log" 2>&1) &
  for _ in $(seq 1 100); do
    curl -fs "http://127.0.0.1:$port/readyz" >/dev/null && return 0
    sleep 0.1
  done
}
