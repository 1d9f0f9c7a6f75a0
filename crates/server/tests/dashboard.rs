//! The Grafana dashboard only asks for series that exist: every `runway_`
//! metric its queries name is one runway exposes, every `runway:` series
//! one the recording rules make.

use std::collections::BTreeSet;
use std::path::Path;

fn repository_file(path: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(path),
    )
    .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `runway_…` and `runway:…` names in a PromQL expression.
fn names_in(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(start) = rest.find("runway") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        if name.starts_with("runway_") || name.starts_with("runway:") {
            names.push(name.to_owned());
        }
        rest = &tail[end.max(1)..];
    }
    names
}

#[test]
fn every_dashboard_query_names_a_series_runway_or_its_rules_make() {
    let exposition = runway_server::telemetry::metrics::Metrics::new().encode_text();
    let mut known: BTreeSet<String> = BTreeSet::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split(' ');
            let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
            known.insert(name.to_owned());
            if kind == "histogram" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    known.insert(format!("{name}{suffix}"));
                }
            }
        }
    }
    for line in repository_file("deploy/prometheus/recording.yml").lines() {
        if let Some(name) = line.trim().strip_prefix("- record: ") {
            known.insert(name.trim().to_owned());
        }
    }
    let dashboard: serde_json::Value =
        serde_json::from_str(&repository_file("deploy/grafana/runway.json")).expect("valid JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 6);
    let mut checked = 0;
    for panel in panels {
        assert!(panel["title"].as_str().is_some_and(|t| !t.is_empty()));
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            let names = names_in(expr);
            assert!(!names.is_empty(), "{expr}");
            for name in names {
                assert!(
                    known.contains(&name),
                    "{name} in {expr:?} is not a series runway makes"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 15, "{checked}");
    // The alert rules, too.
    for line in repository_file("deploy/prometheus/alerts.yml").lines() {
        for name in names_in(line) {
            assert!(known.contains(&name), "alerts.yml: {name}");
        }
    }
}
