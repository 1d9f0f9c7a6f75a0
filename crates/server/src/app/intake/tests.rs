use super::*;

/// What intake writes is what the re-check, the forecast and the trace
/// export read back; a wrong-typed fact reads as absent, not as none.
#[test]
fn github_facts_read_back_what_intake_wrote() {
    let body = br#"{"action":"queued","workflow_job":{"id":9,"run_id":77,"name":"build","labels":["x"],
        "workflow_name":"ci","created_at":"2026-11-25T08:00:00Z"},"repository":{"full_name":"o/r"}}"#;
    let payload = WorkflowJob::parse(body).unwrap();
    let facts = GithubFacts::parse(&github_payload(&payload));
    assert_eq!(facts, GithubFacts::of(&payload));
    assert_eq!(facts.run(), Some((77, "ci".to_owned())));
    assert_eq!(facts.repository.as_deref(), Some("o/r"));
    let odd = GithubFacts::parse(r#"{"run_id":"x","repository":"o/r"}"#);
    assert_eq!((odd.run_id, odd.repository.as_deref()), (None, Some("o/r")));
    assert_eq!(GithubFacts::parse("not json"), GithubFacts::default());
}
