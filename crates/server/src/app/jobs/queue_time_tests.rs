use super::*;

#[test]
fn a_requeued_job_keeps_the_wait_before_its_requeue() {
    let at = Timestamp::from_millis;
    let new = NewJob {
        source: runway_core::JobSource::Api,
        external_id: "x".into(),
        route: Route::Pool("p".into()),
        labels: vec![],
        payload: String::new(),
        max_attempts: 3,
        share: Default::default(),
    };
    let mut job = new.initial(JobId(1), at(0));
    // Declined at 50 s (requeued), started at 60 s.
    job.enqueued_at = at(50_000);
    job.started_at = Some(at(60_000));
    assert_eq!(queued_for(&job, at(70_000)), 60.0);
}
