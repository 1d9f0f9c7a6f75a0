//! The Prometheus metrics registry (prefix `runway_`), served at `/metrics`
//! in the OpenMetrics text format.

use prometheus_client::encoding::{
    EncodeLabel, EncodeLabelSet, EncodeLabelValue, LabelSetEncoder, LabelValueEncoder,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry, Unit};

/// A job's labels: its pool and, where known and switched on (`[metrics]
/// job_labels`), its repository, workflow and triggering event. Absent ones
/// are left out of the series, not written empty.
#[derive(Clone, Debug, Hash, PartialEq, Eq, Default)]
pub struct JobLabels {
    pub pool: String,
    pub repo: Option<String>,
    pub workflow: Option<String>,
    pub event: Option<String>,
}

impl JobLabels {
    fn encode_into(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        ("pool", self.pool.as_str()).encode(encoder.encode_label())?;
        for (name, value) in [
            ("repo", &self.repo),
            ("workflow", &self.workflow),
            ("event", &self.event),
        ] {
            if let Some(value) = value {
                (name, value.as_str()).encode(encoder.encode_label())?;
            }
        }
        Ok(())
    }
}

impl EncodeLabelSet for JobLabels {
    fn encode(&self, mut encoder: LabelSetEncoder) -> Result<(), std::fmt::Error> {
        self.encode_into(&mut encoder)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct JobConclusionLabels {
    pub job: JobLabels,
    pub conclusion: String,
}

impl EncodeLabelSet for JobConclusionLabels {
    fn encode(&self, mut encoder: LabelSetEncoder) -> Result<(), std::fmt::Error> {
        self.job.encode_into(&mut encoder)?;
        ("conclusion", self.conclusion.as_str()).encode(encoder.encode_label())
    }
}

/// Which of a job's `repo`, `workflow`, `event` labels metrics carry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobLabelSwitches {
    pub repo: bool,
    pub workflow: bool,
    pub event: bool,
}

impl JobLabelSwitches {
    pub fn all() -> JobLabelSwitches {
        JobLabelSwitches {
            repo: true,
            workflow: true,
            event: true,
        }
    }

    pub fn of(names: &[String]) -> JobLabelSwitches {
        let on = |name: &str| names.iter().any(|n| n == name);
        JobLabelSwitches {
            repo: on("repo"),
            workflow: on("workflow"),
            event: on("event"),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GithubRequestLabels {
    pub operation: String,
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabels {
    pub event: String,
    pub action: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    pub pool: String,
}

/// An HTTP request by its route's template (`/api/v1/jobs/{id}`, never
/// the raw path: one series a route, whatever the ids), its method, and
/// the status answered.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: &'static str,
    pub route: RouteLabel,
    pub status: u16,
}

/// A route's template as a label value, shared between a request's two
/// series: one allocation a request, not four.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct RouteLabel(pub std::sync::Arc<str>);

impl EncodeLabelValue for RouteLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&&*self.0, encoder)
    }
}

/// An HTTP request's route template and method.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpRouteLabels {
    pub method: &'static str,
    pub route: RouteLabel,
}

type HttpHistogramFamily = Family<HttpRouteLabels, Histogram, fn() -> Histogram>;

fn http_duration_histogram() -> Histogram {
    Histogram::new([
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0,
    ])
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// One of the reasons the code names (never a value from a request).
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WakeLabels {
    /// `sent` to the other replicas, or `received` from one.
    pub direction: &'static str,
    /// `job` (long-polling runners) or `reconcile` (the leader).
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabel {
    pub operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TableLabel {
    /// A store table's name (`runway_store::Prunable::table`).
    pub table: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    /// `pre-job` or `post-job`.
    pub phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolProviderLabels {
    pub pool: String,
    pub provider: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolResultLabels {
    pub pool: String,
    pub result: DeleteResult,
}

/// How a scale-down delete request ended: a label value from a closed set,
/// so no code path can invent a new series.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum DeleteResult {
    /// The runner was stopped and its instance deleted.
    Ok,
    /// GitHub (or the runner's state) says it runs a job: kept.
    RefusedBusy,
    /// The provider or the store failed; retried next round.
    Error,
}

impl DeleteResult {
    pub fn as_str(self) -> &'static str {
        match self {
            DeleteResult::Ok => "ok",
            DeleteResult::RefusedBusy => "refused_busy",
            DeleteResult::Error => "error",
        }
    }
}

impl EncodeLabelValue for DeleteResult {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        std::fmt::Write::write_str(encoder, self.as_str())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolStateLabels {
    pub pool: String,
    /// A `RunnerState` name.
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolReasonLabels {
    pub pool: String,
    /// A `WaitReason` code.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabels {
    pub provider: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderOperationLabels {
    pub provider: String,
    pub operation: String,
}

/// A side effect a replica did not make, and why (`app::lease::Deposed`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationReasonLabels {
    pub operation: &'static str,
    pub reason: &'static str,
}

/// A scale-set pool and one of its counts (`available`, `assigned`, …) or
/// outcomes (`received`, `opened`, `conflict`, …).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolKindLabels {
    pub pool: String,
    pub kind: &'static str,
}

/// One offer of a provider (`Offer::key`, empty for a provider's only
/// offer).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OfferLabels {
    pub provider: String,
    pub offer: String,
}

/// One offer and how a create through it ended (`ok`, `failed`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OfferResultLabels {
    pub provider: String,
    pub offer: String,
    pub result: &'static str,
}

type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

type HistogramFamily = Family<PoolLabel, Histogram, fn() -> Histogram>;
type JobHistogramFamily = Family<JobLabels, Histogram, fn() -> Histogram>;

/// Job run durations in the GitHub-runner metrics spec's buckets, exactly
/// (seed 002: 30, 60, 120, 300, 600, 1200, 3000, 6000), so its dashboards'
/// `le` values exist.
pub const RUN_DURATION_BUCKETS: [f64; 8] =
    [30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 3000.0, 6000.0];

fn run_duration_histogram() -> Histogram {
    Histogram::new(RUN_DURATION_BUCKETS)
}

/// Queue durations: 1 s … 1 h.
fn queue_duration_histogram() -> Histogram {
    Histogram::new([
        1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
    ])
}

/// Registers `metric` under `name` with `help`, and returns it.
fn add<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// The same for a metric measured in seconds (its name gets `_seconds`).
fn seconds<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register_with_unit(name, help, Unit::Seconds, metric.clone());
    metric
}

pub struct Metrics {
    registry: Registry,
    pub webhooks_received: Family<WebhookLabels, Counter>,
    pub jobs_routed: Family<PoolLabel, Counter>,
    pub jobs_rejected: Family<ReasonLabel, Counter>,
    pub jobs_held: Counter,
    pub safety_net_wakeups: Family<PoolLabel, Counter>,
    pub jobs_held_now: Gauge,
    pub store_errors: Family<OperationLabel, Counter>,
    pub wakeups: Family<WakeLabels, Counter>,
    pub job_queue_duration: JobHistogramFamily,
    pub job_run_duration: JobHistogramFamily,
    pub jobs_started: Family<JobLabels, Counter>,
    pub jobs_completed: Family<JobConclusionLabels, Counter>,
    /// Which job labels series carry.
    pub job_label_switches: JobLabelSwitches,
    pub runners_crashed: Family<PoolLabel, Counter>,
    /// Runners long-polling for a job on this replica, by pool.
    pub runners_polling: Family<PoolLabel, Gauge>,
    pub runners_woken: Family<PoolLabel, Counter>,
    pub long_poll_looks: Family<PoolLabel, Counter>,
    pub long_poll_looks_spared: Family<PoolLabel, Counter>,
    pub long_poll_runner_reads: Counter,
    pub runner_reports_rejected: Family<ReasonLabel, Counter>,
    pub runner_reports: Family<PhaseLabel, Counter>,
    pub runner_idle_duration: HistogramFamily,
    pub runner_install_duration: HistogramFamily,
    pub github_requests: Family<GithubRequestLabels, Counter>,
    pub github_rate_limit_remaining: Gauge,
    pub github_redeliveries: Counter,
    pub leader: Gauge,
    pub github_job_rechecks: Family<ReasonLabel, Counter>,
    pub runners_created: Family<PoolProviderLabels, Counter>,
    pub runner_delete_requests: Family<PoolResultLabels, Counter>,
    pub stopped_runner_starts: Family<PoolKindLabels, Counter>,
    pub runners: Family<PoolStateLabels, Gauge>,
    pub jobs_waiting: Family<PoolReasonLabels, Gauge>,
    pub provider_errors: Family<ProviderOperationLabels, Counter>,
    pub instances_unaccounted: Family<ProviderLabels, Gauge>,
    pub reconcile_duration: Histogram,
    pub console_snapshot_seconds: Histogram,
    pub deregistrations_refused: Histogram,
    pub http_requests: Family<HttpLabels, Counter>,
    pub http_request_duration: HttpHistogramFamily,
    pub store_rows: Family<TableLabel, Gauge>,
    pub retention_pruned: Family<TableLabel, Counter>,
    pub offer_price: Family<OfferLabels, FloatGauge>,
    pub offer_reliability: Family<OfferLabels, FloatGauge>,
    pub offer_creates: Family<OfferResultLabels, Counter>,
    pub scale_set_jobs: Family<PoolKindLabels, Gauge>,
    pub scale_set_runners: Family<PoolKindLabels, Gauge>,
    pub scale_set_messages: Family<PoolKindLabels, Counter>,
    pub scale_set_sessions: Family<PoolKindLabels, Counter>,
    pub scale_set_token_refreshes: Family<PoolKindLabels, Counter>,
    pub fenced_calls: Family<OperationReasonLabels, Counter>,
    pub scale_set_refusals: Family<PoolKindLabels, Counter>,
    pub access_refusals: Family<PoolKindLabels, Counter>,
    pub event_log_errors: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("runway");
        let r = &mut registry;
        let mut metrics = Metrics {
            webhooks_received: add(r, "webhooks_received", "Webhooks received, by GitHub event, action and what runway did with them", Family::<WebhookLabels, Counter>::default()),
            jobs_routed: add(r, "jobs_routed", "New jobs routed to a pool's queue", Family::<PoolLabel, Counter>::default()),
            jobs_rejected: add(r, "jobs_rejected", "Jobs not queued, by reason (no_matching_pool: no pool serves the labels; access_policy: every pool serving them refuses it; github_hosted: a required label is missing; run_facts_unknown: held past [github] run_facts_wait because GitHub could not say what the pools serving it need to know of its workflow run)", Family::<ReasonLabel, Counter>::default()),
            safety_net_wakeups: add(r, "long_poll_safety_net_wakeups", "Waiting runners woken by the safety net, by pool: a job was queued and no wake-up had reached a runner that waits for it (each is a missed wake-up, caught within 2 s)", Family::<PoolLabel, Counter>::default()),
            jobs_held: add(r, "jobs_held", "New jobs stored held: the pools serving their labels need facts of the workflow run GitHub could not give yet", Counter::default()),
            jobs_held_now: add(r, "jobs_held_current", "Jobs held now, as the leader last counted them (it looks their runs up again with backoff)", Gauge::default()),
            store_errors: add(r, "store_errors", "Store operations that failed, by operation", Family::<OperationLabel, Counter>::default()),
            wakeups: add(r, "wakeups", "Wake-ups between replicas sharing a PostgreSQL store (LISTEN/NOTIFY), by direction and kind", Family::<WakeLabels, Counter>::default()),
            job_queue_duration: seconds(r, "job_queue_duration", "Time from a job's creation to its start, as GitHub reports them", Family::new_with_constructor(queue_duration_histogram)),
            job_run_duration: seconds(r, "job_run_duration", "Time from a job's start to its completion, as GitHub reports them", Family::new_with_constructor(run_duration_histogram)),
            jobs_started: add(r, "jobs_started", "Jobs that started running", Family::<JobLabels, Counter>::default()),
            jobs_completed: add(r, "jobs_completed", "Jobs that completed, by conclusion", Family::<JobConclusionLabels, Counter>::default()),
            runners_crashed: add(r, "runners_crashed", "Runners lost while running a job: a lease that expired, or a machine gone while its runner was busy (on GitHub pools, once the job's completion had its grace)", Family::<PoolLabel, Counter>::default()),
            runners_polling: add(r, "runners_polling", "Runners long-polling for a job on this replica (POST /api/v1/jobs/request), by pool", Family::<PoolLabel, Gauge>::default()),
            runners_woken: add(r, "runners_woken", "Long-polling runners woken on this replica to look for a job, by pool: one a queued job (here or on another replica), each of the pool when what arrived is not known", Family::<PoolLabel, Counter>::default()),
            long_poll_looks: add(r, "long_poll_looks", "Looks at the store (claims) long-polling runners made on this replica, by pool: one when a poll begins, unless it is spared, and one each time a wake-up comes", Family::<PoolLabel, Counter>::default()),
            long_poll_looks_spared: add(r, "long_poll_looks_spared", "Long polls that began without a look at the store, by pool: the runner's previous poll found nothing and no wake-up of its pool has come since", Family::<PoolLabel, Counter>::default()),
            long_poll_runner_reads: add(r, "long_poll_runner_reads", "Runners read from the store by their token for a long poll or a completion on this replica: when one begins, unless runway read or wrote the runner for that token within the last 5 minutes, and where such a remembered runner is not proven by its write (a look that does not start, a start or completion whose check of its version did not hold)", Counter::default()),
            runner_reports_rejected: add(r, "runner_reports_rejected", "Runner reports refused, by reason (unauthorized: no or no valid report token; runner_ended: its runner has ended; not_this_runner: about another runner; malformed, unreadable, too_large, bad_string, timestamp_out_of_range; store_unavailable); nothing of them is stored", Family::<ReasonLabel, Counter>::default()),
            runner_reports: add(r, "runner_reports", "Runner reports accepted and stored, by phase (pre-job, post-job)", Family::<PhaseLabel, Counter>::default()),
            runner_idle_duration: seconds(r, "runner_idle_duration", "How long a runner was idle before it took a job", Family::new_with_constructor(queue_duration_histogram)),
            runner_install_duration: seconds(r, "runner_install_duration", "From a runner's request to its being ready (booted, or registered)", Family::new_with_constructor(queue_duration_histogram)),
            github_requests: add(r, "github_requests", "Requests to the GitHub API, by operation and HTTP status (error: no answer)", Family::<GithubRequestLabels, Counter>::default()),
            github_rate_limit_remaining: add(r, "github_rate_limit_remaining", "Requests left in GitHub's rate-limit window, as its last answer said", Gauge::default()),
            leader: add(r, "leader", "1 while this replica leads (runs the reconciler and the GitHub healer), else 0", Gauge::default()),
            github_redeliveries: add(r, "github_redeliveries", "Failed workflow_job webhook deliveries runway asked GitHub to redeliver", Counter::default()),
            github_job_rechecks: add(r, "github_job_rechecks", "Old queued GitHub jobs looked up, by what was found (queued, started, completed, gone, error)", Family::<ReasonLabel, Counter>::default()),
            runners_created: add(r, "runners_created", "Runners created, by pool and provider", Family::<PoolProviderLabels, Counter>::default()),
            runner_delete_requests: add(r, "runner_delete_requests", "Scale-down delete requests by result (ok, refused_busy, error)", Family::<PoolResultLabels, Counter>::default()),
            stopped_runner_starts: add(r, "stopped_runner_starts", "Stopped runners of a pool's stock started for queued jobs, by result (started; refused: the job falls back to a cold boot)", Family::<PoolKindLabels, Counter>::default()),
            runners: add(r, "runners", "Live runners by pool and state", Family::<PoolStateLabels, Gauge>::default()),
            jobs_waiting: add(r, "jobs_waiting", "Queued jobs by pool and the reason they wait", Family::<PoolReasonLabels, Gauge>::default()),
            provider_errors: add(r, "provider_errors", "Failed provider calls", Family::<ProviderOperationLabels, Counter>::default()),
            instances_unaccounted: add(r, "instances_unaccounted", "Instances a provider lists that no live runner record accounts for, as its last list showed: kept while in their in-flight window, busy at GitHub, or not provably this provider's; deleted after positive checks", Family::<ProviderLabels, Gauge>::default()),
            reconcile_duration: seconds(r, "reconcile_duration", "How long one reconcile round took", Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0])),
            http_requests: add(r, "http_requests", "HTTP requests answered, by method, route template (unmatched: no route) and status", Family::<HttpLabels, Counter>::default()),
            http_request_duration: seconds(r, "http_request_duration", "Time to answer an HTTP request (to its headers: a long poll's wait and a stream's life are in it only up to the first byte), by method and route template", Family::new_with_constructor(http_duration_histogram as fn() -> Histogram)),
            deregistrations_refused: add(r, "runner_deregistrations_refused", "Per GitHub runner deregistered, how many of runway's asks GitHub refused before (it was running a job, or GitHub could not take it): the scale-down ADR's budget is one or two", Histogram::new([0.0, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0])),
            console_snapshot_seconds: seconds(r, "console_snapshot_duration", "How long one read of the console's live view took (one a tick, shared by every open tab)", Histogram::new([0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0])),
            store_rows: add(r, "store_rows", "Rows in each store table retention looks after, as its last pass counted", Family::<TableLabel, Gauge>::default()),
            retention_pruned: add(r, "retention_pruned", "Rows retention deleted, by table", Family::<TableLabel, Counter>::default()),
            offer_price: add(r, "offer_price_per_hour", "Each provider offer's price per runner-hour, as the reconciler's last round saw it", Family::<OfferLabels, FloatGauge>::default()),
            offer_reliability: add(r, "offer_reliability", "Each provider offer's reliability as the planner weighs it (the lower of what the provider declares and what its creates taught), as of the last round", Family::<OfferLabels, FloatGauge>::default()),
            offer_creates: add(r, "offer_creates", "Runner creates through each offer, by result (ok, failed)", Family::<OfferResultLabels, Counter>::default()),
            scale_set_jobs: add(r, "scale_set_jobs", "A scale-set pool's jobs as GitHub's statistics last said, by kind (available, acquired, assigned, running)", Family::<PoolKindLabels, Gauge>::default()),
            scale_set_runners: add(r, "scale_set_runners", "A scale-set pool's runners as GitHub's statistics last said, by kind (registered, busy, idle)", Family::<PoolKindLabels, Gauge>::default()),
            scale_set_messages: add(r, "scale_set_messages", "Scale-set queue messages, by kind (received; acknowledged: after their effects were stored)", Family::<PoolKindLabels, Counter>::default()),
            scale_set_sessions: add(r, "scale_set_sessions", "Scale-set message sessions, by kind (opened, conflict: held by another listener, replaced: a stale one of runway's deleted, lost: dropped by GitHub, closed)", Family::<PoolKindLabels, Counter>::default()),
            scale_set_token_refreshes: add(r, "scale_set_token_refreshes", "Scale-set tokens fetched again, by kind (admin, queue)", Family::<PoolKindLabels, Counter>::default()),
            fenced_calls: add(r, "fenced_calls", "Side effects outside the store (provider, GitHub and scale-set calls, retention) a replica did not make because it could not show it still led, by operation and reason (not_leading, lease_expired, later_term, unconfirmed, previous_lease)", Family::<OperationReasonLabels, Counter>::default()),
            access_refusals: add(r, "access_refusals", "Jobs a pool's access policy refused, by pool and rule (`kind`: repository, fork, event); the job went on to the next pool serving its labels, or was refused by all", Family::<PoolKindLabels, Counter>::default()),
            scale_set_refusals: add(r, "scale_set_refusals", "Scale-set calls GitHub refused, by cause (rate_limited: 429 or a 403 rate limit, after which no call is made until its wait is over; unauthorized, forbidden, not_found, conflict, server_error, other)", Family::<PoolKindLabels, Counter>::default()),
            event_log_errors: add(r, "event_log_errors", "Event-log lines that could not be written (a full disk, a file removed or made unwritable) and were dropped; runway goes on serving", Counter::default()),
            job_label_switches: JobLabelSwitches::all(),
            registry: Registry::default(),
        };
        metrics.registry = registry;
        metrics
    }

    pub fn webhook(&self, event: &str, action: &str, outcome: &str) {
        self.webhooks_received
            .get_or_create(&WebhookLabels {
                event: event.to_owned(),
                action: action.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    pub fn access_refused(&self, pool: &str, rule: &'static str) {
        self.access_refusals
            .get_or_create(&PoolKindLabels {
                pool: pool.to_owned(),
                kind: rule,
            })
            .inc();
    }

    pub fn github_request(&self, operation: &str, status: &str) {
        self.github_requests
            .get_or_create(&GithubRequestLabels {
                operation: operation.to_owned(),
                status: status.to_owned(),
            })
            .inc();
    }

    /// With only these job labels on series.
    pub fn with_job_labels(mut self, switches: JobLabelSwitches) -> Metrics {
        self.job_label_switches = switches;
        self
    }

    /// One more refused runner report, by `reason`.
    pub fn report_refused(&self, reason: &'static str) {
        self.runner_reports_rejected
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// Every job label switched on and known, no other.
    pub fn job_labels(
        &self,
        pool: &str,
        repo: Option<&str>,
        workflow: Option<&str>,
        event: Option<&str>,
    ) -> JobLabels {
        let keep = |on: bool, value: Option<&str>| {
            value.filter(|v| on && !v.is_empty()).map(str::to_owned)
        };
        let switches = &self.job_label_switches;
        JobLabels {
            pool: pool.to_owned(),
            repo: keep(switches.repo, repo),
            workflow: keep(switches.workflow, workflow),
            event: keep(switches.event, event),
        }
    }

    /// A runner became ready `installed` after it was requested.
    pub fn runner_installed(&self, pool: &str, installed: std::time::Duration) {
        self.runner_install_duration
            .get_or_create(&PoolLabel {
                pool: pool.to_owned(),
            })
            .observe(installed.as_secs_f64());
    }

    pub fn store_error(&self, operation: &str) {
        self.store_errors
            .get_or_create(&OperationLabel {
                operation: operation.to_owned(),
            })
            .inc();
    }

    /// The classic Prometheus text exposition (version 0.0.4), for clients
    /// that do not ask for OpenMetrics (`curl`, `promtool check metrics`).
    pub fn encode_text(&self) -> String {
        to_classic_text(&self.encode())
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        if let Err(error) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::error!(%error, "cannot encode metrics");
        }
        text
    }
}

/// OpenMetrics → Prometheus text 0.0.4: a counter family's HELP and TYPE
/// lines take the `_total` name its samples have, and the `# UNIT` and
/// `# EOF` lines, which that format does not know, go.
pub fn to_classic_text(open_metrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = open_metrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open_metrics.len());
    for line in open_metrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let rewritten = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        match rewritten {
            Some(line) => out.push_str(&line),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod bucket_tests {
    #[test]
    fn run_durations_are_bucketed_as_the_spec_lists() {
        let metrics = super::Metrics::new();
        metrics
            .job_run_duration
            .get_or_create(&Default::default())
            .observe(2_500.0);
        let text = metrics.encode_text();
        for le in [
            "30.0", "60.0", "120.0", "300.0", "600.0", "1200.0", "3000.0", "6000.0", "+Inf",
        ] {
            assert!(
                text.contains(&format!("le=\"{le}\"")),
                "bucket {le} in\n{text}"
            );
        }
        assert!(!text.contains("le=\"1800.0\""));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn classic_text_names_counters_as_their_samples() {
        let open = "# HELP runway_jobs Jobs.\n# TYPE runway_jobs counter\nrunway_jobs_total{pool=\"a\"} 3\n# HELP runway_d_seconds D.\n# TYPE runway_d_seconds histogram\n# UNIT runway_d_seconds seconds\nrunway_d_seconds_count 1\n# EOF\n";
        assert_eq!(
            super::to_classic_text(open),
            "# HELP runway_jobs_total Jobs.\n# TYPE runway_jobs_total counter\nrunway_jobs_total{pool=\"a\"} 3\n# HELP runway_d_seconds D.\n# TYPE runway_d_seconds histogram\nrunway_d_seconds_count 1\n"
        );
    }
}
