//! The store conformance suite: every case runs against SQLite and
//! PostgreSQL, so the two backends cannot drift apart.

on_both_backends!(
    enqueue_is_idempotent_on_source_and_external_id,
    enqueue_many_returns_input_order_and_dedupes,
    claim_takes_the_oldest_jobs_of_one_pool,
    claim_matches_the_core_state_machine,
    keepalive_accept_complete_by_the_holder_only,
    queue_times_are_those_of_jobs_started_in_the_window,
    guarded_changes_in_sql_are_the_core_ones,
    decline_requeues_at_the_tail_and_excludes_the_runner,
    expired_leases_requeue_then_fail_at_max_attempts,
    extended_leases_do_not_expire,
    cancel_is_terminal,
    unroutable_jobs_are_stored_and_never_claimed,
    list_jobs_filters_by_state_and_pool,
    runners_move_through_their_states_with_timestamps,
    a_stock_runner_keeps_its_mark_and_stop_time_until_started,
    runner_names_are_unique,
    ready_after_open,
    concurrent_duplicate_enqueues_create_one_job,
    job_counts_per_pool_and_state,
    deliveries_are_recorded_once_and_with_their_job,
    newest_first_listing_pages_with_a_cursor,
    worker_configs_are_versioned_and_own_their_pools,
    concurrent_worker_config_writes_with_one_version_let_one_win,
    claims_honour_runner_labels,
    registration_tokens_are_single_use_and_expire,
    a_registration_asked_again_with_its_attempt_gives_the_same_runner,
    bound_registration_tokens_adopt_their_runner_record,
    the_controller_id_is_chosen_once,
    instance_tokens_hand_out_one_registration,
    instance_tokens_are_armed_for_a_start_until_spent,
    retention_prunes_only_old_finished_rows_in_batches,
    job_logs_are_replaced,
    settings_and_external_ids_are_replaced,
    once_keys_are_claimed_once_until_pruned,
    one_process_leads_at_a_time,
    wake_ups_reach_every_listener_of_the_store,
    replicas_heartbeat_and_each_new_leader_has_a_greater_term,
    a_fenced_store_writes_only_in_its_term,
    a_silent_leader_loses_the_lead,
    a_job_and_its_runner_move_together_or_not_at_all,
    live_runners_are_the_non_terminal_ones,
    concurrent_guarded_changes_each_get_their_own_answer,
    a_claim_that_starts_is_a_claim_and_an_accept_in_one_write,
    concurrent_claims_that_start_never_share_a_job_or_a_runner,
    a_completion_can_start_the_runners_next_job_in_the_same_write,
    a_completion_starts_only_a_next_job_the_runner_can_take,
    runners_working_through_a_queue_one_write_a_job_never_share_a_job,
    a_guarded_change_with_its_runner_writes_all_or_nothing,
    the_queue_is_served_by_fair_share_across_keys,
    weights_share_the_queue_in_proportion,
    a_batch_is_tagged_as_its_jobs_one_by_one_would_be,
    the_cap_passes_over_a_key_at_its_limit_on_every_claim_path,
    pool_samples_merge_into_buckets_and_are_pruned_by_minute,
    hourly_rollups_read_as_the_minutes_would,
    jobs_are_read_by_ids_in_id_order,
);

mod cases {
    use std::sync::Arc;
    use std::time::Duration;

    use runway_core::job::{NewJob, Route};
    use runway_core::runner::NewRunner;
    use runway_core::{
        Conclusion, JobEvent, JobSource, JobState, JobTransitionError, RunnerEvent, RunnerId,
        RunnerState, RunnerTransitionError,
    };
    use runway_store::{Claim, Delivery, Expect, JobFilter, RunnerFilter, Store, StoreError};

    use crate::common::{api_job, at};

    const LEASE: Duration = Duration::from_secs(120);
    const LEAD_SILENCE: Duration = Duration::from_secs(60);

    fn claim(pool: &str, runner: i64, limit: u32) -> Claim {
        Claim::of_pool(pool, RunnerId(runner), limit, LEASE)
    }

    pub async fn ready_after_open(store: Arc<dyn Store>) {
        store
            .check_ready()
            .await
            .expect("migrations applied at open");
    }

    pub async fn enqueue_is_idempotent_on_source_and_external_id(store: Arc<dyn Store>) {
        let first = store
            .enqueue(&api_job("build-1", "default"), at(1_000))
            .await
            .unwrap();
        assert!(first.created);
        assert_eq!(first.job.state, JobState::Queued);
        assert_eq!(first.job.enqueued_at, at(1_000));
        let again = store
            .enqueue(&api_job("build-1", "default"), at(2_000))
            .await
            .unwrap();
        assert!(!again.created);
        assert_eq!(
            again.job, first.job,
            "a redelivery returns the stored job unchanged"
        );
        let github = NewJob {
            source: JobSource::Github,
            ..api_job("build-1", "default")
        };
        let other = store.enqueue(&github, at(3_000)).await.unwrap();
        assert!(
            other.created,
            "the same external id from another source is another job"
        );
        assert_ne!(other.job.id, first.job.id);
        let found = store.find_job(JobSource::Github, "build-1").await.unwrap();
        assert_eq!(found, Some(other.job));
    }

    pub async fn concurrent_duplicate_enqueues_create_one_job(store: Arc<dyn Store>) {
        // Many deliveries of the same few jobs at once, as a webhook retry
        // storm would send them: each job is created exactly once.
        let mut tasks = Vec::new();
        for delivery in 0..48 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let job = api_job(&format!("dup-{}", delivery % 3), "default");
                store.enqueue(&job, at(delivery)).await.expect("enqueue")
            }));
        }
        let mut created = 0;
        let mut ids = std::collections::BTreeSet::new();
        for task in tasks {
            let enqueued = task.await.expect("task");
            created += usize::from(enqueued.created);
            ids.insert(enqueued.job.id);
        }
        assert_eq!((created, ids.len()), (3, 3));
        assert_eq!(
            store.list_jobs(&JobFilter::default()).await.unwrap().len(),
            3
        );
    }

    pub async fn deliveries_are_recorded_once_and_with_their_job(store: Arc<dyn Store>) {
        let delivery = Delivery {
            id: "72d3162e-cc78-11e3-81ab-4c9367dc0958".into(),
            event: "workflow_job".into(),
            action: Some("queued".into()),
            external_id: Some("42".into()),
            outcome: "queued".into(),
            received_at: at(10),
        };
        assert!(!store.delivery_seen(&delivery.id).await.unwrap());
        let (enqueued, new_delivery) = store
            .enqueue_with_delivery(&api_job("42", "default"), Some(&delivery), at(10))
            .await
            .unwrap();
        assert!(enqueued.created && new_delivery);
        assert_eq!(
            store.get_job(enqueued.job.id).await.unwrap().as_ref(),
            Some(&enqueued.job),
            "the job answered is the job stored"
        );
        let (again, new_delivery) = store
            .enqueue_with_delivery(&api_job("42", "default"), Some(&delivery), at(11))
            .await
            .unwrap();
        assert!(
            !again.created && !new_delivery,
            "a redelivery creates nothing"
        );
        assert_eq!(again.job, enqueued.job, "the stored job, as it is");
        let later = Delivery {
            id: "a-later-delivery-about-42".into(),
            ..delivery.clone()
        };
        let (same, new_delivery) = store
            .enqueue_with_delivery(&api_job("42", "default"), Some(&later), at(12))
            .await
            .unwrap();
        assert!(
            !same.created && new_delivery,
            "a new delivery about a stored job records the delivery only"
        );
        assert_eq!(same.job, enqueued.job);
        assert!(store.delivery_seen(&later.id).await.unwrap());
        assert!(store.delivery_seen(&delivery.id).await.unwrap());
        assert!(
            !store.record_delivery(&delivery).await.unwrap(),
            "a redelivery is not new"
        );
        let other = Delivery {
            id: "another".into(),
            ..delivery.clone()
        };
        assert!(store.record_delivery(&other).await.unwrap());
    }

    pub async fn newest_first_listing_pages_with_a_cursor(store: Arc<dyn Store>) {
        for i in 0..5 {
            store
                .enqueue(&api_job(&format!("j{i}"), "default"), at(i))
                .await
                .unwrap();
        }
        let page = |before| JobFilter {
            limit: Some(2),
            newest_first: true,
            before,
            ..JobFilter::default()
        };
        let first = store.list_jobs(&page(None)).await.unwrap();
        let names: Vec<&str> = first.iter().map(|j| j.external_id.as_str()).collect();
        assert_eq!(names, ["j4", "j3"]);
        let second = store.list_jobs(&page(Some(first[1].id))).await.unwrap();
        let names: Vec<&str> = second.iter().map(|j| j.external_id.as_str()).collect();
        assert_eq!(names, ["j2", "j1"]);
    }

    pub async fn worker_configs_are_versioned_and_own_their_pools(store: Arc<dyn Store>) {
        let pools = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        let v1 = store
            .put_worker_config(
                "build",
                r#"{"rules":[]}"#,
                &pools(&["a", "b"]),
                Expect::Any,
                at(1),
            )
            .await
            .unwrap();
        assert_eq!(v1, 1);
        let stored = store.get_worker_config("build").await.unwrap().unwrap();
        assert_eq!(
            (stored.version, stored.pools.clone()),
            (1, pools(&["a", "b"]))
        );
        let v2 = store
            .put_worker_config(
                "build",
                r#"{"rules":[1]}"#,
                &pools(&["b", "c"]),
                Expect::Version(1),
                at(2),
            )
            .await
            .unwrap();
        assert_eq!(v2, 2);
        let stale = store
            .put_worker_config("build", "{}", &pools(&["a"]), Expect::Version(1), at(3))
            .await;
        assert!(
            matches!(
                stale,
                Err(StoreError::VersionConflict {
                    current: Some(2),
                    ..
                })
            ),
            "{stale:?}"
        );
        let taken = store
            .put_worker_config("test", "{}", &pools(&["x", "c"]), Expect::Any, at(4))
            .await;
        assert!(
            matches!(&taken, Err(StoreError::PoolTaken { pool, owner }) if pool == "c" && owner == "build"),
            "{taken:?}"
        );
        assert!(
            store.get_worker_config("test").await.unwrap().is_none(),
            "a refused write leaves nothing"
        );
        store
            .put_worker_config("test", "{}", &pools(&["a"]), Expect::Any, at(5))
            .await
            .expect("pool a was released by build's second version");
        let all = store.list_worker_configs().await.unwrap();
        let summary: Vec<(String, i64, Vec<String>)> = all
            .into_iter()
            .map(|c| (c.id, c.version, c.pools))
            .collect();
        assert_eq!(
            summary,
            [
                ("build".into(), 2, pools(&["b", "c"])),
                ("test".into(), 1, pools(&["a"]))
            ]
        );
        assert!(matches!(
            store
                .delete_worker_config("build", Expect::Version(1))
                .await,
            Err(StoreError::VersionConflict { .. })
        ));
        assert!(store
            .delete_worker_config("build", Expect::Version(2))
            .await
            .unwrap());
        assert!(!store
            .delete_worker_config("build", Expect::Any)
            .await
            .unwrap());
        store
            .put_worker_config("other", "{}", &pools(&["c"]), Expect::Any, at(6))
            .await
            .expect("a deleted configuration's pools are free");
        assert!(matches!(
            store
                .put_worker_config("new", "{}", &[], Expect::Version(3), at(7))
                .await,
            Err(StoreError::VersionConflict { current: None, .. })
        ));
    }

    pub async fn concurrent_worker_config_writes_with_one_version_let_one_win(
        store: Arc<dyn Store>,
    ) {
        store
            .put_worker_config("c", "{}", &[], Expect::Any, at(0))
            .await
            .unwrap();
        let mut tasks = Vec::new();
        for writer in 0..8 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let body = format!("{{\"writer\":{writer}}}");
                store
                    .put_worker_config("c", &body, &[], Expect::Version(1), at(writer))
                    .await
            }));
        }
        let mut wins = 0;
        for task in tasks {
            match task.await.unwrap() {
                Ok(version) => {
                    assert_eq!(version, 2);
                    wins += 1;
                }
                Err(StoreError::VersionConflict { .. }) => {}
                Err(other) => panic!("unexpected {other}"),
            }
        }
        assert_eq!(wins, 1);
    }

    pub async fn claims_honour_runner_labels(store: Arc<dyn Store>) {
        let job = |id: &str, labels: &[&str]| NewJob {
            labels: labels.iter().map(|l| (*l).to_owned()).collect(),
            ..api_job(id, "default")
        };
        store
            .enqueue(&job("gpu", &["self-hosted", "GPU"]), at(1))
            .await
            .unwrap();
        store
            .enqueue(&job("plain", &["self-hosted"]), at(2))
            .await
            .unwrap();
        let labelled = |runner: i64, labels: &[&str]| Claim {
            runner_labels: Some(labels.iter().map(|l| (*l).to_owned()).collect()),
            max_running_per_key: None,
            ..claim("default", runner, 5)
        };
        let cpu = store
            .claim(&labelled(1, &["Self-Hosted", "linux"]), at(3))
            .await
            .unwrap();
        let names: Vec<&str> = cpu.iter().map(|j| j.external_id.as_str()).collect();
        assert_eq!(
            names,
            ["plain"],
            "the gpu job needs a runner with gpu; labels compare case-insensitively"
        );
        let gpu = store
            .claim(&labelled(2, &["self-hosted", "gpu"]), at(4))
            .await
            .unwrap();
        assert_eq!(gpu[0].external_id, "gpu");
        // Labels whose JSON form holds escapes compare the same way.
        store
            .enqueue(&job("quoted", &["self-hosted", "Say \"Hi\"\\"]), at(5))
            .await
            .unwrap();
        let quoted = store
            .claim(&labelled(3, &["SELF-HOSTED", "say \"hi\"\\"]), at(6))
            .await
            .unwrap();
        let names: Vec<&str> = quoted.iter().map(|j| j.external_id.as_str()).collect();
        assert_eq!(names, ["quoted"]);
    }

    pub async fn registration_tokens_are_single_use_and_expire(store: Arc<dyn Store>) {
        store
            .create_registration_token("hash-1", "default", None, at(1_000), at(0))
            .await
            .unwrap();
        store
            .create_registration_token("hash-2", "default", None, at(1_000), at(0))
            .await
            .unwrap();
        let labels = vec!["self-hosted".to_owned()];
        let runner = store
            .register_runner("hash-1", None, "r1", &labels, "runner-hash-1", at(10))
            .await
            .unwrap()
            .runner;
        assert_eq!(
            (runner.pool.as_str(), runner.labels.clone()),
            ("default", labels.clone())
        );
        let again = store
            .register_runner("hash-1", None, "r2", &labels, "runner-hash-2", at(11))
            .await;
        assert!(
            matches!(again, Err(StoreError::InvalidToken)),
            "used: {again:?}"
        );
        let unknown = store
            .register_runner("nope", None, "r3", &labels, "runner-hash-3", at(12))
            .await;
        assert!(matches!(unknown, Err(StoreError::InvalidToken)));
        let expired = store
            .register_runner("hash-2", None, "r4", &labels, "runner-hash-4", at(1_000))
            .await;
        assert!(
            matches!(expired, Err(StoreError::InvalidToken)),
            "expired at its deadline"
        );
        let found = store
            .find_runner_by_token("runner-hash-1")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(found, runner, "the runner answered is the row as stored");
        // A token replaced moves the runner's version: a start guarded by
        // the version read with the old token no longer holds.
        store
            .set_runner_token(runner.id, "runner-hash-1b")
            .await
            .unwrap();
        let replaced = store
            .find_runner_by_token("runner-hash-1b")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(replaced.version, runner.version + 1);
        assert!(store
            .find_runner_by_token("runner-hash-1")
            .await
            .unwrap()
            .is_none());
        assert!(store
            .find_runner_by_token("hash-1")
            .await
            .unwrap()
            .is_none());
    }

    pub async fn a_registration_asked_again_with_its_attempt_gives_the_same_runner(
        store: Arc<dyn Store>,
    ) {
        let labels = vec!["self-hosted".to_owned()];
        for token in ["token-a", "token-b", "token-c"] {
            store
                .create_registration_token(token, "default", None, at(1_000), at(0))
                .await
                .unwrap();
        }
        let first = store
            .register_runner("token-a", Some("attempt-a"), "ra", &labels, "rt-a1", at(10))
            .await
            .unwrap();
        assert!(!first.repeated);
        // The answer was lost: the same attempt asks again.
        let again = store
            .register_runner("token-a", Some("attempt-a"), "ra", &labels, "rt-a2", at(11))
            .await
            .unwrap();
        assert!(again.repeated);
        assert_eq!(again.runner.id, first.runner.id, "no second runner");
        assert_eq!(
            store.find_runner_by_token("rt-a2").await.unwrap().as_ref(),
            Some(&again.runner),
            "the runner answered again is the row as stored"
        );
        assert_eq!(
            store
                .find_runner_by_token("rt-a2")
                .await
                .unwrap()
                .map(|r| r.id),
            Some(first.runner.id)
        );
        assert_eq!(
            store.find_runner_by_token("rt-a1").await.unwrap(),
            None,
            "the lost token no longer works"
        );
        // Another attempt, another name, or no attempt: the token is used.
        for (attempt, name) in [
            (Some("attempt-x"), "ra"),
            (Some("attempt-a"), "other"),
            (None, "ra"),
        ] {
            let refused = store
                .register_runner("token-a", attempt, name, &labels, "rt-x", at(12))
                .await;
            assert!(
                matches!(refused, Err(StoreError::InvalidToken)),
                "{attempt:?} {name}: {refused:?}"
            );
        }
        // Not once the runner has had a job, nor after the token expired.
        let busy = store
            .register_runner("token-b", Some("attempt-b"), "rb", &labels, "rt-b1", at(10))
            .await
            .unwrap()
            .runner;
        store
            .apply_runner_event(busy.id, &RunnerEvent::Ready, at(11))
            .await
            .unwrap();
        store
            .apply_runner_event(
                busy.id,
                &RunnerEvent::JobAssigned {
                    job: runway_core::JobId(77),
                },
                at(12),
            )
            .await
            .unwrap();
        let refused = store
            .register_runner("token-b", Some("attempt-b"), "rb", &labels, "rt-b2", at(13))
            .await;
        assert!(
            matches!(refused, Err(StoreError::InvalidToken)),
            "{refused:?}"
        );
        store
            .register_runner("token-c", Some("attempt-c"), "rc", &labels, "rt-c1", at(10))
            .await
            .unwrap();
        let late = store
            .register_runner(
                "token-c",
                Some("attempt-c"),
                "rc",
                &labels,
                "rt-c2",
                at(1_000),
            )
            .await;
        assert!(matches!(late, Err(StoreError::InvalidToken)), "{late:?}");
    }

    pub async fn bound_registration_tokens_adopt_their_runner_record(store: Arc<dyn Store>) {
        let new = |name: &str| NewRunner {
            name: name.to_owned(),
            pool: "local".to_owned(),
            provider: "process".to_owned(),
            labels: vec!["local".to_owned(), "linux".to_owned()],
            stock: false,
        };
        let created = store.create_runner(&new("local-1"), at(0)).await.unwrap();
        store
            .create_registration_token("bound-1", "local", Some(created.id), at(1_000), at(0))
            .await
            .unwrap();
        let adopted = store
            .register_runner(
                "bound-1",
                None,
                "ignored",
                &["other".to_owned()],
                "rt-1",
                at(5),
            )
            .await
            .unwrap()
            .runner;
        assert_eq!(adopted.id, created.id, "no second record");
        assert_eq!(adopted.name, "local-1", "the record keeps its name");
        assert_eq!(adopted.provider, "process");
        assert_eq!(adopted.state, RunnerState::Idle, "registered means ready");
        assert_eq!(adopted.labels, created.labels);
        assert_eq!(
            store
                .find_runner_by_token("rt-1")
                .await
                .unwrap()
                .map(|r| r.id),
            Some(created.id)
        );
        assert_eq!(
            store
                .list_runners(&RunnerFilter::default())
                .await
                .unwrap()
                .len(),
            1
        );

        // A record that failed (say, its boot timed out) admits no runner.
        let late = store.create_runner(&new("local-2"), at(0)).await.unwrap();
        store
            .create_registration_token("bound-2", "local", Some(late.id), at(1_000), at(0))
            .await
            .unwrap();
        store
            .apply_runner_event(
                late.id,
                &RunnerEvent::Failed {
                    reason: "boot timeout".into(),
                },
                at(6),
            )
            .await
            .unwrap();
        let refused = store
            .register_runner("bound-2", None, "local-2", &[], "rt-2", at(7))
            .await;
        assert!(
            matches!(refused, Err(StoreError::InvalidToken)),
            "{refused:?}"
        );
        assert_eq!(store.find_runner_by_token("rt-2").await.unwrap(), None);
    }

    pub async fn the_controller_id_is_chosen_once(store: Arc<dyn Store>) {
        assert_eq!(
            store
                .init_setting("controller_uuid", "first")
                .await
                .unwrap(),
            "first"
        );
        assert_eq!(
            store
                .init_setting("controller_uuid", "second")
                .await
                .unwrap(),
            "first"
        );
    }

    pub async fn instance_tokens_hand_out_one_registration(store: Arc<dyn Store>) {
        let runner = store
            .create_runner(
                &NewRunner {
                    name: "garm-1".into(),
                    pool: "linux".into(),
                    provider: "lxd".into(),
                    labels: vec![],
                    stock: false,
                },
                at(0),
            )
            .await
            .unwrap();
        assert_eq!(store.find_instance_token("h-1").await.unwrap(), None);
        store
            .create_instance_token("h-1", runner.id, at(60), Some(r#"{".runner":"e30="}"#))
            .await
            .unwrap();
        let found = store.find_instance_token("h-1").await.unwrap().unwrap();
        assert_eq!(
            (
                found.runner,
                found.expires_at,
                found.jit_files.as_deref(),
                found.token_fetched
            ),
            (runner.id, at(60), Some(r#"{".runner":"e30="}"#), false)
        );
        assert!(store
            .take_instance_registration("h-1", at(1))
            .await
            .unwrap());
        assert!(
            !store
                .take_instance_registration("h-1", at(2))
                .await
                .unwrap(),
            "once"
        );
        assert!(
            !store
                .take_instance_registration("h-2", at(2))
                .await
                .unwrap(),
            "unknown"
        );
        assert!(
            store
                .find_instance_token("h-1")
                .await
                .unwrap()
                .unwrap()
                .token_fetched
        );
    }

    /// A stock runner's instance token is armed at its start: a new expiry
    /// and the JIT files minted then, for its tokens not yet spent; a
    /// token that handed out its registration is left as it is.
    pub async fn instance_tokens_are_armed_for_a_start_until_spent(store: Arc<dyn Store>) {
        let runner = store
            .create_runner(
                &NewRunner {
                    name: "garm-stock-1".into(),
                    pool: "linux".into(),
                    provider: "lxd".into(),
                    labels: vec![],
                    stock: true,
                },
                at(0),
            )
            .await
            .unwrap();
        store
            .create_instance_token("h-stock", runner.id, at(86_400), None)
            .await
            .unwrap();
        let armed = store
            .arm_instance_tokens(runner.id, at(700), Some("{}"))
            .await
            .unwrap();
        assert_eq!(armed, 1);
        let found = store.find_instance_token("h-stock").await.unwrap().unwrap();
        assert_eq!(
            (found.expires_at, found.jit_files.as_deref()),
            (at(700), Some("{}"))
        );
        assert!(store
            .take_instance_registration("h-stock", at(701))
            .await
            .unwrap());
        assert_eq!(
            store
                .arm_instance_tokens(runner.id, at(900), None)
                .await
                .unwrap(),
            0,
            "spent"
        );
        assert_eq!(
            store
                .find_instance_token("h-stock")
                .await
                .unwrap()
                .unwrap()
                .expires_at,
            at(700)
        );
        assert_eq!(
            store
                .arm_instance_tokens(RunnerId(runner.id.0 + 1000), at(900), None)
                .await
                .unwrap(),
            0,
            "another runner's"
        );
    }

    pub async fn retention_prunes_only_old_finished_rows_in_batches(store: Arc<dyn Store>) {
        use runway_store::{Delivery, Prunable};
        // Three jobs finished long ago, one recently, one queued long ago.
        let mut old = Vec::new();
        for i in 0..3 {
            let job = store
                .enqueue(&api_job(&format!("old-{i}"), "default"), at(0))
                .await
                .unwrap()
                .job;
            store.cancel(job.id, "done", at(10 + i)).await.unwrap();
            store.put_job_log(job.id, Some(0), "output").await.unwrap();
            old.push(job.id);
        }
        let recent = store
            .enqueue(&api_job("recent", "default"), at(0))
            .await
            .unwrap()
            .job;
        store.cancel(recent.id, "done", at(5_000)).await.unwrap();
        store.put_job_log(recent.id, None, "kept").await.unwrap();
        let queued = store
            .enqueue(&api_job("queued", "default"), at(0))
            .await
            .unwrap()
            .job;
        let cutoff = at(1_000);
        assert_eq!(store.count_rows(Prunable::FinishedJobs).await.unwrap(), 5);
        assert_eq!(store.prune(Prunable::JobLogs, cutoff, 2).await.unwrap(), 2);
        assert_eq!(
            store
                .prune(Prunable::FinishedJobs, cutoff, 2)
                .await
                .unwrap(),
            2
        );
        assert_eq!(
            store
                .prune(Prunable::FinishedJobs, cutoff, 2)
                .await
                .unwrap(),
            1
        );
        assert_eq!(
            store
                .prune(Prunable::FinishedJobs, cutoff, 2)
                .await
                .unwrap(),
            0
        );
        for id in old {
            assert_eq!(store.get_job(id).await.unwrap(), None);
            assert_eq!(
                store.get_job_log(id).await.unwrap(),
                None,
                "its log went with it"
            );
        }
        assert!(store.get_job(recent.id).await.unwrap().is_some());
        assert!(store.get_job_log(recent.id).await.unwrap().is_some());
        assert_eq!(
            store.get_job(queued.id).await.unwrap().map(|j| j.state),
            Some(JobState::Queued),
            "live work is never pruned, however old"
        );
        assert_eq!(store.count_rows(Prunable::JobLogs).await.unwrap(), 1);

        // Runners: an old ended one (with a report and a token) goes; an
        // old live one and a recently ended one stay.
        let runner = |name: &str| NewRunner {
            name: name.into(),
            pool: "default".into(),
            provider: "sim".into(),
            labels: vec![],
            stock: false,
        };
        let ended = store.create_runner(&runner("ended"), at(0)).await.unwrap();
        let failed = RunnerEvent::Failed {
            reason: "gone".into(),
        };
        store
            .apply_runner_event(ended.id, &failed, at(20))
            .await
            .unwrap();
        store
            .add_runner_report(ended.id, "pre-job", "{}", at(15))
            .await
            .unwrap();
        store
            .create_instance_token("tok-ended", ended.id, at(30), None)
            .await
            .unwrap();
        let live = store.create_runner(&runner("live"), at(0)).await.unwrap();
        let late = store.create_runner(&runner("late"), at(0)).await.unwrap();
        store
            .apply_runner_event(late.id, &failed, at(5_000))
            .await
            .unwrap();
        assert_eq!(
            store
                .prune(Prunable::EndedRunners, cutoff, 10)
                .await
                .unwrap(),
            1
        );
        assert_eq!(store.get_runner(ended.id).await.unwrap(), None);
        assert!(store.runner_reports(ended.id).await.unwrap().is_empty());
        assert_eq!(store.find_instance_token("tok-ended").await.unwrap(), None);
        assert!(store.get_runner(live.id).await.unwrap().is_some());
        assert!(store.get_runner(late.id).await.unwrap().is_some());

        // Deliveries, reports, once-keys and tokens by their own times.
        for (id, received) in [("d-old", 10), ("d-new", 5_000)] {
            store
                .record_delivery(&Delivery {
                    id: id.into(),
                    event: "workflow_job".into(),
                    action: Some("queued".into()),
                    external_id: None,
                    outcome: "accepted".into(),
                    received_at: at(received),
                })
                .await
                .unwrap();
        }
        assert_eq!(
            store.prune(Prunable::Deliveries, cutoff, 10).await.unwrap(),
            1
        );
        assert!(!store.delivery_seen("d-old").await.unwrap());
        assert!(store.delivery_seen("d-new").await.unwrap());
        store
            .add_runner_report(live.id, "pre-job", "{}", at(10))
            .await
            .unwrap();
        store
            .add_runner_report(live.id, "post-job", "{}", at(5_000))
            .await
            .unwrap();
        assert_eq!(
            store
                .prune(Prunable::RunnerReports, cutoff, 10)
                .await
                .unwrap(),
            1
        );
        assert_eq!(store.runner_reports(live.id).await.unwrap().len(), 1);
        assert!(store.claim_once("k-old", at(10), at(0)).await.unwrap());
        assert_eq!(
            store.prune(Prunable::OnceKeys, cutoff, 10).await.unwrap(),
            1
        );
        store
            .create_instance_token("tok-live", live.id, at(20), None)
            .await
            .unwrap();
        assert_eq!(
            store
                .prune(Prunable::InstanceTokens, cutoff, 10)
                .await
                .unwrap(),
            1
        );
        store.reclaim_space(100).await.unwrap();
    }

    pub async fn settings_and_external_ids_are_replaced(store: Arc<dyn Store>) {
        assert_eq!(store.get_setting("cursor").await.unwrap(), None);
        store.put_setting("cursor", "1").await.unwrap();
        store.put_setting("cursor", "2").await.unwrap();
        assert_eq!(
            store.get_setting("cursor").await.unwrap().as_deref(),
            Some("2")
        );
        let runner = store
            .create_runner(
                &NewRunner {
                    name: "gh-1".into(),
                    pool: "default".into(),
                    provider: "sim".into(),
                    labels: vec![],
                    stock: false,
                },
                at(0),
            )
            .await
            .unwrap();
        assert_eq!(store.runner_external_id(runner.id).await.unwrap(), None);
        store.set_runner_external_id(runner.id, "23").await.unwrap();
        assert_eq!(
            store
                .runner_external_id(runner.id)
                .await
                .unwrap()
                .as_deref(),
            Some("23")
        );
        assert!(matches!(
            store.set_runner_external_id(RunnerId(999_999), "1").await,
            Err(StoreError::RunnerNotFound(_))
        ));
        // Ended with its registration not let go: listed until it is.
        assert!(store.ended_runners_registered(10).await.unwrap().is_empty());
        let failed = RunnerEvent::Failed {
            reason: "boot".into(),
        };
        store
            .apply_runner_event(runner.id, &failed, at(1))
            .await
            .unwrap();
        let listed = store.ended_runners_registered(10).await.unwrap();
        assert_eq!(listed.iter().map(|r| r.id).collect::<Vec<_>>(), [runner.id]);
        store.set_runner_external_id(runner.id, "").await.unwrap();
        assert!(store.ended_runners_registered(10).await.unwrap().is_empty());
    }

    pub async fn once_keys_are_claimed_once_until_pruned(store: Arc<dyn Store>) {
        assert!(store
            .claim_once("redeliver:1", at(10), at(0))
            .await
            .unwrap());
        assert!(!store
            .claim_once("redeliver:1", at(20), at(0))
            .await
            .unwrap());
        assert!(store
            .claim_once("redeliver:2", at(20), at(0))
            .await
            .unwrap());
        // Pruned once older than forget_before: claimable again.
        assert!(store
            .claim_once("redeliver:1", at(30), at(15))
            .await
            .unwrap());
        assert!(!store
            .claim_once("redeliver:2", at(30), at(15))
            .await
            .unwrap());
        assert!(store.once_claimed("redeliver:2").await.unwrap());
        store.forget_once("redeliver:2").await.unwrap();
        assert!(!store.once_claimed("redeliver:2").await.unwrap());
        assert!(!store.once_claimed("never").await.unwrap());
        assert!(store
            .claim_once("redeliver:2", at(40), at(15))
            .await
            .unwrap());
    }

    /// Tries for the lead of `name` until it is had; fails with `why`
    /// after 10 s.
    async fn lead_within_10_s(store: &Arc<dyn Store>, name: &str, why: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while store.try_lead(name, LEAD_SILENCE).await.unwrap().is_none() {
            assert!(std::time::Instant::now() < deadline, "{why}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn one_process_leads_at_a_time(store: Arc<dyn Store>) {
        let mut first = store
            .try_lead("reconciler", LEAD_SILENCE)
            .await
            .unwrap()
            .expect("leads");
        assert!(first.still_held().await);
        let second = store.try_lead("reconciler", LEAD_SILENCE).await.unwrap();
        match store.backend() {
            // One process owns a SQLite file: it always leads.
            runway_store::Backend::Sqlite => assert!(second.is_some()),
            runway_store::Backend::Postgres => {
                assert!(second.is_none(), "the lock is held");
                assert!(
                    store
                        .try_lead("healer", LEAD_SILENCE)
                        .await
                        .unwrap()
                        .is_some(),
                    "per name"
                );
                drop(first);
                // The session closes as the connection drops; the server
                // frees the lock as it notices.
                lead_within_10_s(&store, "reconciler", "the lead was never given up").await;
            }
        }
    }

    pub async fn wake_ups_reach_every_listener_of_the_store(store: Arc<dyn Store>) {
        use runway_store::{Heard, Wake};
        let listener = store.listen().await.unwrap();
        match store.backend() {
            // One process owns a SQLite file: nobody else to wake.
            runway_store::Backend::Sqlite => {
                assert!(listener.is_none());
                store.announce("a", &[Wake::job_anywhere()]).await.unwrap();
            }
            runway_store::Backend::Postgres => {
                let mut listener = listener.expect("PostgreSQL listens");
                let sent = [
                    Wake::job_anywhere(),
                    Wake::job_in("linux x64: large"),
                    Wake::ReconcileWanted,
                ];
                store.announce("replica-a", &sent).await.unwrap();
                let mut heard = Vec::new();
                for _ in 0..sent.len() {
                    let next = tokio::time::timeout(Duration::from_secs(10), listener.next())
                        .await
                        .expect("a wake-up within 10 s")
                        .unwrap();
                    heard.push(next);
                }
                assert_eq!(
                    heard,
                    sent.map(|wake| Heard::Wake {
                        from: "replica-a".into(),
                        wake
                    })
                );
            }
        }
    }

    pub async fn replicas_heartbeat_and_each_new_leader_has_a_greater_term(store: Arc<dyn Store>) {
        use runway_store::{LeaderTerm, Replica};
        let replica = |id: &str, started: i64, heartbeat: i64| Replica {
            id: id.into(),
            address: format!("http://{id}:8080"),
            version: "1.0".into(),
            started_at: at(started),
            heartbeat_at: at(heartbeat),
        };
        store
            .heartbeat_replica(&replica("a", 0, 10), at(0))
            .await
            .unwrap();
        store
            .heartbeat_replica(&replica("b", 5, 10), at(0))
            .await
            .unwrap();
        // A heartbeat moves only the heartbeat (and what may change on restart).
        store
            .heartbeat_replica(&replica("a", 0, 20), at(0))
            .await
            .unwrap();
        assert_eq!(
            store.replicas(at(0)).await.unwrap(),
            [replica("a", 0, 20), replica("b", 5, 10)]
        );
        assert_eq!(
            store.replicas(at(15)).await.unwrap(),
            [replica("a", 0, 20)],
            "seen recently"
        );
        // b has been silent too long: forgotten by the next heartbeat.
        store
            .heartbeat_replica(&replica("a", 0, 30), at(15))
            .await
            .unwrap();
        assert_eq!(store.replicas(at(0)).await.unwrap(), [replica("a", 0, 30)]);

        assert_eq!(store.leader("runway").await.unwrap(), None);
        assert_eq!(store.begin_term("runway", "a", at(40)).await.unwrap(), 1);
        assert_eq!(store.begin_term("runway", "b", at(50)).await.unwrap(), 2);
        assert_eq!(
            store.begin_term("other", "b", at(50)).await.unwrap(),
            1,
            "per name"
        );
        assert_eq!(
            store.leader("runway").await.unwrap(),
            Some(LeaderTerm {
                replica: "b".into(),
                term: 2,
                since: at(50)
            })
        );
        // A release of an earlier term changes nothing; of the current
        // term, it says nobody holds it, and the next term counts on.
        store.end_term("runway", 1).await.unwrap();
        assert_eq!(store.leader("runway").await.unwrap().unwrap().replica, "b");
        store.end_term("runway", 2).await.unwrap();
        assert_eq!(
            store.leader("runway").await.unwrap(),
            Some(LeaderTerm {
                replica: String::new(),
                term: 2,
                since: at(50)
            })
        );
        assert_eq!(store.begin_term("runway", "c", at(60)).await.unwrap(), 3);
        assert_eq!(store.leader("runway").await.unwrap().unwrap().replica, "c");
    }

    pub async fn jobs_are_read_by_ids_in_id_order(store: Arc<dyn Store>) {
        let mut ids = Vec::new();
        for n in 0..3 {
            let job = store
                .enqueue(&api_job(&format!("by-id-{n}"), "default"), at(1_000))
                .await
                .unwrap()
                .job;
            ids.push(job.id);
        }
        let missing = runway_core::JobId(ids[2].0 + 1_000);
        let read = store.get_jobs(&[ids[2], missing, ids[0]]).await.unwrap();
        let read: Vec<_> = read
            .iter()
            .map(|j| (j.id, j.external_id.as_str()))
            .collect();
        assert_eq!(read, [(ids[0], "by-id-0"), (ids[2], "by-id-2")]);
        assert!(store.get_jobs(&[]).await.unwrap().is_empty());
        // More than one statement's worth.
        let many: Vec<_> = (0..1_200)
            .map(|n| runway_core::JobId(ids[0].0 + n))
            .collect();
        assert_eq!(store.get_jobs(&many).await.unwrap().len(), 3);
    }

    pub async fn pool_samples_merge_into_buckets_and_are_pruned_by_minute(store: Arc<dyn Store>) {
        use runway_store::{PoolSample, Prunable};
        const MINUTE: i64 = 60_000;
        let sample = |pool: &str, minute: i64, queued: i64, started: i64, p50: i64| PoolSample {
            pool: pool.to_owned(),
            at: at(minute * MINUTE),
            queued,
            running: 1,
            booting: 0,
            idle: 2,
            busy: 1,
            stopped: 0,
            started,
            wait_p50_ms: (started > 0).then_some(p50),
            wait_p95_ms: (started > 0).then_some(p50 * 3),
            runner_seconds: 180,
            cost_micros: 5_000,
            waits: vec![("at_max_runners".into(), queued), ("pool_paused".into(), 1)],
        };
        // Ten minutes of pool a, two of pool b; minute 3 of a written twice
        // (a leader that took over in the same minute): replaced.
        let mut samples: Vec<PoolSample> = (0..10)
            .map(|m| sample("a", m, m, if m % 2 == 0 { 2 } else { 0 }, 100 * (m + 1)))
            .collect();
        samples.push(sample("b", 0, 7, 1, 50));
        samples.push(sample("b", 1, 9, 0, 0));
        store.record_pool_samples(&samples).await.unwrap();
        store
            .record_pool_samples(&[sample("a", 3, 30, 0, 0)])
            .await
            .unwrap();

        // Five-minute buckets of pool a: minutes 0–4 and 5–9.
        let points = store
            .pool_history(Some("a"), at(0), Duration::from_secs(300))
            .await
            .unwrap();
        assert_eq!(points.len(), 2, "{points:?}");
        assert_eq!(points[0].at, at(0));
        assert_eq!(points[0].samples, 5);
        assert_eq!(points[0].queued, (0.0 + 1.0 + 2.0 + 30.0 + 4.0) / 5.0);
        assert_eq!(points[0].idle, 2.0);
        assert_eq!(points[0].started, 6);
        // Medians weighted by starts (100, 300, 500 with 2 each); the
        // highest p95.
        assert_eq!(points[0].wait_p50_ms, Some(300));
        assert_eq!(points[0].wait_p95_ms, Some(1_500));
        assert_eq!(points[0].runner_seconds, 900);
        assert_eq!(points[0].cost_micros, 25_000);
        assert_eq!(points[1].at, at(5 * MINUTE));
        assert_eq!(points[1].started, 4);
        // Every pool, from minute 1: a's from minute 1, then b's.
        let all = store
            .pool_history(None, at(MINUTE), Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(all.len(), 10, "{all:?}");
        assert_eq!(all[0].pool, "a");
        assert_eq!(all[0].at, at(MINUTE));
        assert_eq!(all[9].pool, "b");
        assert_eq!(all[9].queued, 9.0);
        assert_eq!(all[9].wait_p50_ms, None, "no start, no median");

        // Job-minutes by reason, most first.
        assert_eq!(
            store.pool_waits("a", at(0)).await.unwrap(),
            [
                (
                    "at_max_runners".to_owned(),
                    30 + 1 + 2 + 4 + 5 + 6 + 7 + 8 + 9
                ),
                ("pool_paused".to_owned(), 10)
            ]
        );
        assert_eq!(
            store.pool_waits("b", at(MINUTE)).await.unwrap(),
            [
                ("at_max_runners".to_owned(), 9),
                ("pool_paused".to_owned(), 1)
            ]
        );

        // Pruned by minute, in batches, with their wait reasons.
        assert_eq!(
            store
                .prune(Prunable::PoolHistory, at(2 * MINUTE), 3)
                .await
                .unwrap(),
            3
        );
        assert_eq!(
            store
                .prune(Prunable::PoolHistory, at(2 * MINUTE), 3)
                .await
                .unwrap(),
            1
        );
        let left = store
            .pool_history(None, at(0), Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(left.len(), 8);
        assert!(left.iter().all(|p| p.at >= at(2 * MINUTE)), "{left:?}");
        assert_eq!(
            store.pool_waits("b", at(0)).await.unwrap(),
            Vec::<(String, i64)>::new()
        );
    }

    /// A week's chart reads hourly rollups (issue 59): they must read as
    /// the minutes would, a replaced minute counted once, and go with
    /// their hour's last minute.
    pub async fn hourly_rollups_read_as_the_minutes_would(store: Arc<dyn Store>) {
        use runway_store::{PoolSample, Prunable};
        const MINUTE: i64 = 60_000;
        const HOUR: i64 = 60 * MINUTE;
        let start = 1_000 * HOUR;
        let sample = |pool: &str, minute: i64, queued: i64| PoolSample {
            pool: pool.to_owned(),
            at: at(start + minute * MINUTE),
            queued,
            running: minute % 3,
            booting: 1,
            idle: minute % 2,
            busy: 0,
            stopped: minute % 5,
            started: minute % 4,
            wait_p50_ms: (minute % 4 > 0).then_some(10 * minute),
            wait_p95_ms: (minute % 4 > 0).then_some(40 * minute),
            runner_seconds: 60,
            cost_micros: minute,
            waits: if minute % 5 == 0 {
                vec![]
            } else {
                vec![
                    ("at_max_runners".into(), queued),
                    (format!("reason_{}", minute % 3), 1),
                ]
            },
        };
        // Three hours of pool a (one minute of it written twice, each
        // time with other waits), a few minutes of pool b.
        for minute in 0..180 {
            store
                .record_pool_samples(&[sample("a", minute, minute / 7)])
                .await
                .unwrap();
        }
        store
            .record_pool_samples(&[sample("a", 61, 500), sample("b", 2, 3), sample("b", 70, 4)])
            .await
            .unwrap();

        let hour = Duration::from_secs(3600);
        for pool in [Some("a"), Some("b"), None] {
            // From a whole hour: the rollups. From a millisecond before (no
            // sample there): the minutes, in the same buckets.
            let hours = store.pool_history(pool, at(start), hour).await.unwrap();
            let minutes = store.pool_history(pool, at(start - 1), hour).await.unwrap();
            assert_eq!(hours, minutes, "{pool:?}");
            assert!(!hours.is_empty());
        }
        let a = store
            .pool_history(Some("a"), at(start), hour)
            .await
            .unwrap();
        assert_eq!(a.len(), 3);
        assert_eq!(a[1].samples, 60, "the replaced minute counts once");
        // Waits from a whole hour and from within one: the hours after the
        // first whole one, the minutes before it.
        for since in [
            start,
            start + 30 * MINUTE,
            start + HOUR,
            start + 61 * MINUTE,
        ] {
            let mut expected: std::collections::BTreeMap<String, i64> = Default::default();
            for minute in (0..180).filter(|m| start + m * MINUTE >= since) {
                let queued = if minute == 61 { 500 } else { minute / 7 };
                for (reason, jobs) in sample("a", minute, queued).waits {
                    *expected.entry(reason).or_default() += jobs;
                }
            }
            let mut read = store.pool_waits("a", at(since)).await.unwrap();
            read.sort();
            let expected: Vec<(String, i64)> = expected.into_iter().collect();
            assert_eq!(read, expected, "since minute {}", (since - start) / MINUTE);
        }

        // Minutes pruned to within the third hour: the first two hours'
        // rollups go, the third's stays (some of its minutes are kept).
        while store
            .prune(Prunable::PoolHistory, at(start + 150 * MINUTE), 50)
            .await
            .unwrap()
            > 0
        {}
        let left = store
            .pool_history(Some("a"), at(start), hour)
            .await
            .unwrap();
        assert_eq!(left.len(), 1, "{left:?}");
        assert_eq!(left[0].at, at(start + 2 * HOUR));
        // The third hour's rollup says what its minutes left say.
        assert_eq!(left[0].samples, 30);
        assert_eq!(
            left,
            store
                .pool_history(Some("a"), at(start - 1), hour)
                .await
                .unwrap()
        );
        let mut waits = store.pool_waits("a", at(start)).await.unwrap();
        waits.sort();
        let mut expected: std::collections::BTreeMap<String, i64> = Default::default();
        for minute in 150..180 {
            for (reason, jobs) in sample("a", minute, minute / 7).waits {
                *expected.entry(reason).or_default() += jobs;
            }
        }
        assert_eq!(waits, expected.into_iter().collect::<Vec<_>>());
        assert!(store
            .pool_history(Some("b"), at(start), hour)
            .await
            .unwrap()
            .is_empty());
    }

    pub async fn a_fenced_store_writes_only_in_its_term(store: Arc<dyn Store>) {
        let new = |name: &str| NewRunner {
            name: name.to_owned(),
            pool: "p".to_owned(),
            provider: "sim".to_owned(),
            labels: vec![],
            stock: false,
        };
        let term = store.begin_term("runway", "a", at(0)).await.unwrap();
        let Some(fenced) = store.fenced("runway", term) else {
            // One process owns a SQLite file: nobody to fence out.
            assert_eq!(store.backend(), runway_store::Backend::Sqlite);
            return;
        };
        let mine = fenced.create_runner(&new("in-term"), at(1)).await.unwrap();
        assert!(fenced.claim_once("once-1", at(1), at(0)).await.unwrap());

        let next = store.begin_term("runway", "b", at(2)).await.unwrap();
        let late = fenced.create_runner(&new("late"), at(3)).await.unwrap_err();
        assert!(late.is_fenced(), "{late}");
        let late = fenced
            .apply_runner_event(mine.id, &RunnerEvent::TerminateRequested, at(3))
            .await
            .unwrap_err();
        assert!(late.is_fenced(), "{late}");
        let late = fenced.claim_once("once-2", at(3), at(0)).await.unwrap_err();
        assert!(late.is_fenced(), "{late}");
        // Nothing of the old term's late writes is there.
        let names: Vec<String> = store
            .list_runners(&RunnerFilter::default())
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(names, ["in-term"]);
        assert_eq!(
            store.get_runner(mine.id).await.unwrap().map(|r| r.state),
            Some(mine.state)
        );
        // The new term's store and unfenced callers write as ever.
        let current = store.fenced("runway", next).expect("fenced");
        current
            .create_runner(&new("new-term"), at(4))
            .await
            .unwrap();
        store.create_runner(&new("unfenced"), at(4)).await.unwrap();
        assert!(store.claim_once("once-2", at(4), at(0)).await.unwrap());
    }

    pub async fn a_silent_leader_loses_the_lead(store: Arc<dyn Store>) {
        let silence = Duration::from_millis(300);
        let held = store
            .try_lead("silent", silence)
            .await
            .unwrap()
            .expect("leads");
        if store.backend() == runway_store::Backend::Sqlite {
            return; // One process: it always leads.
        }
        // The holder says nothing (a paused process): the lead is freed.
        lead_within_10_s(&store, "silent", "a silent leader kept the lead").await;
        drop(held);
    }

    pub async fn job_logs_are_replaced(store: Arc<dyn Store>) {
        let job = store
            .enqueue(&api_job("j", "default"), at(0))
            .await
            .unwrap()
            .job;
        assert_eq!(store.get_job_log(job.id).await.unwrap(), None);
        store.put_job_log(job.id, None, "partial").await.unwrap();
        store.put_job_log(job.id, Some(2), "done\n").await.unwrap();
        assert_eq!(
            store.get_job_log(job.id).await.unwrap(),
            Some((Some(2), "done\n".to_owned()))
        );
    }

    pub async fn job_counts_per_pool_and_state(store: Arc<dyn Store>) {
        for (i, pool) in ["a", "a", "b"].iter().enumerate() {
            store
                .enqueue(&api_job(&format!("j{i}"), pool), at(i as i64))
                .await
                .unwrap();
        }
        store.claim(&claim("a", 1, 1), at(5)).await.unwrap();
        // Finished history is not counted.
        let done = store
            .enqueue(&api_job("done", "b"), at(6))
            .await
            .unwrap()
            .job;
        store.cancel(done.id, "finished", at(7)).await.unwrap();
        let counts: Vec<(Option<String>, JobState, u64)> = store
            .live_job_counts()
            .await
            .unwrap()
            .into_iter()
            .map(|c| (c.pool, c.state, c.count))
            .collect();
        assert_eq!(
            counts,
            [
                (Some("a".into()), JobState::Provisioning, 1),
                (Some("a".into()), JobState::Queued, 1),
                (Some("b".into()), JobState::Queued, 1),
            ]
        );
        // The queue's depth, per pool, counts queued jobs only.
        assert_eq!(store.queued_count("a").await.unwrap(), 1);
        assert_eq!(store.queued_count("b").await.unwrap(), 1);
        assert_eq!(store.queued_count("none").await.unwrap(), 0);
    }

    pub async fn enqueue_many_returns_input_order_and_dedupes(store: Arc<dyn Store>) {
        let existing = store
            .enqueue(&api_job("b", "default"), at(1))
            .await
            .unwrap();
        let batch = [
            api_job("a", "default"),
            api_job("b", "default"),
            api_job("c", "other"),
            api_job("a", "default"),
        ];
        let results = store.enqueue_many(&batch, at(10)).await.unwrap();
        let summary: Vec<(&str, bool)> = results
            .iter()
            .map(|r| (r.job.external_id.as_str(), r.created))
            .collect();
        assert_eq!(
            summary,
            [("a", true), ("b", false), ("c", true), ("a", false)]
        );
        assert_eq!(results[1].job, existing.job);
        assert_eq!(results[0].job.id, results[3].job.id);
        assert_eq!(results[2].job.pool.as_deref(), Some("other"));
        assert!(store.enqueue_many(&[], at(11)).await.unwrap().is_empty());
        let all = store.list_jobs(&JobFilter::default()).await.unwrap();
        assert_eq!(all.len(), 3);
    }

    /// With one share key the queue is first in, first out: in the order
    /// the store took the jobs in.
    pub async fn claim_takes_the_oldest_jobs_of_one_pool(store: Arc<dyn Store>) {
        store
            .enqueue(&api_job("early", "default"), at(100))
            .await
            .unwrap();
        store
            .enqueue(&api_job("other-pool", "gpu"), at(150))
            .await
            .unwrap();
        store
            .enqueue(&api_job("middle", "default"), at(200))
            .await
            .unwrap();
        store
            .enqueue(&api_job("late", "default"), at(300))
            .await
            .unwrap();
        let claimed = store
            .claim(&claim("default", 1, 2), at(1_000))
            .await
            .unwrap();
        let names: Vec<&str> = claimed.iter().map(|j| j.external_id.as_str()).collect();
        assert_eq!(names, ["early", "middle"]);
        let rest = store
            .claim(&claim("default", 2, 10), at(1_000))
            .await
            .unwrap();
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].external_id, "late");
        assert!(store
            .claim(&claim("default", 3, 10), at(1_000))
            .await
            .unwrap()
            .is_empty());
        let gpu = store.claim(&claim("gpu", 3, 10), at(1_000)).await.unwrap();
        assert_eq!(gpu[0].external_id, "other-pool");
    }

    pub async fn claim_matches_the_core_state_machine(store: Arc<dyn Store>) {
        let queued = store
            .enqueue(&api_job("j", "default"), at(10))
            .await
            .unwrap()
            .job;
        let claimed = store.claim(&claim("default", 7, 1), at(20)).await.unwrap();
        let expected = queued
            .apply(
                &JobEvent::Claim {
                    runner: RunnerId(7),
                    lease_deadline: at(20).plus(LEASE),
                },
                at(20),
            )
            .unwrap();
        assert_eq!(claimed, vec![expected.clone()]);
        assert_eq!(store.get_job(queued.id).await.unwrap(), Some(expected));
    }

    pub async fn keepalive_accept_complete_by_the_holder_only(store: Arc<dyn Store>) {
        let job = store
            .enqueue(&api_job("j", "default"), at(0))
            .await
            .unwrap()
            .job;
        store.claim(&claim("default", 1, 1), at(0)).await.unwrap();
        let intruder = store.accept(job.id, RunnerId(2), at(5)).await;
        assert!(matches!(
            intruder,
            Err(StoreError::JobTransition(
                JobTransitionError::NotHolder { .. }
            ))
        ));
        let kept = store
            .keepalive(job.id, RunnerId(1), LEASE, at(60_000))
            .await
            .unwrap();
        assert_eq!(kept.lease_deadline, Some(at(60_000).plus(LEASE)));
        let running = store.accept(job.id, RunnerId(1), at(61_000)).await.unwrap();
        assert_eq!(
            (running.state, running.started_at),
            (JobState::Running, Some(at(61_000)))
        );
        let done = store
            .complete(job.id, RunnerId(1), Conclusion::Success, at(90_000))
            .await
            .unwrap();
        assert_eq!(done.state, JobState::Completed);
        assert_eq!(done.conclusion, Some(Conclusion::Success));
        assert_eq!(done.lease_deadline, None);
        assert_eq!(store.get_job(job.id).await.unwrap(), Some(done));
    }

    /// Queue time is `started_at - enqueued_at`, of the jobs started at or
    /// after the window's start only (running or finished; a job that
    /// started before it and finished in it is not), newest first, at most
    /// `limit`.
    pub async fn queue_times_are_those_of_jobs_started_in_the_window(store: Arc<dyn Store>) {
        // Each job: enqueued, claimed and started, then finished if given.
        let jobs = [
            ("q0", 0, 1_000, Some(1_001)),
            ("q1", 0, 5_000, Some(5_001)),
            ("q2", 10_000, 40_000, Some(40_001)),
            // Started before the window, finished in it: not in the window.
            ("long", 1_000, 1_500, Some(60_000)),
            // Started in the window and still running: in it.
            ("running", 20_000, 45_000, None),
        ];
        for (name, enqueued, started, finished) in jobs {
            let job = store
                .enqueue(&api_job(name, "default"), at(enqueued))
                .await
                .unwrap()
                .job;
            store
                .claim(&claim("default", 1, 1), at(enqueued))
                .await
                .unwrap();
            store
                .accept(job.id, RunnerId(1), at(started))
                .await
                .unwrap();
            if let Some(finished) = finished {
                store
                    .complete(job.id, RunnerId(1), Conclusion::Success, at(finished))
                    .await
                    .unwrap();
            }
        }
        store
            .enqueue(&api_job("never-started", "default"), at(0))
            .await
            .unwrap();
        let secs = |n| std::time::Duration::from_secs(n);
        assert_eq!(
            store.queue_times(at(2_000), 10).await.unwrap(),
            [
                ("default".to_owned(), secs(25)),
                ("default".to_owned(), secs(30)),
                ("default".to_owned(), secs(5))
            ]
        );
        assert_eq!(
            store.queue_times(at(42_000), 10).await.unwrap(),
            [("default".to_owned(), secs(25))]
        );
        assert_eq!(store.queue_times(at(0), 1).await.unwrap().len(), 1);
        assert!(store.queue_times(at(50_000), 10).await.unwrap().is_empty());
    }

    /// Many holders accept, heartbeat and complete at once, with an
    /// intruder and a repeat beside each (on PostgreSQL these meet in one
    /// batched statement): every holder's change lands, every intruder is
    /// refused, a repeated accept is refused once the first landed, and
    /// each job ends completed exactly once.
    pub async fn concurrent_guarded_changes_each_get_their_own_answer(store: Arc<dyn Store>) {
        const JOBS: i64 = 24;
        let mut jobs = Vec::new();
        for i in 0..JOBS {
            let job = store
                .enqueue(&api_job(&format!("batch-{i}"), "default"), at(0))
                .await
                .unwrap()
                .job;
            let claimed = store
                .claim(&claim("default", 100 + i, 1), at(1))
                .await
                .unwrap();
            assert_eq!(claimed.len(), 1);
            jobs.push((claimed[0].id, RunnerId(100 + i), job.id));
        }
        let mut tasks = Vec::new();
        for &(id, holder, _) in &jobs {
            for who in [holder, RunnerId(999), holder] {
                let store = store.clone();
                tasks.push(tokio::spawn(async move {
                    (who, store.accept(id, who, at(10)).await)
                }));
            }
        }
        let mut accepted = 0;
        for task in tasks {
            let (who, result) = task.await.unwrap();
            match result {
                Ok(job) => {
                    assert_eq!((job.state, job.runner), (JobState::Running, Some(who)));
                    accepted += 1;
                }
                Err(StoreError::JobTransition(_)) => {}
                Err(other) => panic!("accept by {who}: {other}"),
            }
        }
        assert_eq!(accepted, JOBS, "one accept per job lands");
        let mut tasks = Vec::new();
        for &(id, holder, _) in &jobs {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let kept = store.keepalive(id, holder, LEASE, at(20)).await;
                let done = store
                    .complete(id, holder, Conclusion::Success, at(30))
                    .await;
                let late = store
                    .complete(id, RunnerId(999), Conclusion::Failure, at(31))
                    .await;
                (kept, done, late)
            }));
        }
        for task in tasks {
            let (kept, done, late) = task.await.unwrap();
            assert_eq!(kept.unwrap().lease_deadline, Some(at(20).plus(LEASE)));
            let done = done.unwrap();
            assert_eq!(
                (done.state, done.conclusion),
                (JobState::Completed, Some(Conclusion::Success))
            );
            assert!(late.is_err(), "a stranger cannot complete a finished job");
        }
        for (id, _, _) in jobs {
            let job = store.get_job(id).await.unwrap().unwrap();
            assert_eq!(
                (job.state, job.started_at),
                (JobState::Completed, Some(at(10)))
            );
        }
    }

    /// The one-statement accept, heartbeat and completion write exactly
    /// the row `GuardedChange::applied_to` computes (which the core's
    /// property test holds equal to the state machine), and nothing at all
    /// when the guard does not hold.
    pub async fn guarded_changes_in_sql_are_the_core_ones(store: Arc<dyn Store>) {
        let job = store
            .enqueue(&api_job("g", "default"), at(0))
            .await
            .unwrap()
            .job;
        store.claim(&claim("default", 1, 1), at(0)).await.unwrap();
        let events = [
            (
                JobEvent::Accept {
                    runner: RunnerId(1),
                },
                at(10),
            ),
            (
                JobEvent::Keepalive {
                    runner: RunnerId(1),
                    lease_deadline: at(500_000),
                },
                at(20),
            ),
            (
                JobEvent::Complete {
                    runner: RunnerId(1),
                    conclusion: Conclusion::Failure,
                },
                at(30),
            ),
        ];
        for (event, now) in events {
            let before = store.get_job(job.id).await.unwrap().unwrap();
            let change = event.guarded(now).expect("a hot-path event");
            // A stranger's change: the guard does not hold, nothing moves.
            let mut stranger = change.clone();
            stranger.runner = RunnerId(9);
            assert_eq!(store.apply_guarded(job.id, &stranger).await.unwrap(), None);
            assert_eq!(store.get_job(job.id).await.unwrap().unwrap(), before);
            let expected = change.applied_to(&before).expect("the guard holds");
            let written = store.apply_guarded(job.id, &change).await.unwrap();
            assert_eq!(written.as_ref(), Some(&expected), "{event:?}");
            assert_eq!(store.get_job(job.id).await.unwrap(), Some(expected));
        }
        // A heartbeat that would shorten the lease does not hold either.
        let shorter = JobEvent::Keepalive {
            runner: RunnerId(1),
            lease_deadline: at(1),
        };
        let done = store.get_job(job.id).await.unwrap().unwrap();
        let change = shorter.guarded(at(40)).unwrap();
        assert_eq!(store.apply_guarded(job.id, &change).await.unwrap(), None);
        assert_eq!(store.get_job(job.id).await.unwrap(), Some(done));
    }

    pub async fn decline_requeues_at_the_tail_and_excludes_the_runner(store: Arc<dyn Store>) {
        let a = store
            .enqueue(&api_job("a", "default"), at(1))
            .await
            .unwrap()
            .job;
        store
            .enqueue(&api_job("b", "default"), at(2))
            .await
            .unwrap();
        let claimed = store.claim(&claim("default", 1, 1), at(3)).await.unwrap();
        assert_eq!(claimed[0].id, a.id);
        let declined = store.decline(a.id, RunnerId(1), at(4)).await.unwrap();
        assert_eq!(
            (declined.state, declined.enqueued_at),
            (JobState::Queued, at(4))
        );
        // Runner 1 gets b and then nothing: it declined a.
        let next = store.claim(&claim("default", 1, 5), at(5)).await.unwrap();
        let names: Vec<&str> = next.iter().map(|j| j.external_id.as_str()).collect();
        assert_eq!(names, ["b"]);
        assert!(store
            .claim(&claim("default", 1, 5), at(6))
            .await
            .unwrap()
            .is_empty());
        let other = store.claim(&claim("default", 2, 5), at(7)).await.unwrap();
        assert_eq!(
            other[0].id, a.id,
            "another runner can still take the declined job"
        );
    }

    pub async fn expired_leases_requeue_then_fail_at_max_attempts(store: Arc<dyn Store>) {
        let job = NewJob {
            max_attempts: 2,
            ..api_job("j", "default")
        };
        let job = store.enqueue(&job, at(0)).await.unwrap().job;
        store.claim(&claim("default", 1, 1), at(0)).await.unwrap();
        let lease_end = at(0).plus(LEASE);
        assert!(store
            .expire_leases(at(lease_end.as_millis() - 1))
            .await
            .unwrap()
            .is_empty());
        // Silent while provisioning: requeued as if runner 1 declined it
        // (excluded, no attempt counted), and nobody crashed.
        let requeued = store.expire_leases(lease_end).await.unwrap();
        assert_eq!(requeued.len(), 1);
        assert_eq!(
            (
                requeued[0].job.state,
                requeued[0].job.attempts,
                requeued[0].job.enqueued_at,
                requeued[0].runner_crashed
            ),
            (JobState::Queued, 0, lease_end, false)
        );
        assert!(requeued[0].job.excluded_runners.contains(&RunnerId(1)));
        assert!(store
            .claim(&claim("default", 1, 1), at(100_000))
            .await
            .unwrap()
            .is_empty());
        // Silent once running: an attempt each, failed at max_attempts.
        for (runner, from) in [(2, 200_000), (3, 10_000_000)] {
            let claimed = store
                .claim(&claim("default", runner, 1), at(from))
                .await
                .unwrap();
            assert_eq!(claimed[0].id, job.id);
            store
                .accept(job.id, RunnerId(runner), at(from + 1))
                .await
                .unwrap();
            let expired = store.expire_leases(at(from + 1_000_000)).await.unwrap();
            assert_eq!(expired.len(), 1);
        }
        let failed = store.get_job(job.id).await.unwrap().unwrap();
        assert_eq!((failed.state, failed.attempts), (JobState::Failed, 2));
        assert!(failed
            .reason
            .as_deref()
            .unwrap_or("")
            .contains("max_attempts = 2"));
        assert!(store
            .expire_leases(at(20_000_000))
            .await
            .unwrap()
            .is_empty());
    }

    pub async fn extended_leases_do_not_expire(store: Arc<dyn Store>) {
        let job = store
            .enqueue(&api_job("j", "default"), at(0))
            .await
            .unwrap()
            .job;
        store.claim(&claim("default", 1, 1), at(0)).await.unwrap();
        store
            .keepalive(job.id, RunnerId(1), LEASE, at(100_000))
            .await
            .unwrap();
        assert!(store.expire_leases(at(130_000)).await.unwrap().is_empty());
        let stored = store.get_job(job.id).await.unwrap().unwrap();
        assert_eq!(stored.state, JobState::Provisioning);
    }

    /// Stopped runners (issue 60): the stock mark and the stop time are
    /// stored and read back, a stopped runner is live, and a start clears
    /// the mark, all through the core state machine.
    pub async fn a_stock_runner_keeps_its_mark_and_stop_time_until_started(store: Arc<dyn Store>) {
        let stock = store
            .create_runner(
                &NewRunner {
                    name: "default-stock-1".into(),
                    pool: "default".into(),
                    provider: "sim".into(),
                    labels: vec!["linux".into()],
                    stock: true,
                },
                at(0),
            )
            .await
            .unwrap();
        assert!(stock.stock);
        let mut runner = stock.clone();
        for (event, when) in [
            (
                RunnerEvent::ProvisioningStarted {
                    instance_id: "i-1".into(),
                },
                1,
            ),
            (RunnerEvent::StopRequested, 150),
            (RunnerEvent::Stopped, 160),
        ] {
            runner = store
                .apply_runner_event(runner.id, &event, at(when))
                .await
                .unwrap();
        }
        let read = store.get_runner(stock.id).await.unwrap().unwrap();
        assert_eq!(read, runner);
        assert_eq!(
            (read.state, read.stock, read.stopped_at),
            (RunnerState::Stopped, true, Some(at(160)))
        );
        let live = store.list_live_runners(Some("default")).await.unwrap();
        assert!(
            live.iter().any(|r| r.id == stock.id),
            "a stopped runner is live"
        );
        // A stock runner takes no job, in the store as in the core.
        assert!(store
            .apply_runner_event(
                stock.id,
                &RunnerEvent::JobAssigned {
                    job: runway_core::JobId(1)
                },
                at(170)
            )
            .await
            .is_err());
        let started = store
            .apply_runner_event(stock.id, &RunnerEvent::StartRequested, at(3_600))
            .await
            .unwrap();
        assert_eq!(
            store.get_runner(stock.id).await.unwrap().as_ref(),
            Some(&started)
        );
        assert_eq!(
            (started.state, started.stock, started.requested_at),
            (RunnerState::Provisioning, false, at(3_600))
        );
    }

    pub async fn cancel_is_terminal(store: Arc<dyn Store>) {
        let job = store
            .enqueue(&api_job("j", "default"), at(0))
            .await
            .unwrap()
            .job;
        let cancelled = store.cancel(job.id, "user asked", at(1)).await.unwrap();
        assert_eq!(cancelled.state, JobState::Cancelled);
        assert!(store
            .claim(&claim("default", 1, 1), at(2))
            .await
            .unwrap()
            .is_empty());
        assert!(matches!(
            store.cancel(job.id, "again", at(3)).await,
            Err(StoreError::JobTransition(
                JobTransitionError::Terminal { .. }
            ))
        ));
        assert!(matches!(
            store
                .cancel(runway_core::JobId(9_999), "missing", at(3))
                .await,
            Err(StoreError::JobNotFound(_))
        ));
    }

    pub async fn unroutable_jobs_are_stored_and_never_claimed(store: Arc<dyn Store>) {
        let job = NewJob {
            route: Route::Unroutable {
                reason: "no pool serves [gpu, huge]".into(),
            },
            ..api_job("u", "ignored")
        };
        let stored = store.enqueue(&job, at(5)).await.unwrap().job;
        assert_eq!(stored.state, JobState::Unroutable);
        assert_eq!(stored.pool, None);
        assert_eq!(stored.reason.as_deref(), Some("no pool serves [gpu, huge]"));
        assert!(stored.invariant_violations().is_empty());
        let unroutable = store
            .list_jobs(&JobFilter {
                state: Some(JobState::Unroutable),
                ..JobFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(unroutable, vec![stored]);
    }

    pub async fn list_jobs_filters_by_state_and_pool(store: Arc<dyn Store>) {
        for (i, pool) in ["a", "b", "a", "a"].iter().enumerate() {
            store
                .enqueue(&api_job(&format!("j{i}"), pool), at(i as i64))
                .await
                .unwrap();
        }
        store.claim(&claim("a", 1, 1), at(10)).await.unwrap();
        let queued_a = store
            .list_jobs(&JobFilter {
                state: Some(JobState::Queued),
                pool: Some("a".into()),
                ..JobFilter::default()
            })
            .await
            .unwrap();
        let names: Vec<&str> = queued_a.iter().map(|j| j.external_id.as_str()).collect();
        assert_eq!(names, ["j2", "j3"]);
        let first_two = store
            .list_jobs(&JobFilter {
                limit: Some(2),
                ..JobFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(first_two.len(), 2);
        // A window of ids, newest first: what came after one listing.
        let all = store
            .list_jobs(&JobFilter {
                newest_first: true,
                ..JobFilter::default()
            })
            .await
            .unwrap();
        let between = store
            .list_jobs(&JobFilter {
                newest_first: true,
                after: Some(all[3].id),
                before: Some(all[0].id),
                ..JobFilter::default()
            })
            .await
            .unwrap();
        let names: Vec<&str> = between.iter().map(|j| j.external_id.as_str()).collect();
        assert_eq!(names, ["j2", "j1"]);
    }

    /// `replace_job_and_runner` writes both rows only if both versions
    /// hold; `move_job_and_runner` applies core's decisions to both, and a
    /// refusal for the runner leaves the job untouched too.
    pub async fn a_job_and_its_runner_move_together_or_not_at_all(store: Arc<dyn Store>) {
        let (runner, claimed) = runner_with_a_claimed_job(&store, "default-move", "move").await;
        let (job, claimed) = (claimed.id, &claimed);
        // A stale runner version: neither row changes.
        let accepted = claimed
            .apply(&JobEvent::Accept { runner: runner.id }, at(5))
            .unwrap();
        let busy = runner
            .apply(&RunnerEvent::JobAssigned { job }, at(5))
            .unwrap();
        let mut stale = runner.clone();
        stale.version -= 1;
        assert!(!store
            .replace_job_and_runner((claimed, &accepted), Some((&stale, &busy)))
            .await
            .unwrap());
        assert_eq!(store.get_job(job).await.unwrap().unwrap(), *claimed);
        assert_eq!(store.get_runner(runner.id).await.unwrap().unwrap(), runner);
        // A stale job version: neither row changes either.
        let mut stale_job = claimed.clone();
        stale_job.version -= 1;
        assert!(!store
            .replace_job_and_runner((&stale_job, &accepted), Some((&runner, &busy)))
            .await
            .unwrap());
        assert_eq!(store.get_runner(runner.id).await.unwrap().unwrap(), runner);
        // Both current: both written.
        assert!(store
            .replace_job_and_runner((claimed, &accepted), Some((&runner, &busy)))
            .await
            .unwrap());
        assert_eq!(store.get_job(job).await.unwrap().unwrap(), accepted);
        assert_eq!(store.get_runner(runner.id).await.unwrap().unwrap(), busy);

        // Completion frees the runner in the same move.
        let finish = |_: &runway_core::Job,
                      after: &runway_core::Job,
                      current: &runway_core::Runner,
                      now: runway_core::Timestamp| {
            Ok(runway_core::moves::finish(after, current, false, now))
        };
        let complete = JobEvent::Complete {
            runner: runner.id,
            conclusion: Conclusion::Success,
        };
        let moved = store
            .move_job_and_runner(job, &complete, Some(runner.id), &finish, at(6))
            .await
            .unwrap();
        assert_eq!(moved.job.state, JobState::Completed);
        let free = moved.runner.unwrap();
        assert_eq!((free.state, free.job), (RunnerState::Idle, None));
        assert_eq!(store.get_runner(runner.id).await.unwrap().unwrap(), free);

        // A runner that refuses (terminating) refuses the whole move.
        let second = store
            .enqueue(&api_job("move-2", "default"), at(7))
            .await
            .unwrap()
            .job;
        store
            .claim(&claim("default", runner.id.0, 1), at(8))
            .await
            .unwrap();
        let stopping = store
            .apply_runner_event(runner.id, &RunnerEvent::TerminateRequested, at(9))
            .await
            .unwrap();
        let start = |_: &runway_core::Job,
                     after: &runway_core::Job,
                     current: &runway_core::Runner,
                     now: runway_core::Timestamp| {
            runway_core::moves::start(after, current, now)
                .map(Some)
                .map_err(StoreError::from)
        };
        let refused = store
            .move_job_and_runner(
                second.id,
                &JobEvent::Accept { runner: runner.id },
                Some(runner.id),
                &start,
                at(10),
            )
            .await;
        assert!(
            matches!(refused, Err(StoreError::RunnerTransition(_))),
            "{refused:?}"
        );
        assert_eq!(
            store.get_job(second.id).await.unwrap().unwrap().state,
            JobState::Provisioning
        );
        assert_eq!(
            store.get_runner(runner.id).await.unwrap().unwrap(),
            stopping
        );
    }

    pub async fn runners_move_through_their_states_with_timestamps(store: Arc<dyn Store>) {
        let new = NewRunner {
            name: "default-0001".into(),
            pool: "default".into(),
            provider: "sim".into(),
            labels: vec!["self-hosted".into()],
            stock: false,
        };
        let runner = store.create_runner(&new, at(100)).await.unwrap();
        assert_eq!(
            (runner.state, runner.requested_at),
            (RunnerState::Requested, at(100))
        );
        let id = runner.id;
        let started = RunnerEvent::ProvisioningStarted {
            instance_id: "i-abc".into(),
        };
        store
            .apply_runner_event(id, &started, at(200))
            .await
            .unwrap();
        store
            .apply_runner_event(id, &RunnerEvent::Ready, at(300))
            .await
            .unwrap();
        let job = store
            .enqueue(&api_job("j", "default"), at(300))
            .await
            .unwrap()
            .job;
        let busy = store
            .apply_runner_event(id, &RunnerEvent::JobAssigned { job: job.id }, at(400))
            .await
            .unwrap();
        assert_eq!((busy.state, busy.job), (RunnerState::Busy, Some(job.id)));
        assert!(matches!(
            store
                .apply_runner_event(id, &RunnerEvent::TerminateRequested, at(450))
                .await,
            Err(StoreError::RunnerTransition(
                RunnerTransitionError::Busy { .. }
            ))
        ));
        store
            .apply_runner_event(id, &RunnerEvent::JobFinished, at(500))
            .await
            .unwrap();
        store
            .apply_runner_event(id, &RunnerEvent::TerminateRequested, at(600))
            .await
            .unwrap();
        let gone = store
            .apply_runner_event(id, &RunnerEvent::Terminated, at(700))
            .await
            .unwrap();
        let stored = store.get_runner(id).await.unwrap().unwrap();
        assert_eq!(stored, gone);
        assert_eq!(stored.instance_id.as_deref(), Some("i-abc"));
        assert_eq!(
            (
                stored.provisioning_at,
                stored.idle_at,
                stored.busy_at,
                stored.terminating_at,
                stored.ended_at
            ),
            (
                Some(at(200)),
                Some(at(500)),
                Some(at(400)),
                Some(at(600)),
                Some(at(700))
            )
        );
        assert_eq!(
            store.find_runner("default-0001").await.unwrap(),
            Some(stored)
        );
        let terminated = store
            .list_runners(&RunnerFilter {
                state: Some(RunnerState::Terminated),
                pool: Some("default".into()),
            })
            .await
            .unwrap();
        assert_eq!(terminated.len(), 1);
    }

    pub async fn live_runners_are_the_non_terminal_ones(store: Arc<dyn Store>) {
        let mut ids = Vec::new();
        let runners = [
            ("a", "p", "sim"),
            ("b", "p", "sim"),
            ("c", "q", "sim"),
            ("d", "p", "other"),
        ];
        for (name, pool, provider) in runners {
            let new = NewRunner {
                name: name.into(),
                pool: pool.into(),
                provider: provider.into(),
                labels: vec![],
                stock: false,
            };
            ids.push(store.create_runner(&new, at(0)).await.unwrap().id);
        }
        let failed = RunnerEvent::Failed {
            reason: "boot timeout".into(),
        };
        store
            .apply_runner_event(ids[1], &failed, at(1))
            .await
            .unwrap();
        let names = |runners: Vec<runway_core::Runner>| {
            runners.into_iter().map(|r| r.name).collect::<Vec<_>>()
        };
        assert_eq!(
            names(store.list_live_runners(None).await.unwrap()),
            ["a", "c", "d"]
        );
        assert_eq!(
            names(store.list_live_runners(Some("p")).await.unwrap()),
            ["a", "d"]
        );
        // The gauges' counts agree with the list, by pool and provider:
        // the failed runner is not counted.
        let state = store.get_runner(ids[0]).await.unwrap().unwrap().state;
        let counts: Vec<(String, String, RunnerState, u64)> = store
            .live_runner_counts()
            .await
            .unwrap()
            .into_iter()
            .map(|c| (c.pool, c.provider, c.state, c.count))
            .collect();
        let count = |pool: &str, provider: &str| (pool.into(), provider.into(), state, 1);
        assert_eq!(
            counts,
            [count("p", "other"), count("p", "sim"), count("q", "sim")]
        );
        assert_eq!(
            store
                .list_runners(&RunnerFilter::default())
                .await
                .unwrap()
                .len(),
            4,
            "the history is still there"
        );
    }

    pub async fn runner_names_are_unique(store: Arc<dyn Store>) {
        let new = NewRunner {
            name: "r-1".into(),
            pool: "default".into(),
            provider: "sim".into(),
            labels: vec![],
            stock: false,
        };
        store.create_runner(&new, at(0)).await.unwrap();
        assert!(matches!(
            store.create_runner(&new, at(1)).await,
            Err(StoreError::DuplicateRunnerName(name)) if name == "r-1"
        ));
    }

    async fn ready_runner(store: &Arc<dyn Store>, name: &str, pool: &str) -> runway_core::Runner {
        let new = NewRunner {
            name: name.into(),
            pool: pool.into(),
            provider: "sim".into(),
            labels: vec![],
            stock: false,
        };
        let runner = store.create_runner(&new, at(1)).await.unwrap();
        store
            .apply_runner_event(runner.id, &RunnerEvent::Ready, at(2))
            .await
            .unwrap()
    }

    /// A ready runner of pool `default` and the job `external_id`, enqueued
    /// at 3 and claimed by it at 4.
    async fn runner_with_a_claimed_job(
        store: &Arc<dyn Store>,
        name: &str,
        external_id: &str,
    ) -> (runway_core::Runner, runway_core::Job) {
        let runner = ready_runner(store, name, "default").await;
        store
            .enqueue(&api_job(external_id, "default"), at(3))
            .await
            .unwrap();
        let mut claimed = store
            .claim(&claim("default", runner.id.0, 1), at(4))
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1, "one job claimed");
        (runner, claimed.remove(0))
    }

    pub async fn a_claim_that_starts_is_a_claim_and_an_accept_in_one_write(store: Arc<dyn Store>) {
        use runway_store::ClaimStart;
        let runner = ready_runner(&store, "one-step", "default").await;
        let at_once = |runner: &runway_core::Runner| Claim {
            runner: runner.id,
            ..claim("default", runner.id.0, 1)
        };
        // Nothing queued: nothing changes.
        assert_eq!(
            store
                .claim_and_start(&at_once(&runner), &runner, at(3))
                .await
                .unwrap(),
            ClaimStart::NoJob
        );
        assert_eq!(store.get_runner(runner.id).await.unwrap().unwrap(), runner);
        // Nothing queued and a stale view of the runner: the fresh row, not
        // "no job" (a drained runner's long poll must learn of it).
        let mut stale = runner.clone();
        stale.version -= 1;
        assert_eq!(
            store
                .claim_and_start(&at_once(&runner), &stale, at(3))
                .await
                .unwrap(),
            ClaimStart::RunnerChanged(Box::new(runner.clone()))
        );
        // A runner the store does not have.
        let mut unknown = runner.clone();
        unknown.id = runway_core::RunnerId(runner.id.0 + 1_000_000);
        let missing = store
            .claim_and_start(&at_once(&unknown), &unknown, at(3))
            .await;
        assert!(
            matches!(missing, Err(StoreError::RunnerNotFound(id)) if id == unknown.id),
            "{missing:?}"
        );

        let queued = store
            .enqueue(&api_job("first", "default"), at(4))
            .await
            .unwrap()
            .job;
        store
            .enqueue(&api_job("second", "default"), at(5))
            .await
            .unwrap();
        // The stale view with jobs queued: nothing is written, the fresh
        // row comes back to decide on.
        assert_eq!(
            store
                .claim_and_start(&at_once(&runner), &stale, at(6))
                .await
                .unwrap(),
            ClaimStart::RunnerChanged(Box::new(runner.clone()))
        );
        assert_eq!(store.get_job(queued.id).await.unwrap().unwrap(), queued);

        // The oldest job starts: exactly what a claim and an accept make
        // of it, and the runner what a start makes of it.
        let ClaimStart::Started(moved) = store
            .claim_and_start(&at_once(&runner), &runner, at(7))
            .await
            .unwrap()
        else {
            panic!("a job starts");
        };
        let claimed = queued
            .apply(
                &JobEvent::Claim {
                    runner: runner.id,
                    lease_deadline: at(7).plus(LEASE),
                },
                at(7),
            )
            .unwrap();
        let expected = claimed
            .apply(&JobEvent::Accept { runner: runner.id }, at(7))
            .unwrap();
        assert_eq!(moved.job, expected);
        let busy = runway_core::moves::start(&expected, &runner, at(7)).unwrap();
        assert_eq!(moved.runner.as_ref(), Some(&busy));
        assert_eq!(store.get_job(queued.id).await.unwrap(), Some(expected));
        assert_eq!(
            store.get_runner(runner.id).await.unwrap(),
            Some(busy.clone())
        );
        let steps: Vec<JobState> = store
            .job_history(queued.id)
            .await
            .unwrap()
            .unwrap()
            .iter()
            .map(|step| step.state)
            .collect();
        assert_eq!(
            steps,
            [JobState::Queued, JobState::Provisioning, JobState::Running]
        );

        // A busy runner cannot start another job: refused, nothing written.
        let refused = store.claim_and_start(&at_once(&busy), &busy, at(8)).await;
        assert!(
            matches!(refused, Err(StoreError::RunnerTransition(_))),
            "{refused:?}"
        );
        // A draining runner neither.
        let drained = ready_runner(&store, "one-step-drained", "default").await;
        let drained = store
            .apply_runner_event(drained.id, &RunnerEvent::DrainRequested, at(8))
            .await
            .unwrap();
        assert!(store
            .claim_and_start(&at_once(&drained), &drained, at(9))
            .await
            .is_err());
        let queued_now = store
            .list_jobs(&JobFilter {
                state: Some(JobState::Queued),
                ..JobFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(queued_now.len(), 1, "the second job is still queued");

        // It completes through the general path like any running job.
        let done = store
            .complete(queued.id, runner.id, Conclusion::Success, at(10))
            .await
            .unwrap();
        assert_eq!(done.state, JobState::Completed);
    }

    pub async fn concurrent_claims_that_start_never_share_a_job_or_a_runner(store: Arc<dyn Store>) {
        use runway_store::ClaimStart;
        race(&store, "race", |store, mut runner, step| async move {
            let mut ran = Vec::new();
            for round in 0..RACE_JOBS as i64 {
                let now = at(1_000 + round);
                match store.claim_and_start(&step, &runner, now).await.unwrap() {
                    ClaimStart::Started(moved) => {
                        let busy = moved.runner.unwrap();
                        assert_eq!(busy.job, Some(moved.job.id));
                        let change = complete_change(&runner, now);
                        let free =
                            runway_core::moves::finish(&moved.job, &busy, false, now).unwrap();
                        let done = store
                            .apply_guarded_with_runner(
                                moved.job.id,
                                &change,
                                (&busy, &free),
                                Some((Some(0), "ok")),
                            )
                            .await
                            .unwrap()
                            .expect("the holder completes its job");
                        assert_eq!(done.job.state, JobState::Completed);
                        ran.push(moved.job.id);
                        runner = free;
                    }
                    ClaimStart::NoJob => break,
                    ClaimStart::RunnerChanged(fresh) => panic!("nobody else moves {fresh:?}"),
                }
            }
            ran
        })
        .await;
    }

    /// How many runners [`race`] sets to work, and on how many jobs.
    const RACE_RUNNERS: usize = 8;
    const RACE_JOBS: usize = 40;

    /// `RACE_RUNNERS` runners of `pool`, each in a task of its own, working
    /// through `RACE_JOBS` queued jobs as `work` does (given the store, the
    /// runner and its claim of one job, it returns the jobs it ran); then
    /// each job ran once, with its log.
    async fn race<F, Fut>(store: &Arc<dyn Store>, pool: &str, work: F)
    where
        F: Fn(Arc<dyn Store>, runway_core::Runner, Claim) -> Fut,
        Fut: std::future::Future<Output = Vec<runway_core::JobId>> + Send + 'static,
    {
        for i in 0..RACE_JOBS {
            store
                .enqueue(&api_job(&format!("{pool}-{i}"), pool), at(i as i64))
                .await
                .unwrap();
        }
        let mut tasks = Vec::new();
        for r in 0..RACE_RUNNERS {
            let runner = ready_runner(store, &format!("{pool}-{r}"), pool).await;
            let step = Claim {
                runner: runner.id,
                ..claim(pool, runner.id.0, 1)
            };
            tasks.push(tokio::spawn(work(store.clone(), runner, step)));
        }
        each_ran_once_with_its_log(store, tasks, RACE_JOBS).await;
    }

    /// The jobs each runner task ran: `jobs` in all, none twice, each with
    /// its log (exit 0, "ok").
    async fn each_ran_once_with_its_log(
        store: &Arc<dyn Store>,
        tasks: Vec<tokio::task::JoinHandle<Vec<runway_core::JobId>>>,
        jobs: usize,
    ) {
        let mut all = Vec::new();
        for task in tasks {
            all.extend(task.await.unwrap());
        }
        let count = all.len();
        all.sort();
        all.dedup();
        assert_eq!((count, all.len()), (jobs, jobs), "each job ran once");
        for id in all {
            let (exit, log) = store.get_job_log(id).await.unwrap().unwrap();
            assert_eq!((exit, log.as_str()), (Some(0), "ok"));
        }
    }

    /// An API job of `pool` enqueued at `when`, as stored.
    async fn queued(store: &Arc<dyn Store>, id: &str, when: i64) -> runway_core::Job {
        store
            .enqueue(&api_job(id, "default"), at(when))
            .await
            .unwrap()
            .job
    }

    /// The job `claim_and_start` starts on `runner` at `when`, and the runner busy with it.
    async fn start_one(
        store: &Arc<dyn Store>,
        claim: &Claim,
        runner: &runway_core::Runner,
        when: i64,
    ) -> (runway_core::Job, runway_core::Runner) {
        match store
            .claim_and_start(claim, runner, at(when))
            .await
            .unwrap()
        {
            runway_store::ClaimStart::Started(moved) => (moved.job, moved.runner.unwrap()),
            other => panic!("a job starts: {other:?}"),
        }
    }

    /// A completion and its runner's next start, as core decides each.
    fn complete_change(
        runner: &runway_core::Runner,
        now: runway_core::Timestamp,
    ) -> runway_core::GuardedChange {
        JobEvent::Complete {
            runner: runner.id,
            conclusion: Conclusion::Success,
        }
        .guarded(now)
        .unwrap()
    }

    /// The job a completion starts next is one the runner's labels cover
    /// (case-insensitively) and that it did not decline, as a claim's.
    pub async fn a_completion_starts_only_a_next_job_the_runner_can_take(store: Arc<dyn Store>) {
        let runner = ready_runner(&store, "picky", "default").await;
        let at_once = Claim {
            runner: runner.id,
            runner_labels: Some(vec!["self-hosted".into(), "Linux".into()]),
            max_running_per_key: None,
            ..claim("default", runner.id.0, 1)
        };
        let labelled = |id: &str, labels: &[&str]| NewJob {
            labels: labels.iter().map(|l| (*l).to_owned()).collect(),
            ..api_job(id, "default")
        };
        queued(&store, "first", 3).await;
        let (one, busy) = start_one(&store, &at_once, &runner, 4).await;
        let gpu = labelled("gpu", &["self-hosted", "gpu"]);
        store.enqueue(&gpu, at(5)).await.unwrap();
        let declined = store
            .enqueue(&labelled("declined", &["linux"]), at(6))
            .await
            .unwrap()
            .job;
        let mut excluded = declined.clone();
        excluded.excluded_runners.insert(runner.id);
        excluded.version += 1;
        assert!(store.replace_job(&declined, &excluded).await.unwrap());
        let linux = store
            .enqueue(&labelled("linux", &["SELF-HOSTED", "LINUX"]), at(7))
            .await
            .unwrap()
            .job;
        let change = complete_change(&runner, at(8));
        let free = runway_core::moves::finish(&one, &busy, false, at(8)).unwrap();
        let (_, next) = store
            .complete_and_start_next(one.id, &change, (&busy, &free), None, &at_once, at(8))
            .await
            .unwrap()
            .expect("the holder completes");
        assert_eq!(next.map(|job| job.id), Some(linux.id));
    }

    pub async fn a_completion_can_start_the_runners_next_job_in_the_same_write(
        store: Arc<dyn Store>,
    ) {
        let runner = ready_runner(&store, "chain", "default").await;
        let at_once = Claim {
            runner: runner.id,
            ..claim("default", runner.id.0, 1)
        };
        let first = queued(&store, "one", 3).await;
        let second = queued(&store, "two", 4).await;
        let (one, busy) = start_one(&store, &at_once, &runner, 5).await;
        assert_eq!(one.id, first.id);
        let change = complete_change(&runner, at(6));
        let free = runway_core::moves::finish(&one, &busy, false, at(6)).unwrap();

        // A stale view of the runner: nothing is written, nothing starts.
        let mut stale = busy.clone();
        stale.version -= 1;
        let none = store
            .complete_and_start_next(
                one.id,
                &change,
                (&stale, &free),
                Some((Some(0), "x")),
                &at_once,
                at(6),
            )
            .await
            .unwrap();
        assert!(none.is_none(), "{none:?}");
        assert_eq!(store.get_job(one.id).await.unwrap().unwrap(), one);
        assert_eq!(store.get_runner(runner.id).await.unwrap().unwrap(), busy);
        assert_eq!(store.get_job(second.id).await.unwrap().unwrap(), second);
        assert_eq!(store.get_job_log(one.id).await.unwrap(), None);

        // The job ends as core ends it, its log is stored, and the oldest
        // queued job starts as a claim and an accept start it, on the
        // runner as core frees and then starts it.
        let (ended, next) = store
            .complete_and_start_next(
                one.id,
                &change,
                (&busy, &free),
                Some((Some(0), "one done")),
                &at_once,
                at(6),
            )
            .await
            .unwrap()
            .expect("the holder completes");
        let expected_end = one
            .apply(
                &JobEvent::Complete {
                    runner: runner.id,
                    conclusion: Conclusion::Success,
                },
                at(6),
            )
            .unwrap();
        assert_eq!(ended.job, expected_end);
        assert_eq!(store.get_job(one.id).await.unwrap(), Some(expected_end));
        assert_eq!(
            store.get_job_log(one.id).await.unwrap(),
            Some((Some(0), "one done".to_owned()))
        );
        let expected_next = second
            .apply(
                &JobEvent::Claim {
                    runner: runner.id,
                    lease_deadline: at(6).plus(LEASE),
                },
                at(6),
            )
            .unwrap()
            .apply(&JobEvent::Accept { runner: runner.id }, at(6))
            .unwrap();
        assert_eq!(next.as_ref(), Some(&expected_next));
        assert_eq!(
            store.get_job(second.id).await.unwrap().as_ref(),
            Some(&expected_next)
        );
        let busy_again = runway_core::moves::start(&expected_next, &free, at(6)).unwrap();
        assert_eq!(ended.runner.as_ref(), Some(&busy_again));
        assert_eq!(
            store.get_runner(runner.id).await.unwrap().as_ref(),
            Some(&busy_again)
        );
        let steps: Vec<JobState> = store
            .job_history(second.id)
            .await
            .unwrap()
            .unwrap()
            .iter()
            .map(|step| step.state)
            .collect();
        assert_eq!(
            steps,
            [JobState::Queued, JobState::Provisioning, JobState::Running]
        );

        // Nothing queued: the job ends and the runner is free.
        let change = complete_change(&runner, at(7));
        let free_again =
            runway_core::moves::finish(&expected_next, &busy_again, false, at(7)).unwrap();
        let (ended, next) = store
            .complete_and_start_next(
                second.id,
                &change,
                (&busy_again, &free_again),
                None,
                &at_once,
                at(7),
            )
            .await
            .unwrap()
            .expect("the holder completes");
        assert_eq!((ended.job.state, next), (JobState::Completed, None));
        assert_eq!(ended.runner.as_ref(), Some(&free_again));
        assert_eq!(
            store.get_runner(runner.id).await.unwrap(),
            Some(free_again.clone())
        );

        // A runner that stops after its job (ephemeral) starts nothing.
        let third = queued(&store, "three", 8).await;
        let waiting = queued(&store, "four", 9).await;
        let (started, busy) = start_one(&store, &at_once, &free_again, 10).await;
        assert_eq!(started.id, third.id);
        let stopping = runway_core::moves::finish(&started, &busy, true, at(11)).unwrap();
        let (ended, next) = store
            .complete_and_start_next(
                third.id,
                &complete_change(&runner, at(11)),
                (&busy, &stopping),
                None,
                &at_once,
                at(11),
            )
            .await
            .unwrap()
            .expect("the holder completes");
        assert_eq!((ended.job.state, next), (JobState::Completed, None));
        assert_eq!(store.get_runner(runner.id).await.unwrap(), Some(stopping));
        assert_eq!(store.get_job(waiting.id).await.unwrap().unwrap(), waiting);
    }

    pub async fn runners_working_through_a_queue_one_write_a_job_never_share_a_job(
        store: Arc<dyn Store>,
    ) {
        use runway_store::ClaimStart;
        race(&store, "chain", |store, runner, step| async move {
            let mut ran = Vec::new();
            let (mut job, mut busy) = match store
                .claim_and_start(&step, &runner, at(1_000))
                .await
                .unwrap()
            {
                ClaimStart::Started(moved) => (moved.job, moved.runner.unwrap()),
                ClaimStart::NoJob => return ran,
                ClaimStart::RunnerChanged(fresh) => panic!("nobody else moves {fresh:?}"),
            };
            for round in 0..RACE_JOBS as i64 {
                let now = at(1_001 + round);
                let free = runway_core::moves::finish(&job, &busy, false, now).unwrap();
                let (ended, next) = store
                    .complete_and_start_next(
                        job.id,
                        &complete_change(&busy, now),
                        (&busy, &free),
                        Some((Some(0), "ok")),
                        &step,
                        now,
                    )
                    .await
                    .unwrap()
                    .expect("the holder completes its job");
                assert_eq!(ended.job.state, JobState::Completed);
                ran.push(job.id);
                let runner_now = ended.runner.unwrap();
                match next {
                    Some(next) => {
                        assert_eq!(runner_now.job, Some(next.id));
                        assert_eq!(next.state, JobState::Running);
                        (job, busy) = (next, runner_now);
                    }
                    None => {
                        assert_eq!(runner_now, free);
                        break;
                    }
                }
            }
            ran
        })
        .await;
        let busy = store
            .list_runners(&runway_store::RunnerFilter::default())
            .await
            .unwrap()
            .into_iter()
            .filter(|runner| runner.job.is_some())
            .count();
        assert_eq!(busy, 0, "every runner is free at the end");
    }

    pub async fn a_guarded_change_with_its_runner_writes_all_or_nothing(store: Arc<dyn Store>) {
        let (runner, claimed) = runner_with_a_claimed_job(&store, "pair", "pair").await;
        let (job, claimed) = (claimed.id, &claimed);
        let accept = JobEvent::Accept { runner: runner.id };
        let change = accept.guarded(at(5)).unwrap();
        let busy = runway_core::moves::start(claimed, &runner, at(5)).unwrap();
        // A stale runner version: neither row changes, no log is written.
        let mut stale = runner.clone();
        stale.version -= 1;
        let none = store
            .apply_guarded_with_runner(job, &change, (&stale, &busy), Some((Some(1), "x")))
            .await
            .unwrap();
        assert_eq!(none, None);
        assert_eq!(store.get_job(job).await.unwrap().unwrap(), *claimed);
        assert_eq!(store.get_runner(runner.id).await.unwrap().unwrap(), runner);
        assert_eq!(store.get_job_log(job).await.unwrap(), None);
        // Another runner's change: the job's guard fails, nothing changes.
        let other = ready_runner(&store, "pair-other", "default").await;
        let other_change = JobEvent::Accept { runner: other.id }
            .guarded(at(5))
            .unwrap();
        let other_busy = runway_core::moves::start(claimed, &other, at(5)).unwrap();
        assert_eq!(
            store
                .apply_guarded_with_runner(job, &other_change, (&other, &other_busy), None)
                .await
                .unwrap(),
            None
        );
        assert_eq!(store.get_runner(other.id).await.unwrap().unwrap(), other);
        // Both hold: both written, as the state machines say.
        let moved = store
            .apply_guarded_with_runner(job, &change, (&runner, &busy), None)
            .await
            .unwrap()
            .unwrap();
        let expected = claimed.apply(&accept, at(5)).unwrap();
        assert_eq!(moved.job, expected);
        assert_eq!(store.get_job(job).await.unwrap().unwrap(), expected);
        assert_eq!(store.get_runner(runner.id).await.unwrap().unwrap(), busy);
        // Completion with its log: the job, the runner and the log at once.
        let complete = JobEvent::Complete {
            runner: runner.id,
            conclusion: Conclusion::Failure,
        };
        let change = complete.guarded(at(9)).unwrap();
        let stopping = runway_core::moves::finish(&expected, &busy, true, at(9)).unwrap();
        let done = store
            .apply_guarded_with_runner(job, &change, (&busy, &stopping), Some((Some(2), "boom")))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(done.job, expected.apply(&complete, at(9)).unwrap());
        assert_eq!(
            store.get_runner(runner.id).await.unwrap().unwrap().state,
            RunnerState::Terminating
        );
        assert_eq!(
            store.get_job_log(job).await.unwrap(),
            Some((Some(2), "boom".to_owned()))
        );
        // A repeat finds the guard failed and writes nothing.
        assert_eq!(
            store
                .apply_guarded_with_runner(
                    job,
                    &change,
                    (&stopping, &stopping),
                    Some((Some(3), "again"))
                )
                .await
                .unwrap(),
            None
        );
        assert_eq!(
            store.get_job_log(job).await.unwrap(),
            Some((Some(2), "boom".to_owned()))
        );
    }

    fn keyed(id: &str, key: &str, weight: f64) -> NewJob {
        NewJob {
            share: runway_core::share::Share::new(
                key,
                runway_core::share::Weight::from_f64(weight).unwrap(),
            ),
            ..api_job(id, "default")
        }
    }

    async fn claim_one(store: &Arc<dyn Store>, runner: i64, cap: Option<u32>) -> Option<String> {
        let claim = Claim {
            max_running_per_key: cap,
            ..claim("default", runner, 1)
        };
        let jobs = store.claim(&claim, at(1_000 + runner)).await.unwrap();
        jobs.first().map(|job| job.share.key.clone())
    }

    /// Key `a` queues 60 jobs at once (one batch), 4 are handed out, then
    /// key `b` queues one: `b`'s job is among the next two hand-outs, not
    /// behind the other 56; and with one key the order stays arrival order.
    pub async fn the_queue_is_served_by_fair_share_across_keys(store: Arc<dyn Store>) {
        let batch: Vec<NewJob> = (0..60).map(|i| keyed(&format!("a{i}"), "a", 1.0)).collect();
        let stored = store.enqueue_many(&batch, at(10)).await.unwrap();
        assert_eq!(stored[1].job.share.key, "a");
        for runner in 1..=4 {
            let claimed = store
                .claim(&claim("default", runner, 1), at(20))
                .await
                .unwrap();
            assert_eq!(claimed[0].external_id, format!("a{}", runner - 1));
        }
        store.enqueue(&keyed("b0", "b", 1.0), at(30)).await.unwrap();
        store
            .enqueue(&keyed("a60", "a", 1.0), at(31))
            .await
            .unwrap();
        let mut order = Vec::new();
        for runner in 5..=8 {
            let claimed = store
                .claim(&claim("default", runner, 1), at(40))
                .await
                .unwrap();
            order.push(claimed[0].external_id.clone());
        }
        let b_at = order.iter().position(|id| id == "b0");
        assert!(matches!(b_at, Some(0 | 1)), "{order:?}");
        // `a`'s own jobs keep their order around it.
        let a_only: Vec<&String> = order.iter().filter(|id| id.starts_with('a')).collect();
        assert_eq!(a_only, ["a4", "a5", "a6"]);
        // The listing in queue order is the order of the hand-outs to come.
        let queued = store
            .list_jobs(&JobFilter {
                state: Some(JobState::Queued),
                pool: Some("default".into()),
                limit: Some(3),
                ..JobFilter::default()
            })
            .await
            .unwrap();
        let next: Vec<&str> = queued.iter().map(|j| j.external_id.as_str()).collect();
        assert_eq!(next, ["a7", "a8", "a9"]);
    }

    /// The same jobs in two pools that hold the same queue and work: in one
    /// they come as one batch (`enqueue_many`), in the other one by one.
    /// Both queues are then served in the same order: a batch's tags are
    /// the ones its jobs would get one after another (keys interleaved,
    /// weights apart, a key already queued, a job already handed out).
    pub async fn a_batch_is_tagged_as_its_jobs_one_by_one_would_be(store: Arc<dyn Store>) {
        let job = |pool: &str, id: &str, key: &str, weight: f64| NewJob {
            share: runway_core::share::Share::new(
                key,
                runway_core::share::Weight::from_f64(weight).unwrap(),
            ),
            ..api_job(&format!("{pool}-{id}"), pool)
        };
        let jobs = [
            ("x", "b", 2.0),
            ("y", "a", 1.0),
            ("z", "c", 0.5),
            ("w", "a", 1.0),
            ("v", "b", 2.0),
            ("u", "b", 2.0),
            ("t", "a", 1.0),
        ];
        let mut orders = Vec::new();
        for (pool, batched) in [("batched", true), ("one-by-one", false)] {
            for id in ["early-1", "early-2", "early-3"] {
                store
                    .enqueue(&job(pool, id, "a", 1.0), at(10))
                    .await
                    .unwrap();
            }
            let runner = if batched { 1 } else { 2 };
            store.claim(&claim(pool, runner, 1), at(20)).await.unwrap();
            let batch: Vec<NewJob> = jobs
                .iter()
                .map(|(id, key, weight)| job(pool, id, key, *weight))
                .collect();
            if batched {
                store.enqueue_many(&batch, at(30)).await.unwrap();
            } else {
                for one in &batch {
                    store.enqueue(one, at(30)).await.unwrap();
                }
            }
            let mut order = Vec::new();
            for runner in 10..20 {
                let Some(next) = store
                    .claim(&claim(pool, runner, 1), at(40))
                    .await
                    .unwrap()
                    .pop()
                else {
                    break;
                };
                order.push(
                    next.external_id
                        .trim_start_matches(&format!("{pool}-"))
                        .to_owned(),
                );
            }
            orders.push(order);
        }
        assert_eq!(orders[0].len(), 9, "{orders:?}");
        assert_eq!(orders[0], orders[1]);
    }

    /// Two keys with 30 queued each, `heavy` of weight 2: the first 30
    /// hand-outs go about two to one.
    pub async fn weights_share_the_queue_in_proportion(store: Arc<dyn Store>) {
        let mut batch = Vec::new();
        for i in 0..30 {
            batch.push(keyed(&format!("light{i}"), "light", 1.0));
        }
        for i in 0..30 {
            batch.push(keyed(&format!("heavy{i}"), "heavy", 2.0));
        }
        store.enqueue_many(&batch, at(10)).await.unwrap();
        let mut heavy = 0;
        for runner in 1..=30 {
            if claim_one(&store, runner, None).await.as_deref() == Some("heavy") {
                heavy += 1;
            }
        }
        assert!((19..=21).contains(&heavy), "heavy got {heavy} of 30");
    }

    /// With a cap of 2, a key with two jobs provisioning or running is
    /// passed over by a claim, a claim that starts, and a completion's
    /// next start; its jobs are taken again once one of them ends.
    pub async fn the_cap_passes_over_a_key_at_its_limit_on_every_claim_path(store: Arc<dyn Store>) {
        let mut batch: Vec<NewJob> = (0..5).map(|i| keyed(&format!("a{i}"), "a", 1.0)).collect();
        batch.push(keyed("b0", "b", 1.0));
        store.enqueue_many(&batch, at(10)).await.unwrap();
        // A plain claim: a, b (it joined at the front), a, then nothing:
        // a is at its cap and b has no more.
        let mut keys = Vec::new();
        for runner in 1..=3 {
            keys.push(claim_one(&store, runner, Some(2)).await);
        }
        assert_eq!(
            keys,
            [
                Some("a".to_owned()),
                Some("b".to_owned()),
                Some("a".to_owned())
            ]
        );
        assert_eq!(claim_one(&store, 4, Some(2)).await, None);
        // Without the cap the same claim takes a's next job.
        let runner = ready_runner(&store, "starter", "default").await;
        let capped = Claim {
            runner: runner.id,
            max_running_per_key: Some(2),
            ..claim("default", runner.id.0, 1)
        };
        if let runway_store::ClaimStart::Started(moved) = store
            .claim_and_start(&capped, &runner, at(50))
            .await
            .unwrap()
        {
            panic!("a is at its cap: {moved:?}");
        }
        let uncapped = Claim {
            max_running_per_key: None,
            ..capped.clone()
        };
        let (third, busy) = start_one(&store, &uncapped, &runner, 51).await;
        assert_eq!(third.share.key, "a");
        // a now has 3: a completion's next start passes over a too...
        let change = complete_change(&runner, at(60));
        let free = runway_core::moves::finish(&third, &busy, false, at(60)).unwrap();
        let (_, next) = store
            .complete_and_start_next(third.id, &change, (&busy, &free), None, &capped, at(60))
            .await
            .unwrap()
            .expect("the holder completes");
        // ...until its own job ended: a has 2 again, so nothing starts.
        assert!(next.is_none(), "{next:?}");
    }
}
