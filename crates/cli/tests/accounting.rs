//! Never destroy what runway cannot account for (issue 56): `runway serve`
//! on the real binary, with `exec` providers driven through GARM's
//! protocol (`contrib/garm-provider-local` behind a wrapper whose fault
//! files make a create answer late, or make its instance appear after the
//! call was given up), the fake GitHub of the server's tests (answering
//! 5xx and 429 to deregistrations), and just-in-time runners that say they
//! are online and wait until GitHub has run a job on them.
//!
//! Each test checks, from the provider's own call log and the runners'
//! processes: no runner running a job is stopped, no instance is left, no
//! registration is left at GitHub.

use crate::common;
use runway_testkit::fake_github;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{runway, spawn_serve, wait_until, RunnerProcesses};
use fake_github::{Auth, FakeGithub, HOOK_SECRET, TOKEN};

fn executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// One installation under test: its directory, the fake GitHub, the
/// shared cloud's state and the provider's call log.
struct Setup {
    dir: tempfile::TempDir,
    fake: FakeGithub,
    runtime: tokio::runtime::Runtime,
}

impl Setup {
    /// A GitHub pool `gh` on exec providers `providers` (all on one
    /// backend: the same executable and cloud), each with a 2 s `timeout`
    /// and `list_lag` 0, the pool's `boot_timeout` as given.
    fn new(providers: &[&str], boot_timeout_secs: u64) -> Setup {
        Setup::lagging(providers, boot_timeout_secs, 0)
    }

    /// As [`Setup::new`], the providers' `list_lag` as given.
    fn lagging(providers: &[&str], boot_timeout_secs: u64, list_lag_secs: u64) -> Setup {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let fake = runtime.block_on(FakeGithub::start(100_000, Auth::Token));
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for sub in ["online", "done", "cloud"] {
            std::fs::create_dir_all(root.join(sub)).unwrap();
        }
        // Every call logged; `listlag` hides instances younger than that
        // many seconds from lists (a cloud's list lags behind its creates);
        // `fail` makes a create fail at once; `late`
        // makes it make its instance and then hang past the timeout;
        // `appear` makes it hang while its instance appears that many
        // seconds later, after runway gave up.
        executable(
            &root.join("provider.sh"),
            &format!(
                "#!/bin/sh\n\
                 d='{root}'\n\
                 echo \"$(date +%s.%N) $GARM_COMMAND $GARM_INSTANCE_ID $GARM_POOL_ID\" >> \"$d/calls.log\"\n\
                 if [ \"$GARM_COMMAND\" = ListInstances ] && [ -f \"$d/fault.listlag\" ]; then\n\
                   '{garm}' > \"$d/list.$$\" || exit $?\n\
                   exec python3 -c 'import json,os,sys,time; lag=float(open(sys.argv[1]).read()); print(json.dumps([i for i in json.load(open(sys.argv[3])) if time.time()-os.path.getmtime(os.path.join(sys.argv[2],i[\"name\"]+\".json\"))>=lag]))' \"$d/fault.listlag\" \"$d/cloud\" \"$d/list.$$\"\n\
                 fi\n\
                 if [ \"$GARM_COMMAND\" = CreateInstance ]; then\n\
                   [ -f \"$d/fault.fail\" ] && {{ echo 'injected failure' >&2; exit 1; }}\n\
                   if [ -f \"$d/fault.appear\" ]; then\n\
                     cat > \"$d/in.$$\"\n\
                     ( sleep $(cat \"$d/fault.appear\"); exec '{garm}' < \"$d/in.$$\" > /dev/null 2>&1 ) &\n\
                     exec sleep 30\n\
                   fi\n\
                   if [ -f \"$d/fault.late\" ]; then\n\
                     '{garm}'\n\
                     exec sleep 30\n\
                   fi\n\
                 fi\n\
                 exec '{garm}'\n",
                root = root.display(),
                garm = common::contrib_provider().display(),
            ),
        );
        executable(
            &root.join("runner.sh"),
            &format!(
                "#!/bin/sh\n\
                 d='{root}'\n\
                 [ -n \"$RUNWAY_JIT_CONFIG\" ] || exit 3\n\
                 echo $$ > \"$d/online/$RUNWAY_RUNNER_NAME\"\n\
                 i=0\n\
                 while [ $i -lt 1500 ] && [ ! -e \"$d/done/$RUNWAY_RUNNER_NAME\" ]; do sleep 0.2; i=$((i+1)); done\n",
                root = root.display(),
            ),
        );
        let port = common::free_port();
        let head = common::server_head(
            &format!("127.0.0.1:{port}"),
            "accounting-admin-token",
            "300ms",
        );
        std::fs::write(
            root.join("garm.conf"),
            format!(
                "state_dir={}\nboot=command\ncommand={}\nstop_grace=1\n",
                root.join("cloud").display(),
                root.join("runner.sh").display()
            ),
        )
        .unwrap();
        let mut config = format!(
            r#"{head}[github]
api_url = "{github}"
token = "env:RUNWAY_TEST_GITHUB_TOKEN"
webhook_secrets = ["{HOOK_SECRET}"]
deliveries = "orgs/octo-org/hooks/9"
redeliver_interval = "1s"
recheck_after = "2s"

[[pools]]
name = "gh"
labels = ["self-hosted", "linux"]
max_runners = 4
idle_grace = "1s"
boot_timeout = "{boot_timeout_secs}s"
providers = [{names}]
[pools.github]
org = "octo-org"
"#,
            github = fake.url,
            names = providers
                .iter()
                .map(|p| format!("\"{p}\""))
                .collect::<Vec<_>>()
                .join(", "),
        );
        for provider in providers {
            config.push_str(&format!(
                r#"
[providers.{provider}]
kind = "exec"
executable = "{root}/provider.sh"
config_file = "{root}/garm.conf"
timeout = "2s"
max_instances = 2
boot_seconds = 1
list_lag = "{list_lag_secs}s"
"#,
                root = root.display(),
            ));
        }
        std::fs::write(root.join("runway.toml"), config).unwrap();
        Setup { dir, fake, runtime }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn serve(&self) -> (common::Process, String) {
        let mut command = runway(self.root());
        command
            .args(["serve", "--config", "runway.toml"])
            .env("RUNWAY_TEST_GITHUB_TOKEN", TOKEN);
        let (serve, base) = spawn_serve(command);
        self.fake.lock().webhook_url = Some(format!("{base}/webhooks/github"));
        (serve, base)
    }

    fn deliver(&self, job: u64, action: &str) -> u16 {
        self.runtime.block_on(self.fake.deliver(job, action, false))
    }

    /// Runners online now: (name, pid).
    fn online(&self) -> Vec<(String, u32)> {
        std::fs::read_dir(self.root().join("online"))
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter_map(|e| {
                        let pid = std::fs::read_to_string(e.path())
                            .ok()?
                            .trim()
                            .parse()
                            .ok()?;
                        Some((e.file_name().to_string_lossy().into_owned(), pid))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn calls(&self) -> String {
        std::fs::read_to_string(self.root().join("calls.log")).unwrap_or_default()
    }

    fn cloud(&self) -> PathBuf {
        self.root().join("cloud")
    }

    fn instances(&self) -> usize {
        RunnerProcesses(self.cloud()).tracked().len()
    }

    /// GitHub gives job `job` to the first online runner (by name) and
    /// says so; returns the runner's name and pid.
    fn run_job_on_first_online(&self, job: u64, within: u64) -> (String, u32) {
        let mut given = None;
        wait_until("a runner online at GitHub to take the job", within, || {
            for (name, pid) in self.online() {
                if self.fake.give_oldest_queued_job(&name) == Some(job) {
                    given = Some((name, pid));
                    return true;
                }
            }
            false
        });
        let (name, pid) = given.unwrap();
        assert_eq!(self.deliver(job, "in_progress"), 202);
        (name, pid)
    }

    /// Watches the runner `pid` for `seconds` while its job runs: it must
    /// stay alive, and no DeleteInstance may name it. Then completes the
    /// job and lets the runner exit.
    fn job_runs_to_its_end(&self, job: u64, name: &str, pid: u32, seconds: u64) {
        let until = Instant::now() + Duration::from_secs(seconds);
        while Instant::now() < until {
            assert!(
                alive(pid),
                "runner {name} was stopped during its job; calls:\n{}",
                self.calls()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        self.fake.complete_job(job, "success");
        std::fs::write(self.root().join("done").join(name), "").unwrap();
        assert_eq!(self.deliver(job, "completed"), 202);
    }

    /// Everything settles: no instance left in the cloud, no runner left
    /// registered at GitHub.
    fn settles(&self, within: u64) {
        wait_until("every instance to be deleted", within, || {
            self.instances() == 0
        });
        wait_until("no registration left at GitHub", within, || {
            self.fake.lock().runners.is_empty()
        });
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        drop(RunnerProcesses(self.cloud()));
    }
}

fn alive(pid: u32) -> bool {
    // A zombie is dead: its state in /proc/PID/stat is Z.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            stat.rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().next())
                != Some("Z")
        })
        .unwrap_or(false)
}

/// A create that answers late, in both shapes: the instance is made and
/// the call hangs past its timeout (its runner registers and takes a job
/// before runway gives up on the call), or the instance appears only after
/// runway gave up. Either way the runner's record, in doubt, adopts it;
/// nothing deletes it while its job runs (well past the in-flight window),
/// and afterwards it is deleted and deregistered, through a GitHub that
/// answers 503, 429 and 502 to deregistrations first.
#[test]
fn a_create_that_answers_late_is_adopted_and_its_runner_never_killed_mid_job() {
    for (fault, value) in [("late", "1"), ("appear", "4")] {
        let setup = Setup::new(&["cloud"], 8);
        std::fs::write(setup.root().join(format!("fault.{fault}")), value).unwrap();
        setup.fake.lock().delete_faults.extend([
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            axum::http::StatusCode::TOO_MANY_REQUESTS,
            axum::http::StatusCode::BAD_GATEWAY,
        ]);
        let (_serve, _base) = setup.serve();
        setup.fake.queue_job(701, &["self-hosted", "linux"]);
        assert_eq!(setup.deliver(701, "queued"), 202);
        let (name, pid) = setup.run_job_on_first_online(701, 40);
        // Creates answer normally again: the next runners are ordinary.
        std::fs::remove_file(setup.root().join(format!("fault.{fault}"))).unwrap();
        // Over two in-flight windows (list_lag 0 + boot_timeout 8 s).
        setup.job_runs_to_its_end(701, &name, pid, 20);
        setup.settles(60);
        let calls = setup.calls();
        assert!(
            calls
                .lines()
                .filter(|l| l.contains("CreateInstance"))
                .count()
                >= 1,
            "{calls}"
        );
    }
}

/// runway is killed (-9) while a create is outstanding; its instance comes
/// up and takes its job while runway is down, and the provider's list lags
/// behind (it shows an instance 8 s after its create; `list_lag` says
/// 10 s). The restarted runway does not fail the record as never created
/// at its first look (and so deregister, ignore GitHub's 422 and delete
/// the instance as an orphan once listed): it waits out the window, adopts
/// the instance by its name, and the runner runs its job to the end.
#[test]
fn a_create_cut_off_by_a_restart_is_adopted_after_it() {
    let setup = Setup::lagging(&["cloud"], 6, 10);
    std::fs::write(setup.root().join("fault.late"), "1").unwrap();
    std::fs::write(setup.root().join("fault.listlag"), "8").unwrap();
    let (mut serve, _base) = setup.serve();
    setup.fake.queue_job(801, &["self-hosted", "linux"]);
    assert_eq!(setup.deliver(801, "queued"), 202);
    wait_until("the late create's runner to be online", 30, || {
        !setup.online().is_empty()
    });
    // Killed while the create hangs (its call lasts 30 s).
    let _ = serve.0.kill();
    let _ = serve.0.wait();
    std::fs::remove_file(setup.root().join("fault.late")).unwrap();
    let (name, pid) = setup.online().remove(0);
    assert_eq!(setup.fake.give_oldest_queued_job(&name), Some(801));
    // The in_progress webhook meets no runway: redelivered later.
    assert_eq!(
        setup
            .runtime
            .block_on(setup.fake.deliver(801, "in_progress", true)),
        0
    );
    // Back while the list still hides the instance.
    let (_serve, _base) = setup.serve();
    setup.job_runs_to_its_end(801, &name, pid, 25);
    std::fs::remove_file(setup.root().join("fault.listlag")).unwrap();
    setup.settles(60);
}

/// Two `exec` providers of one installation on one backend serve one pool:
/// each lists only its own instances, so neither deletes the other's busy
/// runners as orphans. Four jobs run at once on both, each to its end.
#[test]
fn two_exec_providers_on_one_backend_never_delete_each_others_runners() {
    let setup = Setup::new(&["cloud-a", "cloud-b"], 6);
    let (_serve, base) = setup.serve();
    let jobs: Vec<u64> = (901..905).collect();
    for job in &jobs {
        setup.fake.queue_job(*job, &["self-hosted", "linux"]);
        assert_eq!(setup.deliver(*job, "queued"), 202);
    }
    let mut running = Vec::new();
    for job in &jobs {
        running.push((*job, setup.run_job_on_first_online(*job, 40)));
    }
    // Both providers made runners (max_instances 2 each).
    let created = |provider: &str| {
        common::metric(
            &base,
            &format!(r#"runway_runners_created_total{{pool="gh",provider="{provider}"}}"#),
        )
    };
    assert!(created("cloud-a") >= 1.0 && created("cloud-b") >= 1.0);
    let until = Instant::now() + Duration::from_secs(15);
    while Instant::now() < until {
        for (job, (name, pid)) in &running {
            assert!(
                alive(*pid),
                "runner {name} (job {job}) was stopped; calls:\n{}",
                setup.calls()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for (job, (name, pid)) in &running {
        setup.job_runs_to_its_end(*job, name, *pid, 0);
    }
    setup.settles(60);
}

/// A runner whose create failed had its just-in-time registration made at
/// GitHub; GitHub answers its deregistration 503 and then 429 (with
/// Retry-After). runway asks again, at doubling waits, until GitHub takes
/// it: no stale registration is left. The job then runs on a new runner.
#[test]
fn a_failed_runners_registration_is_let_go_through_5xx_and_429() {
    let setup = Setup::new(&["cloud"], 6);
    std::fs::write(setup.root().join("fault.fail"), "").unwrap();
    setup.fake.lock().delete_faults.extend([
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        axum::http::StatusCode::TOO_MANY_REQUESTS,
    ]);
    let (_serve, base) = setup.serve();
    setup.fake.queue_job(1101, &["self-hosted", "linux"]);
    assert_eq!(setup.deliver(1101, "queued"), 202);
    wait_until("a create to fail", 30, || {
        setup.calls().contains("CreateInstance")
            && common::metric(
                &base,
                r#"runway_provider_errors_total{provider="cloud",operation="create"}"#,
            ) >= 1.0
    });
    std::fs::remove_file(setup.root().join("fault.fail")).unwrap();
    wait_until("both faults answered", 30, || {
        setup.fake.lock().delete_faults.is_empty()
    });
    let (name, pid) = setup.run_job_on_first_online(1101, 60);
    setup.job_runs_to_its_end(1101, &name, pid, 0);
    // 30 s after the first refusal, then 60 s after the second.
    setup.settles(150);
}
