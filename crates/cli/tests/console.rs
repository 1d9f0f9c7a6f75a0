//! The web console over HTTP on the real binary: login into a session
//! cookie, what a read token sees and may do, an admin's form action with
//! its CSRF token, a forged cross-site POST, and the live stream, over
//! plain HTTP (`browser.rs` drives the same console in Chromium).

use crate::common;

use std::time::Duration;

use common::wait_until;

const ADMIN: &str = "console-test-admin-token";
const READ: &str = "console-test-read-token";

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// Logs in with `token`; the session cookie (`name=value`).
fn login(base: &str, token: &str) -> String {
    let response = http()
        .post(format!("{base}/console/login"))
        .form(&[("token", token)])
        .send()
        .unwrap();
    assert_eq!(
        response.status().as_u16(),
        303,
        "a login redirects to the overview"
    );
    let cookie = response.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    cookie.split(';').next().unwrap().to_owned()
}

fn page(base: &str, cookie: &str, path: &str) -> (u16, String) {
    let response = http()
        .get(format!("{base}{path}"))
        .header("cookie", cookie)
        .send()
        .unwrap();
    (response.status().as_u16(), response.text().unwrap())
}

fn csrf(html: &str) -> String {
    let start = html.find("name=\"csrf\" value=\"").expect("a CSRF field") + 19;
    html[start..start + 64].to_owned()
}

/// What a live stream sends until `done` holds of all of it (within 10 s).
fn stream_until(
    mut stream: reqwest::blocking::Response,
    what: &str,
    done: impl Fn(&str) -> bool,
) -> String {
    let mut seen = String::new();
    wait_until(what, 10, || {
        let mut buffer = [0u8; 65536];
        let read = std::io::Read::read(&mut stream, &mut buffer).unwrap_or(0);
        seen.push_str(&String::from_utf8_lossy(&buffer[..read]));
        done(&seen)
    });
    seen
}

fn paused(base: &str) -> bool {
    let pools: serde_json::Value = http()
        .get(format!("{base}/api/v1/pools"))
        .bearer_auth(ADMIN)
        .send()
        .unwrap()
        .json()
        .unwrap();
    pools["pools"][0]["paused"] == true
}

/// `runway serve` in `dir` with the admin and read tokens and one pool,
/// `default` (self-hosted, linux).
fn serve_default(dir: &std::path::Path) -> (common::Process, String) {
    std::fs::write(
        dir.join("runway.toml"),
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_tokens = [\"{ADMIN}\"]\nread_tokens = [\"{READ}\"]\n\
             [[pools]]\nname = \"default\"\nlabels = [\"self-hosted\", \"linux\"]\n"
        ),
    )
    .unwrap();
    common::serve_in(dir, &["--config", "runway.toml"])
}

#[test]
fn the_console_logs_in_shows_by_role_and_refuses_forged_posts() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, base) = serve_default(dir.path());

    // Not logged in: the login page; a wrong token is refused.
    let (status, html) = page(&base, "", "/");
    assert_eq!(status, 200);
    assert!(html.contains("name=\"token\""), "{html}");
    // A config file holds the tokens: the page does not send the operator
    // looking for a token file runway never wrote.
    assert!(html.contains("Use a token from runway"), "{html}");
    assert!(!html.contains("runway-admin.token"), "{html}");
    let wrong = http()
        .post(format!("{base}/console/login"))
        .form(&[("token", "nope")])
        .send()
        .unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
    assert_eq!(
        page(&base, "", "/console/jobs").0,
        303,
        "pages need a session"
    );
    assert_eq!(
        page(&base, "runway_session=forged.1.x.y", "/console/jobs").0,
        303
    );

    // A read token sees the pool and no buttons; its POSTs are refused.
    let reader = login(&base, READ);
    let (status, html) = page(&base, &reader, "/");
    assert_eq!(status, 200);
    assert!(
        html.contains("default") && html.contains("read only"),
        "{html}"
    );
    assert!(!html.contains(">Pause<"), "no buttons for a read token");
    let token = csrf(&html);
    let refused = http()
        .post(format!("{base}/console/pools/default/pause"))
        .header("cookie", &reader)
        .form(&[("csrf", token.as_str())])
        .send()
        .unwrap();
    assert_eq!(refused.status().as_u16(), 403);
    assert!(!paused(&base));

    // An admin pauses the pool from the page.
    let admin = login(&base, ADMIN);
    let (_, html) = page(&base, &admin, "/");
    assert!(html.contains(">Pause<"), "{html}");
    let token = csrf(&html);
    // Forged: from another site, or without the CSRF token: refused, nothing changes.
    let forged = http()
        .post(format!("{base}/console/pools/default/pause"))
        .header("cookie", &admin)
        .header("origin", "https://evil.example")
        .form(&[("csrf", token.as_str())])
        .send()
        .unwrap();
    assert_eq!(forged.status().as_u16(), 403);
    let no_token = http()
        .post(format!("{base}/console/pools/default/pause"))
        .header("cookie", &admin)
        .form(&[("csrf", "")])
        .send()
        .unwrap();
    assert_eq!(no_token.status().as_u16(), 403);
    assert!(!paused(&base), "forged posts changed nothing");
    let host = base.trim_start_matches("http://");
    let done = http()
        .post(format!("{base}/console/pools/default/pause"))
        .header("cookie", &admin)
        .header("origin", format!("http://{host}"))
        .form(&[("csrf", token.as_str())])
        .send()
        .unwrap();
    assert_eq!(done.status().as_u16(), 303);
    assert!(paused(&base));
    let (_, html) = page(&base, &admin, "/");
    assert!(
        html.contains(">Resume<") && html.contains(">paused<"),
        "{html}"
    );

    // A queued job's wait reason is on the jobs page, and in the stream.
    let job = common::submit(&base, ADMIN, "echo hi");
    let (_, html) = page(&base, &admin, "/console/jobs");
    assert!(html.contains("the pool is paused"), "{html}");
    let (_, html) = page(&base, &admin, &format!("/console/jobs/{job}"));
    assert!(html.contains("created"), "the job's history: {html}");
    // What it runs, its timeout and how long it has waited.
    for expected in [
        "Why it waits",
        "Runs (timeout 1 min):",
        "<pre>echo hi</pre>",
        "queued for",
    ] {
        assert!(html.contains(expected), "{expected} in {html}");
    }
    let stream = http()
        .get(format!("{base}/console/stream?page=jobs&jobs={job}"))
        .header("cookie", &admin)
        .send()
        .unwrap();
    assert_eq!(
        stream.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let seen = stream_until(stream, "the stream sends the job's wait reason", |seen| {
        seen.contains(&format!("\"job:{job}:waiting\":\"the pool is paused\""))
    });
    // A tab is sent what its page shows: a jobs tab no pool counts, an
    // overview tab no job cells.
    assert!(!seen.contains("\"pool:"), "{seen}");
    let overview = http()
        .get(format!("{base}/console/stream?page=overview&jobs={job}"))
        .header("cookie", &admin)
        .send()
        .unwrap();
    let seen = stream_until(overview, "the overview's counts", |seen| {
        seen.contains("\"pool:default:state\":\"paused\"")
    });
    assert!(!seen.contains("\"job:"), "{seen}");
    assert_eq!(page(&base, "", "/console/stream").0, 401);

    // A cancelled job's page says why it ended, and no longer why it waits.
    let cancelled = http()
        .post(format!("{base}/api/v1/jobs/{job}/cancel"))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({"reason": "not needed any more"}))
        .send()
        .unwrap();
    assert!(cancelled.status().is_success(), "{cancelled:?}");
    let (_, html) = page(&base, &admin, &format!("/console/jobs/{job}"));
    assert!(html.contains("not needed any more"), "{html}");
    assert!(html.contains("Why it ended:"), "{html}");
    assert!(!html.contains("Why it waits"), "{html}");
}

/// An `operate` token of one pool: its console shows that pool only, with
/// its buttons; another pool's job, pool action and the audit page are
/// refused, and its stream carries nothing of the other pool.
#[test]
fn an_operate_token_of_one_pool_sees_and_acts_on_that_pool_only() {
    const TEAM: &str = "console-team-a-operate-token";
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("runway.toml"),
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_tokens = [\"{ADMIN}\"]\n\
             [[server.tokens]]\nname = \"team-a\"\ntoken = \"{TEAM}\"\nrole = \"operate\"\npools = [\"team-a\"]\n\
             [[pools]]\nname = \"team-a\"\nlabels = [\"self-hosted\", \"a\"]\n\
             [[pools]]\nname = \"team-b\"\nlabels = [\"self-hosted\", \"b\"]\n"
        ),
    )
    .unwrap();
    let (_server, base) = common::serve_in(dir.path(), &["--config", "runway.toml"]);
    let submit = |label: &str| -> i64 {
        http()
            .post(format!("{base}/api/v1/jobs"))
            .bearer_auth(ADMIN)
            .json(&serde_json::json!({"labels": [label], "script": "true"}))
            .send()
            .unwrap()
            .json::<serde_json::Value>()
            .unwrap()["id"]
            .as_i64()
            .unwrap()
    };
    let (job_a, job_b) = (submit("a"), submit("b"));
    let team = login(&base, TEAM);
    let (status, html) = page(&base, &team, "/");
    assert_eq!(status, 200);
    assert!(
        html.contains("team-a") && !html.contains("team-b"),
        "only its pool: {html}"
    );
    assert!(html.contains(">Pause<"), "an operate token has the buttons");
    assert!(html.contains("team-a · operate"), "{html}");
    let token = csrf(&html);
    let (_, jobs) = page(&base, &team, "/console/jobs");
    assert!(
        jobs.contains(&format!("/console/jobs/{job_a}"))
            && !jobs.contains(&format!("/console/jobs/{job_b}")),
        "{jobs}"
    );
    assert_eq!(page(&base, &team, &format!("/console/jobs/{job_b}")).0, 403);
    assert_eq!(page(&base, &team, "/console/jobs?pool=team-b").0, 403);
    assert_eq!(page(&base, &team, "/console/audit").0, 403);
    let host = base.trim_start_matches("http://");
    let act = |path: &str| {
        http()
            .post(format!("{base}{path}"))
            .header("cookie", &team)
            .header("origin", format!("http://{host}"))
            .form(&[("csrf", token.as_str())])
            .send()
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(act("/console/pools/team-b/pause"), 403);
    assert_eq!(act(&format!("/console/jobs/{job_b}/cancel")), 403);
    assert_eq!(act("/console/pools/team-a/pause"), 303);
    let stream = http()
        .get(format!("{base}/console/stream?jobs={job_a},{job_b}"))
        .header("cookie", &team)
        .send()
        .unwrap();
    let seen = stream_until(stream, "the stream's first update", |seen| {
        seen.contains("pool:team-a:state")
    });
    assert!(
        !seen.contains("team-b") && !seen.contains(&format!("job:{job_b}:")),
        "{seen}"
    );
}

/// Sessions end on the server: a logged-out cookie replayed opens no page
/// and changes nothing; a token replaced under the same name (config
/// reload) ends its sessions; an admin's "end all sessions" ends every
/// one; each is in the audit trail; and a live session, like an ended
/// one, stays what it was across a restart (both are in the store).
#[test]
fn sessions_end_on_logout_token_replacement_and_end_all_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = |ops_token: &str| {
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_tokens = [\"{ADMIN}\"]\nread_tokens = [\"{READ}\"]\n\
             [[server.tokens]]\nname = \"ops\"\nrole = \"admin\"\ntoken = \"{ops_token}\"\n\
             [[pools]]\nname = \"default\"\nlabels = [\"self-hosted\", \"linux\"]\n"
        )
    };
    let path = dir.path().join("runway.toml");
    std::fs::write(&path, config("ops-token-one-0123456789")).unwrap();
    let (server, base) = common::serve_in(dir.path(), &["--config", "runway.toml"]);
    // A same-origin form POST's status.
    let post = |base: &str, cookie: &str, path: &str, csrf: &str| {
        http()
            .post(format!("{base}{path}"))
            .header("cookie", cookie)
            .header("origin", base)
            .form(&[("csrf", csrf)])
            .send()
            .unwrap()
            .status()
            .as_u16()
    };

    // Log out, then replay the old cookie and its CSRF token.
    let ops = login(&base, "ops-token-one-0123456789");
    let (status, html) = page(&base, &ops, "/console/jobs");
    assert_eq!(status, 200);
    let token = csrf(&html);
    assert_eq!(post(&base, &ops, "/console/logout", &token), 303);
    assert_eq!(
        page(&base, &ops, "/console/jobs").0,
        303,
        "the old cookie opens no page"
    );
    assert_eq!(
        post(&base, &ops, "/console/pools/default/pause", &token),
        303,
        "the old cookie is sent to log in"
    );
    assert!(!paused(&base), "and changes nothing");

    // A session outlives a restart; the ended one stays ended.
    let kept = login(&base, READ);
    assert_eq!(page(&base, &kept, "/").0, 200);
    drop(server);
    let (server, base) = common::serve_in(dir.path(), &["--config", "runway.toml"]);
    assert_eq!(
        page(&base, &kept, "/").0,
        200,
        "a live session after a restart"
    );
    assert_eq!(page(&base, &ops, "/console/jobs").0, 303, "an ended one");

    // The token replaced under the same name (reload): its session ends.
    let ops = login(&base, "ops-token-one-0123456789");
    assert_eq!(page(&base, &ops, "/").0, 200);
    std::fs::write(&path, config("ops-token-two-0123456789")).unwrap();
    let reloaded = http()
        .post(format!("{base}/api/v1/config/reload"))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({}))
        .send()
        .unwrap();
    assert_eq!(reloaded.status().as_u16(), 200);
    assert_eq!(
        page(&base, &ops, "/").0,
        200,
        "the login page, not the console"
    );
    assert!(
        page(&base, &ops, "/").1.contains("name=\"token\""),
        "a replaced token's session is over"
    );

    // An admin ends every session: the reader's, and its own.
    let admin = login(&base, ADMIN);
    let (_, html) = page(&base, &admin, "/");
    assert!(html.contains("End all sessions"), "{html}");
    assert_eq!(
        post(&base, &admin, "/console/sessions/end", &csrf(&html)),
        303
    );
    assert_eq!(page(&base, &kept, "/console/jobs").0, 303);
    assert_eq!(page(&base, &admin, "/console/jobs").0, 303);
    // A read token cannot end sessions.
    let reader = login(&base, READ);
    let (_, html) = page(&base, &reader, "/");
    assert!(!html.contains("End all sessions"));
    assert_eq!(
        post(&base, &reader, "/console/sessions/end", &csrf(&html)),
        403
    );
    assert_eq!(page(&base, &reader, "/console/jobs").0, 200);

    // The audit trail has the logins, the logout and the end of sessions.
    let audit: serde_json::Value = http()
        .get(format!("{base}/api/v1/audit?limit=100"))
        .bearer_auth(ADMIN)
        .send()
        .unwrap()
        .json()
        .unwrap();
    let entries: Vec<(String, String)> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["actor"].as_str().unwrap_or_default().to_owned(),
                e["action"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    for expected in [
        ("ops", "console.login"),
        ("ops", "console.logout"),
        ("admin_tokens[0]", "console.end_sessions"),
        ("read_tokens[0]", "console.login"),
    ] {
        assert!(
            entries
                .iter()
                .any(|(actor, action)| (actor.as_str(), action.as_str()) == expected),
            "{expected:?} in {entries:?}"
        );
    }
    drop(server);
}

/// A paused pool with 600 queued jobs: the newest (beyond the oldest 500
/// the live cells list, so on the jobs page's first page) keep their wait
/// reason in the stream that follows them, instead of a blank.
#[test]
fn a_deep_queues_newest_jobs_keep_their_reason_in_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, base) = serve_default(dir.path());
    let paused = http()
        .post(format!("{base}/api/v1/pools/default/pause"))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({}))
        .send()
        .unwrap();
    assert!(paused.status().is_success(), "{paused:?}");
    let ids: Vec<i64> = (0..600)
        .map(|_| common::submit(&base, ADMIN, "echo hi"))
        .collect();
    let newest = ids[599];
    let admin = login(&base, ADMIN);
    let (_, html) = page(&base, &admin, "/console/jobs");
    assert!(
        html.contains(&format!(
            "data-live=\"job:{newest}:waiting\">the pool is paused"
        )),
        "the first page shows the newest job's reason"
    );
    let stream = http()
        .get(format!("{base}/console/stream?jobs={newest},{}", ids[0]))
        .header("cookie", &admin)
        .send()
        .unwrap();
    let seen = stream_until(stream, "two updates of the stream", |seen| {
        seen.matches("event: update").count() >= 2
    });
    assert!(
        seen.contains(&format!("\"job:{newest}:waiting\":\"the pool is paused\"")),
        "the newest job's reason is kept: {}",
        &seen[..seen.len().min(400)]
    );
    assert!(
        !seen.contains(&format!("\"job:{newest}:waiting\":\"\"")),
        "never blanked"
    );
}

/// Several jobs at once: the jobs page's checkboxes and "Cancel selected"
/// cancel each selected job and come back to the same list; a job that
/// cannot be cancelled any more is named while the others are done; a
/// read token's bulk post changes nothing; a return address off the
/// console is not followed; a single cancel from the list returns to it.
#[test]
fn selected_jobs_are_cancelled_together_and_the_list_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, base) = serve_default(dir.path());
    let ids: Vec<i64> = (0..5)
        .map(|_| common::submit(&base, ADMIN, "true"))
        .collect();
    let state = |id: i64| common::job(&base, ADMIN, id)["state"].clone();
    let host = base.trim_start_matches("http://").to_owned();
    let admin = login(&base, ADMIN);
    let list = "/console/jobs?state=queued";
    let (_, html) = page(&base, &admin, list);
    for id in &ids {
        assert!(
            html.contains(&format!("name=\"ids\" value=\"{id}\" form=\"bulk\"")),
            "a checkbox for job {id}: {html}"
        );
    }
    assert!(
        html.contains("Cancel selected") && html.contains("confirm("),
        "{html}"
    );
    let token = csrf(&html);
    let bulk = |cookie: &str, fields: &[(&str, String)]| {
        let mut form: Vec<(&str, String)> = vec![("csrf", token.clone())];
        form.extend(fields.iter().cloned());
        http()
            .post(format!("{base}/console/jobs/bulk"))
            .header("cookie", cookie)
            .header("origin", format!("http://{host}"))
            .form(&form)
            .send()
            .unwrap()
    };
    let done = bulk(
        &admin,
        &[
            ("action", "cancel".into()),
            ("ids", ids[0].to_string()),
            ("ids", ids[1].to_string()),
            ("back", list.into()),
        ],
    );
    assert_eq!(done.status().as_u16(), 303);
    assert_eq!(done.headers()["location"], list, "back to the same list");
    assert_eq!(state(ids[0]), "cancelled");
    assert_eq!(state(ids[1]), "cancelled");
    assert_eq!(state(ids[2]), "queued");

    // One already cancelled: named; the other is done all the same.
    let partly = bulk(
        &admin,
        &[
            ("action", "cancel".into()),
            ("ids", ids[0].to_string()),
            ("ids", ids[2].to_string()),
            ("back", "//evil.example/steal".into()),
        ],
    );
    assert_eq!(partly.status().as_u16(), 409);
    let text = partly.text().unwrap().replace("&#x2f;", "/");
    assert!(
        text.contains(&format!("job {} is cancelled", ids[0])),
        "{text}"
    );
    assert!(
        text.contains("href=\"/console/jobs\""),
        "not the other site: {text}"
    );
    assert_eq!(state(ids[2]), "cancelled");

    // A read token's bulk post changes nothing.
    let reader = login(&base, READ);
    let refused = bulk(
        &reader,
        &[("action", "cancel".into()), ("ids", ids[3].to_string())],
    );
    assert_eq!(refused.status().as_u16(), 403);
    assert_eq!(state(ids[3]), "queued");

    // One job from the list: back to the list.
    let single = http()
        .post(format!("{base}/console/jobs/{}/cancel", ids[3]))
        .header("cookie", &admin)
        .header("origin", format!("http://{host}"))
        .form(&[("csrf", token.as_str()), ("back", list)])
        .send()
        .unwrap();
    assert_eq!(single.status().as_u16(), 303);
    assert_eq!(single.headers()["location"], list);
    assert_eq!(state(ids[3]), "cancelled");
    assert_eq!(state(ids[4]), "queued");
}
