use super::*;

#[test]
fn a_jwt_expiry_is_read_from_its_claims() {
    let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(br#"{"exp":1700000000}"#);
    assert_eq!(
        jwt_expiry(&format!("e30.{claims}.")),
        Some(Timestamp::from_millis(1_700_000_000_000))
    );
    assert_eq!(jwt_expiry("not a jwt"), None);
}

#[test]
fn a_message_is_read_and_an_unreadable_body_has_no_jobs() {
    let body = json!([
        {"messageType": "JobAvailable", "runnerRequestId": 7, "repositoryName": "r", "ownerName": "o", "workflowRunId": 9, "requestLabels": ["x"], "jobDisplayName": "build"},
        {"messageType": "JobStarted", "runnerRequestId": 7, "runnerName": "pool-1", "runnerId": 3},
        {"messageType": "JobCompleted", "runnerRequestId": 7, "result": "succeeded", "runnerName": "pool-1"},
        {"messageType": "SomethingNew"}
    ])
    .to_string();
    let message = Message::from_wire(&json!({
        "messageId": 4,
        "messageType": "RunnerScaleSetJobMessages",
        "body": body,
        "statistics": {"totalAssignedJobs": 2, "totalBusyRunners": 1}
    }));
    assert_eq!(message.id, 4);
    assert_eq!(
        message.statistics.as_ref().map(|s| s.total_assigned_jobs),
        Some(2)
    );
    assert_eq!(message.jobs.len(), 4);
    assert!(
        matches!(&message.jobs[0], JobMessage::Available(job) if job.runner_request_id == 7 && job.workflow_run_id == 9)
    );
    assert!(
        matches!(&message.jobs[1], JobMessage::Started { runner_name, .. } if runner_name == "pool-1")
    );
    assert!(
        matches!(&message.jobs[2], JobMessage::Completed { result, .. } if result == "succeeded")
    );
    assert_eq!(message.jobs[3], JobMessage::Other("SomethingNew".into()));
    let broken = Message::from_wire(&json!({
        "messageId": 5, "messageType": "RunnerScaleSetJobMessages", "body": "{not json"
    }));
    assert_eq!((broken.id, broken.jobs.len()), (5, 0));
}
