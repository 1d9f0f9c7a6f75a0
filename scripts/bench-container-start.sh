#!/usr/bin/env bash
# Job enqueued → job started (its runner's accept), three ways a runner
# comes, on one `runway serve` in the same run: a local process per job
# (the `process` provider), a fresh container per job (the `container`
# provider on a private `podman system service`, runc), and a container of
# the pool's stock of stopped runners (created, not started) started for
# the job with its credential (issue 60). `runway-bench first-start` sends
# N jobs per pool, one at a time and the pools taking turns, each once its
# pool is at rest (no runner at work, its stock full), and prints the
# medians, the extremes, and each median's ratio to the process pool's.
#
#   scripts/bench-container-start.sh [N=20]
#
# Needs podman, runc and busybox-static (Debian). RUNWAY as in
# bench-common.sh (default the release build).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-common.sh
N=${1:-20}
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

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > "$DIR/runway.toml" <<TOML
[server]
admin_tokens = ["$ADMIN"]
[runner_api]
poll_timeout = "2s"
[scaling]
interval = "200ms"

[providers.local]
kind = "process"
command = ["$RUNWAY", "agent", "--once"]
state_dir = "$DIR/processes"
max_instances = 1
boot_seconds = 1

[providers.podman]
kind = "container"
socket = "$SOCKET"
image = "localhost/runway-bench:1"
pull = "never"
network = "host"
state_dir = "$DIR/containers"
max_instances = 3
boot_seconds = 1
resume_seconds = 1

[[pools]]
name = "process"
labels = ["process"]
max_runners = 1
idle_grace = "1s"
providers = ["local"]

[[pools]]
name = "container"
labels = ["container"]
max_runners = 1
idle_grace = "1s"
providers = ["podman"]

[[pools]]
name = "stopped"
labels = ["stopped"]
max_runners = 1
idle_grace = "1s"
min_stopped = 1
max_stopped = 1
providers = ["podman"]
TOML
bench_serve "$MARK" "$RUNWAY" "sqlite://$DIR/runway.db" "$PORT" "$DIR/serve.log"
echo "($N jobs a pool, one at a time, $(nproc) cores, $RUNWAY)"
"$BENCH" first-start --url "http://127.0.0.1:$PORT" --token "$ADMIN" \
  --pool process --pool container --pool stopped --jobs "$N"
