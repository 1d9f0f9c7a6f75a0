#!/usr/bin/env bash
# Runs the chaos soak (crates/cli/tests/chaos.rs) once per seed and prints
# each run's report lines, for BENCHMARKS.md. Usage:
#   scripts/chaos-seeds.sh SECONDS SEED...
# e.g. scripts/chaos-seeds.sh 180 1 2 3 4 5 6 7 8 9 10
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${1:?seconds of faults}
shift
cargo test --locked -p runway --test all --no-run >/dev/null 2>&1
failed=0
for seed in "$@"; do
    log=$(mktemp)
    if RUNWAY_CHAOS_SECONDS=$seconds RUNWAY_CHAOS_SEED=$seed \
        cargo test --locked -p runway --test all chaos::a_chaos_soak -- --nocapture >"$log" 2>&1; then
        verdict=passed
    else
        verdict=FAILED
        failed=$((failed + 1))
    fi
    echo "seed $seed: $verdict"
    grep -E "^(chaos soak|API jobs|GitHub jobs|side effects|  |kept for)" "$log"
    rm -f "$log"
done
echo "$(( $# - failed )) passed, $failed failed"
[ "$failed" -eq 0 ]
