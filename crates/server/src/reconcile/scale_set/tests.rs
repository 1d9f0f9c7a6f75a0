use super::*;

#[test]
fn labels_are_the_name_and_the_pool_labels_once_each() {
    let pool = vec![
        "self-hosted".to_owned(),
        "Linux".to_owned(),
        "arc".to_owned(),
    ];
    assert_eq!(
        scale_set_labels("arc", &pool),
        vec!["arc", "self-hosted", "Linux"]
    );
    assert!(same_labels(
        &["ARC".into(), "linux".into(), "self-hosted".into()],
        &scale_set_labels("arc", &pool)
    ));
}

#[test]
fn results_become_conclusions_and_refs_workflows() {
    assert_eq!(conclusion("succeeded"), "success");
    assert_eq!(conclusion("Failed"), "failure");
    assert_eq!(conclusion("canceled"), "cancelled");
    assert_eq!(conclusion("timed_out"), "timed_out");
    assert_eq!(
        workflow_of("org/repo/.github/workflows/ci.yml@refs/heads/main").as_deref(),
        Some(".github/workflows/ci.yml")
    );
    assert_eq!(workflow_of(""), None);
}
