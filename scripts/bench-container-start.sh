#!/usr/bin/env bash
# Runner start → job accepted: a fresh container per job (the `container`
# provider on a private `podman system service`, runc) beside a local
# process per job (the `process` provider), on the same machine in the same
# run. For each, N jobs one after another (`runway submit --wait -- true`)
# on a pool with no warm runner, so every job waits for a runner started
# for it; what is measured is the job's started_at − created_at as runway
# recorded it (the runner's start, its registration, the claim and the
# accept). Prints p50, p95 and max per provider, and the ratio of the
# medians.
#
#   scripts/bench-container-start.sh [N=50] [ROUNDS=1]
#
# Needs podman, runc and busybox-static (Debian). RUNWAY as in
# bench-common.sh (default the release build).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-common.sh
N=${1:-50}
ROUNDS=${2:-1}
MARK=runway-bench-container
trap 'podman_stop; bench_cleanup $MARK' EXIT

PODMAN_DIR="$DIR/podman"
mkdir -p "$PODMAN_DIR"
cat > "$PODMAN_DIR/containers.conf" <<'CONF'
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
export CONTAINERS_CONF="$PODMAN_DIR/containers.conf"
PODMAN=(podman --root "$PODMAN_DIR/root" --runroot "$PODMAN_DIR/run" --tmpdir "$PODMAN_DIR/libpod")
SOCKET="$PODMAN_DIR/podman.sock"
(cd "$PODMAN_DIR" && exec "${PODMAN[@]}" system service --time 0 "unix://$SOCKET" >"$PODMAN_DIR/service.log" 2>&1) &
PODMAN_PID=$!
podman_stop() {
  "${PODMAN[@]}" rm -a -f -t 0 >/dev/null 2>&1 || true
  kill "$PODMAN_PID" 2>/dev/null || true
  "${PODMAN[@]}" system reset -f >/dev/null 2>&1 || true
}
for _ in $(seq 1 100); do [ -S "$SOCKET" ] && break; sleep 0.1; done

# The image: busybox-static as /bin/sh, and runway's shared libraries
# (runway itself is mounted read-only by the provider).
ROOT="$PODMAN_DIR/rootfs"
mkdir -p "$ROOT/bin" "$ROOT/tmp" "$ROOT/etc"
chmod 1777 "$ROOT/tmp"
cp "$(command -v busybox)" "$ROOT/bin/busybox"
for tool in sh true echo cat; do ln -sf busybox "$ROOT/bin/$tool"; done
echo 'root:x:0:0:root:/root:/bin/sh' > "$ROOT/etc/passwd"
for lib in $(ldd "$RUNWAY" | grep -o '/[^ ]*'); do
  mkdir -p "$ROOT$(dirname "$lib")"
  cp -L "$lib" "$ROOT$lib"
done
tar -C "$ROOT" -cf "$PODMAN_DIR/rootfs.tar" .
"${PODMAN[@]}" import "$PODMAN_DIR/rootfs.tar" localhost/runway-bench:1 >/dev/null

# measure KIND PROVIDER_TOML: N jobs on a pool served by PROVIDER_TOML.
measure() {
  local kind=$1 provider=$2 port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  rm -f "$DIR/runway.db"*
  cat > "$DIR/runway.toml" <<TOML
[server]
admin_tokens = ["$ADMIN"]
[runner_api]
poll_timeout = "2s"
[scaling]
interval = "200ms"
$provider
[[pools]]
name = "bench"
labels = ["bench"]
min_idle = 0
max_runners = 1
idle_grace = "1s"
providers = ["p"]
TOML
  bench_serve "$MARK" "$RUNWAY" "sqlite://$DIR/runway.db" "$port" "$DIR/serve-$kind.log"
  for _ in $(seq 1 "$N"); do
    "$RUNWAY" submit --url "http://127.0.0.1:$port" --token "$ADMIN" --labels bench --wait -- true >/dev/null 2>&1
  done
  curl -fs -H "Authorization: Bearer $ADMIN" "http://127.0.0.1:$port/api/v1/jobs?state=completed&limit=1000" |
    python3 -c '
import json, sys, datetime
def t(s): return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
jobs = json.load(sys.stdin)["jobs"]
waits = sorted(t(j["started_at"]) - t(j["created_at"]) for j in jobs)
p = lambda q: waits[min(len(waits) - 1, int(q * len(waits)))]
print(f"'"$kind"' {len(waits)} {p(0.5):.3f} {p(0.95):.3f} {waits[-1]:.3f}")'
  pkill -f "$MARK" || true
  for _ in $(seq 1 50); do pgrep -f "$MARK" >/dev/null || break; sleep 0.1; done
}

echo "provider jobs p50_s p95_s max_s   ($N jobs one after another, $ROUNDS round(s), $(nproc) cores, $RUNWAY)"
for round in $(seq 1 "$ROUNDS"); do
  measure process "[providers.p]
kind = \"process\"
command = [\"$RUNWAY\", \"agent\", \"--once\"]
state_dir = \"$DIR/processes\"
max_instances = 1
boot_seconds = 1"
  measure container "[providers.p]
kind = \"container\"
socket = \"$SOCKET\"
image = \"localhost/runway-bench:1\"
pull = \"never\"
network = \"host\"
state_dir = \"$DIR/containers\"
max_instances = 1
boot_seconds = 1"
done
