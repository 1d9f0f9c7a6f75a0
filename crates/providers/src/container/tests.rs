use super::*;

#[test]
fn bootstrap_values_are_quoted_for_the_shell() {
    let script = bootstrap_script(&BTreeMap::from([
        ("A".to_owned(), "it's $HOME `x`".to_owned()),
        ("bad name".to_owned(), "x".to_owned()),
    ]));
    assert_eq!(script, "export A='it'\\''s $HOME `x`'\n");
}

#[test]
fn an_ended_container_says_why() {
    let mib = 32 * 1024 * 1024;
    assert!(ended_detail(true, Some(137), None, false, None, "").starts_with("out of memory"));
    assert!(ended_detail(false, Some(137), Some(mib), false, None, "")
        .starts_with("out of memory: killed by SIGKILL under its 32 MiB"));
    assert_eq!(
        ended_detail(false, Some(137), Some(mib), true, None, ""),
        "exited with code 137",
        "runway stopped it"
    );
    let many: String = (0..100).map(|i| format!("line {i}\n")).collect();
    let detail = ended_detail(false, Some(2), None, false, None, &many);
    assert!(
        detail.starts_with("exited with code 2; last output:\nline 80\n"),
        "{detail}"
    );
    assert!(detail.ends_with("line 99"));
}

#[test]
fn names_are_what_the_engine_accepts() {
    assert_eq!(container_name("linux-0a1b"), "runway-linux-0a1b");
    assert_eq!(container_name("a b/c"), "runway-a-b-c");
}
