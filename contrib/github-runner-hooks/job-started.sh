#!/bin/sh
# GitHub Actions runner hook (ACTIONS_RUNNER_HOOK_JOB_STARTED): tells runway
# which job this runner is about to run, and fails that job (exit 1, before
# its first step) when runway answers that the runner's pool does not admit
# it (`repo_policy_denied`: the pool's [pools.access] policy; GitHub hands a
# just-in-time runner any queued job its labels match). Anything else never
# fails the job: a report that cannot be delivered is dropped after 5 s.
#
# Needs, in the runner's environment: RUNWAY_URL, RUNWAY_RUNNER_ID and
# RUNWAY_RUNNER_TOKEN (the runner's token from registration; runway gives a
# GitHub pool's just-in-time runners a report-only token in these).
# GITHUB_WORKFLOW, GITHUB_REPOSITORY, GITHUB_EVENT_NAME and GITHUB_RUN_ID are
# set by the runner for every job.
set -u
[ -n "${RUNWAY_URL:-}" ] && [ -n "${RUNWAY_RUNNER_ID:-}" ] && [ -n "${RUNWAY_RUNNER_TOKEN:-}" ] || exit 0

json_string() {
    # A JSON string literal of $1 (backslashes and quotes escaped, control
    # characters dropped: runway refuses them anyway).
    printf '"%s"' "$(printf '%s' "$1" | tr -d '\000-\037' | sed 's/\\/\\\\/g; s/"/\\"/g')"
}

body=$(printf '{"phase":"pre-job","workflow":%s,"repository":%s,"event":%s,"workflow_run_id":%s,"timestamp":%s}' \
    "$(json_string "${GITHUB_WORKFLOW:-unknown}")" \
    "$(json_string "${GITHUB_REPOSITORY:-unknown}")" \
    "$(json_string "${GITHUB_EVENT_NAME:-unknown}")" \
    "$(json_string "${GITHUB_RUN_ID:-0}")" \
    "$(date +%s)")

answer=$(curl --silent --show-error --max-time 5 \
    -H "Authorization: Bearer ${RUNWAY_RUNNER_TOKEN}" -H 'Content-Type: application/json' \
    --data "$body" "${RUNWAY_URL%/}/api/v1/runners/${RUNWAY_RUNNER_ID}/metrics") || exit 0
case "$answer" in
    *'"repo_policy_denied"'*)
        echo "runway: this runner's pool does not admit this job: $answer" >&2
        exit 1 ;;
esac
exit 0
