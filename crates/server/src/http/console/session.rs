//! Sessions: login with a token for a signed cookie, logout, ending every
//! session, the CSRF and same-origin checks every change passes, and the
//! refusals they answer.

use super::*;

/// This installation's key for sessions and CSRF tokens.
pub(super) async fn key(service: &Service) -> Option<Vec<u8>> {
    service
        .console_key
        .get_or_try_init(|| async {
            let candidate = hex::encode(rand::random::<[u8; 32]>());
            service
                .store
                .init_setting("console_session_key", &candidate)
                .await
                .map(|key| key.into_bytes())
        })
        .await
        .inspect_err(|error| tracing::error!(%error, "cannot read the console's session key"))
        .ok()
        .cloned()
}

pub(super) fn mac(key: &[u8], text: &str) -> String {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        return String::new();
    };
    mac.update(text.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

pub(super) fn same(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// A logged-in browser: who, the CSRF token its forms carry, and its id.
pub(super) struct Session {
    pub(super) caller: Caller,
    pub(super) csrf: String,
    pub(super) id: String,
}

/// The store's record that session `id` was logged out.
pub(super) fn ended_key(id: &str) -> String {
    format!("console_session_ended:{id}")
}

/// The store setting that holds when an admin last ended every session:
/// sessions begun before it are refused.
pub(super) const SESSIONS_SINCE: &str = "console_sessions_since";

/// The fingerprint of `token` a session carries: enough to tell the token
/// it logged in with from another under the same name, nothing to log in
/// with.
pub(super) fn fingerprint(key: &[u8], token: &str) -> String {
    mac(key, &format!("token.{token}"))[..16].to_owned()
}

pub(super) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// The session `headers` carry, if it is valid, unexpired, and its token
/// is still configured with the same rights.
pub(super) async fn session(service: &Service, headers: &HeaderMap) -> Option<Session> {
    let value = cookie(headers, COOKIE)?;
    let key = key(service).await?;
    let (signed, signature) = value.rsplit_once('.')?;
    if !same(&mac(&key, signed), signature) {
        return None;
    }
    let mut parts = signed.splitn(5, '.');
    let (role, expires, name, id, print) = (
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
    );
    let expires = Timestamp::from_millis(expires.parse::<i64>().ok()?);
    if expires < now() {
        return None;
    }
    // Ended by an admin, or logged out: the store says.
    let begun = expires.as_millis() - SESSION.as_millis() as i64;
    match service.store.get_setting(SESSIONS_SINCE).await {
        Ok(Some(since)) if since.parse::<i64>().is_ok_and(|since| begun < since) => return None,
        Ok(_) => {}
        Err(error) => {
            tracing::warn!(%error, "cannot read when sessions were last ended; refusing the session");
            return None;
        }
    }
    match service.store.once_claimed(&ended_key(id)).await {
        Ok(false) => {}
        Ok(true) => return None,
        Err(error) => {
            tracing::warn!(%error, "cannot read whether a session was ended; refusing it");
            return None;
        }
    }
    let name = String::from_utf8(
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(name)
            .ok()?,
    )
    .ok()?;
    let role = match role {
        "admin" => crate::config::Role::Admin,
        "operate" => crate::config::Role::Operate,
        "read" => crate::config::Role::Read,
        _ => return None,
    };
    // The token must still be configured, the same one, with the same role.
    let caller = Caller::by_name(service, &name, role, |token| {
        same(&fingerprint(&key, token), print)
    })?;
    Some(Session {
        caller,
        csrf: mac(&key, &format!("csrf.{value}")),
        id: id.to_owned(),
    })
}

/// The login form. It says where a token is only when runway wrote one
/// (started without a config file); otherwise the operator's config holds
/// the tokens.
pub(super) fn login_page(service: &Service, status: StatusCode, flash: Option<&str>) -> Response {
    let wrote_token = service
        .reload_source
        .get()
        .is_some_and(|source| source.generated_admin_token.is_some());
    render(
        status,
        "login.html",
        minijinja::context! { flash => flash, wrote_token => wrote_token },
    )
}

#[derive(Deserialize)]
pub(super) struct LoginForm {
    pub(super) token: String,
}

pub(super) async fn login(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    if let Err(refused) = same_origin(&headers) {
        return refused.into_response();
    }
    let Some(caller) = Caller::of_token(&service, form.token.trim()) else {
        return login_page(
            &service,
            StatusCode::UNAUTHORIZED,
            Some("That token is not valid."),
        );
    };
    let Some(key) = key(&service).await else {
        return login_page(
            &service,
            StatusCode::SERVICE_UNAVAILABLE,
            Some("The store is unavailable; try again."),
        );
    };
    let role = caller.role.as_str();
    let expires = now().plus(SESSION).as_millis();
    let name = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(caller.name.as_bytes());
    let id = hex::encode(rand::random::<[u8; 16]>());
    let print = fingerprint(&key, form.token.trim());
    let signed = format!("{role}.{expires}.{name}.{id}.{print}");
    let value = format!("{signed}.{}", mac(&key, &signed));
    let cookie = format!(
        "{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}",
        SESSION.as_secs()
    );
    audit_session(&service, &caller.name, "console.login", &id).await;
    ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response()
}

/// A POST from another site is refused: its `Origin` (or, without one,
/// its `Referer`) must name this host. Browsers send `Origin` on every
/// cross-site POST.
pub(super) fn same_origin(headers: &HeaderMap) -> Result<(), Refusal> {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let from = headers
        .get(header::ORIGIN)
        .or_else(|| headers.get(header::REFERER))
        .and_then(|h| h.to_str().ok());
    match from {
        None => Ok(()),
        Some(from) => {
            let authority = from
                .split_once("://")
                .map(|(_, rest)| rest.split('/').next().unwrap_or(""))
                .unwrap_or("");
            if !host.is_empty() && authority == host {
                Ok(())
            } else {
                Err(Refusal::Forbidden(
                    "This request came from another site and was refused.",
                ))
            }
        }
    }
}

/// Why a console POST is not done.
pub(super) enum Refusal {
    /// No valid session: back to the login page.
    Login,
    Forbidden(&'static str),
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::Login => Redirect::to("/").into_response(),
            Refusal::Forbidden(message) => refused(message),
        }
    }
}

/// A page's reader: the session the request's cookie carries. Without a
/// valid one, the page sends the browser to the login.
pub(super) struct Viewer(pub(super) Session);

impl axum::extract::FromRequestParts<Arc<Service>> for Viewer {
    type Rejection = Refusal;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        service: &Arc<Service>,
    ) -> Result<Viewer, Refusal> {
        session(service, &parts.headers)
            .await
            .map(Viewer)
            .ok_or(Refusal::Login)
    }
}

/// The reader of a page that belongs to no one pool (the audit log, tasks,
/// the cluster): a session whose token covers every pool.
pub(super) struct FleetViewer(pub(super) Session);

impl axum::extract::FromRequestParts<Arc<Service>> for FleetViewer {
    type Rejection = Refusal;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        service: &Arc<Service>,
    ) -> Result<FleetViewer, Refusal> {
        let Viewer(session) = Viewer::from_request_parts(parts, service).await?;
        if session.caller.scope.is_every_pool() {
            Ok(FleetViewer(session))
        } else {
            Err(Refusal::Forbidden(EVERY_POOL_ONLY))
        }
    }
}

/// The refusal of a page or an action outside the session's pools.
pub(super) const OUT_OF_SCOPE: &str = "This token does not cover that pool.";

/// The refusal of a page that belongs to no one pool, for a token of some.
pub(super) const EVERY_POOL_ONLY: &str =
    "This page needs a token of every pool; this one covers only some.";

/// The page for the API's scope check refusing an action: the store
/// unavailable, or (out of scope, or no such job or runner for a token of
/// some pools) refused.
pub(super) fn scope_refusal(error: crate::http::error::ApiError) -> Response {
    if error.status == StatusCode::SERVICE_UNAVAILABLE {
        unavailable()
    } else {
        refused(OUT_OF_SCOPE)
    }
}

pub(super) fn refused(message: &str) -> Response {
    (
        StatusCode::FORBIDDEN,
        Html(format!(
            "<!doctype html><title>Refused</title><p>{}</p><p><a href=\"/\">Back to runway</a></p>",
            minijinja::HtmlEscape(message)
        )),
    )
        .into_response()
}

/// The session of a POST that changes something: logged in, an admin,
/// same-origin, carrying its CSRF token.
pub(super) async fn writer(
    service: &Service,
    headers: &HeaderMap,
    form: &ActionForm,
) -> Result<Session, Refusal> {
    same_origin(headers)?;
    let Some(session) = session(service, headers).await else {
        return Err(Refusal::Login);
    };
    if !same(&session.csrf, &form.csrf) {
        return Err(Refusal::Forbidden(
            "The form's CSRF token is missing or stale; reload the page and try again.",
        ));
    }
    if !session.caller.operates() {
        return Err(Refusal::Forbidden(
            "This token may only read; changes need a token of role operate or admin.",
        ));
    }
    Ok(session)
}

pub(super) async fn logout(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Response {
    if let Err(refused) = same_origin(&headers) {
        return refused.into_response();
    }
    if let Some(session) = session(&service, &headers).await {
        if !same(&session.csrf, &form.csrf) {
            return refused("The form's CSRF token is missing or stale.");
        }
        // Ended in the store, for every replica, until it would have
        // expired anyway (then pruned with the other once-keys).
        let ended = service
            .store
            .claim_once(&ended_key(&session.id), now(), Timestamp::from_millis(0))
            .await;
        if let Err(error) = ended {
            tracing::error!(%error, "cannot end a console session");
            return login_page(
                &service,
                StatusCode::SERVICE_UNAVAILABLE,
                Some("The store is unavailable, so the session could not be ended; try again."),
            );
        }
        audit_session(
            &service,
            &session.caller.name,
            "console.logout",
            &session.id,
        )
        .await;
    }
    let cookie = format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response()
}

/// Ends every console session (an admin's action): sessions begun before
/// now are refused on every replica from here on, this one's too.
pub(super) async fn end_sessions(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Response {
    let session = match writer(&service, &headers, &form).await {
        Ok(session) => session,
        Err(refusal) => return refusal.into_response(),
    };
    if !session.caller.admin() || !session.caller.scope.is_every_pool() {
        return refused("Only an admin token of every pool may end every session.");
    }
    let since = now().as_millis().to_string();
    if let Err(error) = service.store.put_setting(SESSIONS_SINCE, &since).await {
        tracing::error!(%error, "cannot end the console's sessions");
        return refused("The store is unavailable; no session was ended.");
    }
    audit_session(
        &service,
        &session.caller.name,
        "console.end_sessions",
        "all",
    )
    .await;
    let cookie = format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response()
}

/// A login, logout or end of sessions in the audit trail (the session is
/// named by the start of its id, never its cookie).
pub(super) async fn audit_session(service: &Service, actor: &str, action: &str, id: &str) {
    let entry = runway_store::AuditEntry {
        id: 0,
        at: now(),
        actor: actor.to_owned(),
        action: action.to_owned(),
        target: format!("session {}", &id[..id.len().min(8)]),
        details: json!({"channel": "console"}).to_string(),
    };
    if let Err(error) = service.store.add_audit(&entry).await {
        tracing::error!(%error, action, "cannot write the audit trail");
    }
    tracing::info!(target: "runway::audit", %actor, action, "console session");
}

impl From<Refusal> for Response {
    fn from(refusal: Refusal) -> Response {
        refusal.into_response()
    }
}
