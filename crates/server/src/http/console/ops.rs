//! The audit trail, background tasks, the cluster's replicas and the worker
//! configurations page.

use super::*;

/// Audit entries per page.
pub(super) const AUDIT_PAGE: u32 = 50;

#[derive(Deserialize)]
pub(super) struct AuditQuery {
    /// Entries older than this one.
    pub(super) before: Option<i64>,
}

/// The console page an audit target names, if it has one.
pub(super) fn audit_link(target: &str) -> Option<String> {
    let (kind, name) = target.split_once(' ')?;
    match kind {
        "job" => name
            .parse::<i64>()
            .ok()
            .map(|id| format!("/console/jobs/{id}")),
        "runner" => name
            .parse::<i64>()
            .ok()
            .map(|id| format!("/console/runners/{id}")),
        "pool" => Some(format!("/console/pools/{}", url_encode(name))),
        _ => None,
    }
}

/// An entry's details as `key: value` pairs (its channel apart), not JSON.
pub(super) fn audit_details(details: &str) -> (String, Vec<(String, String)>) {
    let Ok(serde_json::Value::Object(fields)) = serde_json::from_str::<serde_json::Value>(details)
    else {
        return (
            "api".to_owned(),
            vec![("details".to_owned(), details.to_owned())],
        );
    };
    let mut channel = "runway".to_owned();
    let mut pairs = Vec::new();
    for (key, value) in fields {
        let text = match value {
            serde_json::Value::String(text) => text,
            serde_json::Value::Null => continue,
            other => other.to_string(),
        };
        if key == "channel" {
            channel = text;
        } else {
            pairs.push((key, text));
        }
    }
    (channel, pairs)
}

pub(super) async fn audit(
    FleetViewer(session): FleetViewer,
    State(service): State<Arc<Service>>,
    Query(query): Query<AuditQuery>,
) -> Response {
    let Ok(mut entries) = service.store.list_audit(AUDIT_PAGE + 1, query.before).await else {
        return unavailable();
    };
    let older = entries.len() > AUDIT_PAGE as usize;
    entries.truncate(AUDIT_PAGE as usize);
    let at = now();
    let rows: Vec<_> = entries
        .iter()
        .map(|e| {
            let (channel, details) = audit_details(&e.details);
            json!({
                "id": e.id,
                "at": rfc3339(e.at),
                "ago": age(at, e.at),
                "actor": e.actor,
                "channel": channel,
                "action": e.action,
                "target": e.target,
                "link": audit_link(&e.target),
                "details": details,
            })
        })
        .collect();
    let next_page = older
        .then(|| {
            entries
                .last()
                .map(|e| format!("/console/audit?before={}", e.id))
        })
        .flatten();
    page(
        &session,
        "audit.html",
        "audit",
        json!({"entries": rows, "next_page": next_page, "paged": query.before.is_some()}),
    )
}

pub(super) async fn tasks(
    FleetViewer(session): FleetViewer,
    State(service): State<Arc<Service>>,
) -> Response {
    let tasks = crate::http::api::tasks_dto(&service);
    page(
        &session,
        "tasks.html",
        "tasks",
        json!({"tasks": tasks, "replica": service.replica}),
    )
}

pub(super) async fn cluster(
    FleetViewer(session): FleetViewer,
    State(service): State<Arc<Service>>,
) -> Response {
    let Ok(cluster) = crate::http::api::cluster_dto(&service).await else {
        return unavailable();
    };
    page(
        &session,
        "cluster.html",
        "cluster",
        json!({"cluster": cluster}),
    )
}

#[derive(Deserialize)]
pub(super) struct EvaluateQuery {
    /// The configuration to evaluate.
    pub(super) id: Option<String>,
    /// Condition inputs, one `name=value` per line.
    pub(super) inputs: Option<String>,
}

/// `name=value` lines as condition inputs, or which line is not one.
pub(super) fn parse_inputs(
    text: &str,
) -> Result<std::collections::BTreeMap<String, String>, String> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(|line| match line.split_once('=') {
            Some((name, value)) if !name.trim().is_empty() => {
                Ok((name.trim().to_owned(), value.trim().to_owned()))
            }
            _ => Err(format!("{line:?} is not name=value")),
        })
        .collect()
}

/// Every worker configuration with its rules, and one evaluated with the
/// inputs the form gives (read-only: evaluating changes nothing).
pub(super) async fn worker_configs(
    FleetViewer(session): FleetViewer,
    State(service): State<Arc<Service>>,
    Query(query): Query<EvaluateQuery>,
) -> Response {
    let Ok(stored) = service.store.list_worker_configs().await else {
        return unavailable();
    };
    let configs: Vec<serde_json::Value> = stored
        .iter()
        .map(|config| {
            let rules = crate::config::worker_config::parse(&config.body, &config.id)
                .map(|parsed| {
                    crate::config::worker_config::WorkerConfigDto::from_core(&parsed)
                        .rules
                        .into_iter()
                        .map(|rule| {
                            json!({
                                "rule_id": rule.rule_id,
                                "description": rule.description,
                                "conditions": rule.conditions.map(|c| json!(c).to_string()).unwrap_or_else(|| "always".to_owned()),
                                "values": rule.values.to_string(),
                            })
                        })
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            json!({"id": config.id, "version": config.version, "pools": config.pools, "updated_at": rfc3339(config.updated_at), "rules": rules})
        })
        .collect();
    let inputs_text = query.inputs.clone().unwrap_or_default();
    let evaluation = match query.id.as_deref().filter(|id| !id.is_empty()) {
        None => serde_json::Value::Null,
        Some(id) => match (
            stored.iter().find(|c| c.id == id),
            parse_inputs(&inputs_text),
        ) {
            (None, _) => json!({"error": format!("no worker configuration {id:?}")}),
            (Some(_), Err(error)) => json!({"error": error}),
            (Some(config), Ok(inputs)) => {
                match crate::app::worker_configs::evaluate(&service, config, &inputs) {
                    Ok(answer) => json!({
                        "config": serde_json::to_string_pretty(&answer["config"]).unwrap_or_default(),
                        "applied_rules": answer["applied_rules"],
                    }),
                    Err(error) => json!({"error": error.to_string()}),
                }
            }
        },
    };
    page(
        &session,
        "worker_configs.html",
        "worker_configs",
        json!({"configs": configs, "evaluation": evaluation, "chosen": query.id, "inputs": inputs_text}),
    )
}
