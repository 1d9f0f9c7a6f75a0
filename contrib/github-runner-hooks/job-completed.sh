#!/bin/sh
# GitHub Actions runner hook (ACTIONS_RUNNER_HOOK_JOB_COMPLETED): tells
# runway the job finished. Never fails the job (5-second limit, errors
# ignored). Same environment as job-started.sh. RUNWAY_POST_JOB_STATUS may
# say "repo-policy-check-failure" when a pre-job policy check refused the job.
set -u
[ -n "${RUNWAY_URL:-}" ] && [ -n "${RUNWAY_RUNNER_ID:-}" ] && [ -n "${RUNWAY_RUNNER_TOKEN:-}" ] || exit 0

status="${RUNWAY_POST_JOB_STATUS:-normal}"
case "$status" in
    normal|repo-policy-check-failure) ;;
    *) status=normal ;;
esac
body=$(printf '{"phase":"post-job","timestamp":%s,"status":"%s"}' "$(date +%s)" "$status")

curl --silent --show-error --max-time 5 --output /dev/null \
    -H "Authorization: Bearer ${RUNWAY_RUNNER_TOKEN}" -H 'Content-Type: application/json' \
    --data "$body" "${RUNWAY_URL%/}/api/v1/runners/${RUNWAY_RUNNER_ID}/metrics" || true
exit 0
