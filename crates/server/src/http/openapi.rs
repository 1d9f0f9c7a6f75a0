//! The OpenAPI 3.1 document of the admin and runner APIs, served at
//! `GET /api/v1/openapi.json`.
//!
//! Nothing here lists a route: each handler carries its own
//! `#[utoipa::path]` and is registered with `utoipa_axum::routes!`, which
//! adds the route to the router and its operation to the document in one
//! step. What lives here is what every operation shares: the document's
//! header, the two bearer schemes, the error body and the refusals every
//! authenticated operation can answer.

use std::collections::BTreeMap;

use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Response, ResponseBuilder, ResponsesBuilder};
use utoipa::{IntoResponses, Modify, OpenApi};

use crate::http::error::ErrorBody;

/// The name of the scheme for admin and read-only tokens.
pub const ADMIN_TOKEN: &str = "admin_token";
/// The name of the scheme for runner tokens.
pub const RUNNER_TOKEN: &str = "runner_token";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "runway",
        description = "runway's admin API (jobs, pools, runners, audit, configuration; \
            admin or read-only bearer tokens from `[server]`) and runner API \
            (registration, the lease-based job hand-out, heartbeats, completion; \
            runner tokens). Every refusal is a JSON `{error, code}`.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    components(schemas(ErrorBody)),
    modifiers(&BearerSchemes),
    tags(
        (name = "jobs", description = "Queued, running and finished jobs"),
        (name = "pools", description = "Pools and their pause state"),
        (name = "runners", description = "Runners runway started or that registered"),
        (name = "runner-api", description = "What a runner calls: registration, the job hand-out, heartbeats, completion"),
        (name = "worker-configs", description = "Worker configurations: rules that give a pool's runners their values"),
        (name = "operations", description = "Configuration reload, audit trail, background tasks, the cluster"),
        (name = "health", description = "Liveness, readiness and status"),
    )
)]
pub struct ApiDoc;

struct BearerSchemes;

/// Says that each variant of the internally tagged enum schema `name`
/// takes no other property (`additionalProperties: false`), as its
/// `deny_unknown_fields` does: utoipa writes that for structs, not for an
/// enum's variants.
fn closed_variants(components: &mut utoipa::openapi::Components, name: &str) {
    use utoipa::openapi::schema::{AdditionalProperties, Schema};
    use utoipa::openapi::RefOr;
    let Some(RefOr::T(Schema::OneOf(one_of))) = components.schemas.get_mut(name) else {
        return;
    };
    for item in &mut one_of.items {
        if let RefOr::T(Schema::Object(object)) = item {
            object.additional_properties = Some(Box::new(AdditionalProperties::FreeForm(false)));
        }
    }
}

impl Modify for BearerSchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            ADMIN_TOKEN,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An API token with a role and the pools it covers: \
                         `[server] admin_tokens` (role admin, every pool), \
                         `[server] read_tokens` (role read, every pool), or \
                         `[[server.tokens]]` (a name, role `read`, `operate` or \
                         `admin`, and pool globs). Reads need any role; job \
                         submission, cancel and retry, pool pause and resume, \
                         runner drain and terminate, and registration tokens \
                         need `operate`; reload and worker-configuration \
                         changes need `admin`. A token of some pools sees only \
                         their jobs, runners and pools (listing pages may then \
                         hold fewer than `limit`), gets 403 `out_of_scope` for \
                         anything of another pool, and for what belongs to no \
                         one pool (audit, tasks, cluster, worker configurations).",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            RUNNER_TOKEN,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The runner token `POST /api/v1/runners/register` gave out.",
                    ))
                    .build(),
            ),
        );
    }
}

/// A refusal answered with [`ErrorBody`].
pub fn refusal(description: &str) -> Response {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build()
}

fn responses(list: &[(&str, &str)]) -> BTreeMap<String, RefOr<Response>> {
    list.iter()
        .fold(ResponsesBuilder::new(), |builder, (status, description)| {
            builder.response(*status, refusal(description))
        })
        .build()
        .into()
}

const UNAUTHORIZED: (&str, &str) = (
    "401",
    "No bearer token, or not a valid one (or the admin API has no tokens configured)",
);
const UNAVAILABLE: (&str, &str) = ("503", "The store is unavailable; retry");

/// What any operation behind an admin or read-only token can refuse.
pub struct ReadRefusals;

impl IntoResponses for ReadRefusals {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        responses(&[
            UNAUTHORIZED,
            (
                "403",
                "The token does not cover the pool, or covers only some pools and this belongs to none (`out_of_scope`)",
            ),
            UNAVAILABLE,
        ])
    }
}

/// What any operation that needs an admin token can refuse.
pub struct WriteRefusals;

impl IntoResponses for WriteRefusals {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        responses(&[
            UNAUTHORIZED,
            (
                "403",
                "The token's role may not do this (`forbidden`), or it does not cover the pool (`out_of_scope`)",
            ),
            UNAVAILABLE,
        ])
    }
}

const NOT_A_RUNNER: (&str, &str) = (
    "401",
    "No runner token, not a valid one, or its runner has ended",
);

/// What any operation behind a runner token can refuse.
pub struct RunnerRefusals;

impl IntoResponses for RunnerRefusals {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        responses(&[NOT_A_RUNNER, UNAVAILABLE])
    }
}

/// What an operation of the runner that holds job `{id}` can refuse.
pub struct HolderRefusals;

impl IntoResponses for HolderRefusals {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        responses(&[
            NOT_A_RUNNER,
            ("403", "Another runner holds the job"),
            ("404", "No such job"),
            UNAVAILABLE,
        ])
    }
}

/// A string schema that takes exactly `values`.
pub fn one_of(values: impl IntoIterator<Item = &'static str>) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(values))
}

/// The document as served: built once, on first request.
pub fn document(openapi: &utoipa::openapi::OpenApi) -> String {
    // The routes' schemas are merged in after `ApiDoc`'s modifiers ran.
    let mut openapi = openapi.clone();
    if let Some(components) = openapi.components.as_mut() {
        closed_variants(components, "Report");
    }
    openapi
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"cannot render the OpenAPI document: {e}\"}}"))
}
