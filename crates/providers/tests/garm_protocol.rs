//! The `exec` provider against GARM's external provider protocol as
//! garm-provider-common defines it (`execution/common`, `execution/v0.1.0`,
//! `execution/v0.1.1`): the command names, the variables each interface
//! version sets, exit codes 30 and 31, GARM's statuses and base64
//! `provider_fault`. `contrib/garm-provider-local` checks its environment as
//! garm-provider-common's `Validate` does, so a call runway gets wrong fails
//! there as it would in garm-provider-lxd.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use runway_providers::exec::{
    pool_id, provider_pool_id, ExecConfig, ExecProvider, InterfaceVersion,
};
use runway_providers::{CreateRequest, InstanceId, InstanceState, Provider};

const CONTROLLER: &str = "0f5c3c0e-2f8a-4d55-9a53-1f2f7cbd0a11";

fn contrib() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../contrib/garm-provider-local/garm-provider-local")
}

fn executable(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn config(dir: &Path, executable: PathBuf, version: InterfaceVersion) -> ExecConfig {
    config_running(dir, executable, version, "sleep 60")
}

/// A GARM provider's config whose instances run `command` (the
/// contrib provider's `command=`), with its state below `dir`.
pub(crate) fn config_running(
    dir: &Path,
    executable: PathBuf,
    version: InterfaceVersion,
    command: &str,
) -> ExecConfig {
    let config_file = dir.join("provider.conf");
    std::fs::write(
        &config_file,
        format!(
            "state_dir={}\ncommand={command}\nstop_grace=2\n",
            dir.join("state").display()
        ),
    )
    .unwrap();
    ExecConfig {
        name: "garm".to_owned(),
        executable,
        config_file: Some(config_file),
        pools: vec!["linux".to_owned()],
        timeout: Duration::from_secs(20),
        environment_variables: Vec::new(),
        max_instances: 5,
        price_per_hour: 0.05,
        boot_time: Duration::from_secs(1),
        list_lag: Duration::from_secs(30),
        controller_id: CONTROLLER.to_owned(),
        legacy_controller_id: None,
        interface_version: version,
    }
}

fn request(name: &str) -> CreateRequest {
    CreateRequest {
        launch_config: serde_json::json!({"flavor": "small", "image": "ubuntu:24.04", "disable_updates": true}),
        ..crate::conformance::request(name)
    }
}

/// Each recorded call's environment, in call order.
fn recorded_calls(dir: &Path) -> Vec<BTreeMap<String, String>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    files
        .iter()
        .map(|file| {
            std::fs::read_to_string(file)
                .unwrap()
                .lines()
                .filter_map(|line| line.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        })
        .collect()
}

/// Runs a create, get, list, stop, start and delete through the contrib
/// provider (which refuses what GARM's library refuses) and returns each
/// call's `GARM_*` environment.
async fn drive(version: InterfaceVersion) -> Vec<BTreeMap<String, String>> {
    let dir = tempfile::tempdir().unwrap();
    let calls = dir.path().join("calls");
    std::fs::create_dir_all(&calls).unwrap();
    let wrapper = executable(
        dir.path(),
        "recording-provider",
        &format!(
            "env | grep ^GARM_ > \"{calls}/$(date +%s%N).$GARM_COMMAND\"\nexec python3 {contrib} \"$@\"\n",
            calls = calls.display(),
            contrib = contrib().display()
        ),
    );
    let provider = ExecProvider::new(config(dir.path(), wrapper, version));
    let instance = provider.create(&request("garm-env-1")).await.unwrap();
    let got = provider.get(&instance.id).await.unwrap().expect("there");
    assert_eq!(got.state, InstanceState::Running);
    provider.stop(&instance.id).await.unwrap();
    provider.start(&instance.id, None).await.unwrap();
    provider.delete(&instance.id).await.unwrap();
    assert!(provider.list().await.unwrap().is_empty());
    recorded_calls(&calls)
}

#[tokio::test]
async fn v0_1_1_calls_carry_the_pool_and_its_extra_specs_on_every_command() {
    let calls = drive(InterfaceVersion::V011).await;
    // The pool's id names its provider (GARM's pools belong to one); lists
    // also ask under the id from before, while instances may be left there.
    let pool = provider_pool_id(CONTROLLER, "garm", "linux");
    let before = pool_id(CONTROLLER, "linux");
    assert_ne!(pool, before);
    let commands: std::collections::BTreeSet<_> =
        calls.iter().map(|c| c["GARM_COMMAND"].as_str()).collect();
    assert_eq!(
        commands.into_iter().collect::<Vec<_>>(),
        [
            "CreateInstance",
            "DeleteInstance",
            "GetInstance",
            "ListInstances",
            "StartInstance",
            "StopInstance"
        ]
    );
    let mut created = false;
    for call in &calls {
        let command = &call["GARM_COMMAND"];
        assert_eq!(call["GARM_INTERFACE_VERSION"], "v0.1.1", "{command}");
        assert_eq!(call["GARM_CONTROLLER_ID"], CONTROLLER, "{command}");
        if command == "ListInstances" && call["GARM_POOL_ID"] == before {
            continue;
        }
        assert_eq!(call["GARM_POOL_ID"], pool, "{command}");
        let specs = base64::engine::general_purpose::STANDARD
            .decode(&call["GARM_POOL_EXTRASPECS"])
            .unwrap();
        let specs: serde_json::Value = serde_json::from_slice(&specs).unwrap();
        // The pool's extra specs are its launch configuration without the
        // keys that are bootstrap fields (flavor, image, …), known from its
        // first create on (an object, `{}`, before).
        created |= command == "CreateInstance";
        if created {
            assert_eq!(
                specs,
                serde_json::json!({"disable_updates": true}),
                "{command}"
            );
        } else {
            assert!(specs.is_object(), "{command}: {specs}");
        }
        if command.ends_with("Instance") && command != "CreateInstance" {
            assert_eq!(call["GARM_INSTANCE_ID"], "garm-env-1", "{command}");
        }
    }
}

#[tokio::test]
async fn v0_1_0_calls_name_the_pool_only_on_create_and_list() {
    let calls = drive(InterfaceVersion::V010).await;
    for call in &calls {
        let command = call["GARM_COMMAND"].as_str();
        assert_eq!(call["GARM_INTERFACE_VERSION"], "v0.1.0", "{command}");
        assert!(!call.contains_key("GARM_POOL_EXTRASPECS"), "{command}");
        assert_eq!(
            call.contains_key("GARM_POOL_ID"),
            matches!(command, "CreateInstance" | "ListInstances"),
            "{command}"
        );
    }
}

#[test]
fn the_contrib_provider_refuses_what_garm_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let config_file = dir.path().join("provider.conf");
    std::fs::write(
        &config_file,
        format!("state_dir={}\n", dir.path().display()),
    )
    .unwrap();
    let run = |pairs: &[(&str, &str)]| {
        let output = std::process::Command::new(contrib())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("GARM_PROVIDER_CONFIG_FILE", &config_file)
            .env("GARM_CONTROLLER_ID", CONTROLLER)
            .envs(pairs.iter().copied())
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        )
    };
    // runway's old command names.
    for old in ["Start", "Stop"] {
        assert_eq!(
            run(&[
                ("GARM_INTERFACE_VERSION", "v0.1.1"),
                ("GARM_COMMAND", old),
                ("GARM_INSTANCE_ID", "x"),
                ("GARM_POOL_ID", "p"),
            ]),
            (Some(1), format!("unknown GARM_COMMAND: {old}"))
        );
    }
    assert_eq!(
        run(&[
            ("GARM_INTERFACE_VERSION", "v0.1.1"),
            ("GARM_COMMAND", "DeleteInstance"),
            ("GARM_INSTANCE_ID", "x"),
        ]),
        (Some(1), "missing pool ID".to_owned())
    );
    assert_eq!(
        run(&[
            ("GARM_INTERFACE_VERSION", "v0.1.0"),
            ("GARM_COMMAND", "GetInstance"),
            ("GARM_INSTANCE_ID", "x"),
        ]),
        (Some(30), "instance x not found".to_owned())
    );
    assert_eq!(
        run(&[
            ("GARM_INTERFACE_VERSION", "v0.2.0"),
            ("GARM_COMMAND", "ListInstances")
        ]),
        (Some(1), "unsupported interface version: v0.2.0".to_owned())
    );
}

/// A provider that answers from files: `answer.COMMAND` is printed,
/// `exit.COMMAND` is the exit code (0 when missing).
fn scripted(dir: &Path) -> PathBuf {
    executable(
        dir,
        "scripted-provider",
        &format!(
            "d={}\n[ -f \"$d/answer.$GARM_COMMAND\" ] && cat \"$d/answer.$GARM_COMMAND\"\necho \"$GARM_COMMAND $GARM_INSTANCE_ID\" >> \"$d/log\"\nexit $(cat \"$d/exit.$GARM_COMMAND\" 2>/dev/null || echo 0)\n",
            dir.display()
        ),
    )
}

fn answer(dir: &Path, command: &str, text: &str, code: i32) {
    std::fs::write(dir.join(format!("answer.{command}")), text).unwrap();
    std::fs::write(dir.join(format!("exit.{command}")), code.to_string()).unwrap();
}

#[tokio::test]
async fn garm_statuses_mean_what_garm_means() {
    let dir = tempfile::tempdir().unwrap();
    let fault = base64::engine::general_purpose::STANDARD.encode("disk quota exceeded");
    answer(
        dir.path(),
        "ListInstances",
        &format!(
            r#"[{{"provider_id":"i-1","name":"r-1","status":"running"}},
                {{"provider_id":"i-2","name":"r-2","status":"stopped"}},
                {{"provider_id":"i-3","name":"r-3","status":"error","provider_fault":"{fault}"}},
                {{"provider_id":"i-4","name":"r-4","status":"unknown"}}]"#
        ),
        0,
    );
    let provider = ExecProvider::new(config(
        dir.path(),
        scripted(dir.path()),
        InterfaceVersion::V011,
    ));
    let states: Vec<_> = provider
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|i| (i.name, i.state))
        .collect();
    assert_eq!(
        states,
        [
            ("r-1".to_owned(), InstanceState::Running),
            ("r-2".to_owned(), InstanceState::Stopped),
            ("r-3".to_owned(), InstanceState::Failed),
            ("r-4".to_owned(), InstanceState::Unknown),
        ]
    );
    // A create answered with `error` fails with the decoded fault, and the
    // instance is deleted as GARM does.
    answer(
        dir.path(),
        "CreateInstance",
        &format!(
            r#"{{"provider_id":"i-9","name":"r-9","status":"error","provider_fault":"{fault}"}}"#
        ),
        0,
    );
    let error = provider.create(&request("r-9")).await.unwrap_err();
    assert!(
        error
            .to_string()
            .ends_with("CreateInstance reported an error: disk quota exceeded"),
        "{error}"
    );
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
    assert!(log.contains("DeleteInstance i-9"), "{log}");
}

#[tokio::test]
async fn exit_30_is_not_found_and_31_a_duplicate_to_adopt() {
    let dir = tempfile::tempdir().unwrap();
    answer(
        dir.path(),
        "ListInstances",
        r#"[{"provider_id":"i-1","name":"r-1","status":"running"}]"#,
        0,
    );
    answer(dir.path(), "DeleteInstance", "not found", 30);
    answer(dir.path(), "GetInstance", "", 30);
    answer(dir.path(), "CreateInstance", "", 31);
    let provider = ExecProvider::new(config(
        dir.path(),
        scripted(dir.path()),
        InterfaceVersion::V011,
    ));
    provider
        .delete(&InstanceId("i-1".to_owned()))
        .await
        .expect("a delete answered 'not found' succeeded");
    assert_eq!(
        provider.get(&InstanceId("i-1".to_owned())).await.unwrap(),
        None
    );
    // The name exists already (runway lost the first create's answer).
    let adopted = provider.create(&request("r-1")).await.expect("adopted");
    assert_eq!(adopted.id, InstanceId("i-1".to_owned()));
    // Any other failure is a failure.
    answer(dir.path(), "DeleteInstance", "", 1);
    assert!(provider
        .delete(&InstanceId("i-1".to_owned()))
        .await
        .is_err());
}

#[tokio::test]
async fn instances_of_an_installation_from_before_the_uuids_are_still_found() {
    let dir = tempfile::tempdir().unwrap();
    let provider = |legacy: Option<&str>, controller: &str| {
        let mut config = config(dir.path(), contrib(), InterfaceVersion::V011);
        config.controller_id = controller.to_owned();
        config.legacy_controller_id = legacy.map(str::to_owned);
        ExecProvider::new(config)
    };
    // Before: an rwc_ controller id, and the pool's name as its id.
    let legacy = "rwc_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let old_call = |command: &str, stdin: &str| {
        use std::io::Write;
        let mut child = std::process::Command::new(contrib())
            .env("GARM_COMMAND", command)
            .env("GARM_CONTROLLER_ID", legacy)
            .env("GARM_POOL_ID", "linux")
            .env(
                "GARM_PROVIDER_CONFIG_FILE",
                dir.path().join("provider.conf"),
            )
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "{command}");
        String::from_utf8(output.stdout).unwrap()
    };
    let _ = provider(None, CONTROLLER); // writes the provider's config file
    old_call("CreateInstance", r#"{"name": "old-1"}"#);
    assert!(old_call("ListInstances", "").contains("old-1"));
    // After the upgrade: a UUID, the old id remembered.
    let new = provider(Some(legacy), CONTROLLER);
    let listed = new.list().await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    new.create(&request("new-1")).await.unwrap();
    assert_eq!(new.list().await.unwrap().len(), 2);
    new.remove_all().await.unwrap();
    assert!(new.list().await.unwrap().is_empty());
    assert_eq!(old_call("ListInstances", "").trim(), "[]");
}

/// A GARM provider lists a real cloud, whose list lags behind its creates:
/// a launch the list does not show yet counts against `max_instances` for
/// `list_lag` (with no lag, the old behaviour, a third launch goes over a
/// quota of two). Slots held for creates about to be made count as well.
#[tokio::test]
async fn launches_a_lagging_list_does_not_show_count_against_the_quota() {
    for (lag, third_refused) in [(Duration::from_secs(30), true), (Duration::ZERO, false)] {
        let dir = tempfile::tempdir().unwrap();
        answer(dir.path(), "ListInstances", "[]", 0);
        let provider = ExecProvider::new(ExecConfig {
            max_instances: 2,
            list_lag: lag,
            ..config(dir.path(), scripted(dir.path()), InterfaceVersion::V011)
        });
        let mut outcomes = Vec::new();
        for i in 1..=3 {
            answer(
                dir.path(),
                "CreateInstance",
                &format!(r#"{{"provider_id":"i-{i}","name":"r-{i}","status":"running"}}"#),
                0,
            );
            outcomes.push(provider.create(&request(&format!("r-{i}"))).await);
        }
        assert!(outcomes[..2].iter().all(Result::is_ok), "{outcomes:?}");
        assert_eq!(
            matches!(
                outcomes[2],
                Err(runway_providers::ProviderError::Quota { .. })
            ),
            third_refused,
            "list_lag {lag:?}: {outcomes:?}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    answer(dir.path(), "ListInstances", "[]", 0);
    let provider = ExecProvider::new(ExecConfig {
        max_instances: 2,
        ..config(dir.path(), scripted(dir.path()), InterfaceVersion::V011)
    });
    provider.reserve("a").unwrap();
    provider.reserve("b").unwrap();
    assert!(provider.reserve("c").is_err(), "no third slot");
    assert_eq!(provider.bid("linux", 5)[0].capacity, 0);
    provider.unreserve("a");
    assert_eq!(provider.bid("linux", 5)[0].capacity, 1);
}

/// Two `exec` providers of one installation on one backend (the same
/// executable and state): each lists only its own instances, because each
/// pool's `GARM_POOL_ID` names its provider; an instance from before that
/// (under the pool id without the provider) is listed by both, unproven.
#[tokio::test]
async fn two_providers_on_one_backend_list_only_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let make = |name: &str| {
        let mut config = config(dir.path(), contrib(), InterfaceVersion::V011);
        config.name = name.to_owned();
        ExecProvider::new(config)
    };
    let (a, b) = (make("cloud-a"), make("cloud-b"));
    // Left by a runway from before provider-scoped pool ids.
    let old = std::process::Command::new(contrib())
        .env("GARM_COMMAND", "CreateInstance")
        .env("GARM_INTERFACE_VERSION", "v0.1.1")
        .env(
            "GARM_PROVIDER_CONFIG_FILE",
            dir.path().join("provider.conf"),
        )
        .env("GARM_CONTROLLER_ID", CONTROLLER)
        .env("GARM_POOL_ID", pool_id(CONTROLLER, "linux"))
        .env("GARM_POOL_EXTRASPECS", "e30=")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut old = old;
        let mut bootstrap = a.bootstrap(&request("linux-old"));
        bootstrap["pool_id"] = serde_json::json!(pool_id(CONTROLLER, "linux"));
        old.stdin
            .take()
            .unwrap()
            .write_all(bootstrap.to_string().as_bytes())
            .unwrap();
        assert!(old.wait_with_output().unwrap().status.success());
    }
    let made_by_a = a.create(&request("linux-aaaa")).await.unwrap();
    let made_by_b = b.create(&request("linux-bbbb")).await.unwrap();
    for (provider, own, other) in [(&a, &made_by_a, &made_by_b), (&b, &made_by_b, &made_by_a)] {
        let listed = provider.list().await.unwrap();
        let names: Vec<&str> = listed.iter().map(|i| i.name.as_str()).collect();
        assert!(names.contains(&own.name.as_str()), "{names:?}");
        assert!(!names.contains(&other.name.as_str()), "{names:?}");
        let old = listed
            .iter()
            .find(|i| i.name == "linux-old")
            .expect("listed");
        assert!(provider.proven_own(&own.id));
        assert!(!provider.proven_own(&old.id), "maybe another provider's");
    }
    for (provider, instance) in [(&a, &made_by_a), (&b, &made_by_b)] {
        provider.delete(&instance.id).await.unwrap();
    }
    let old = a
        .list()
        .await
        .unwrap()
        .into_iter()
        .find(|i| i.name == "linux-old")
        .unwrap();
    a.delete(&old.id).await.unwrap();
    assert!(a.list().await.unwrap().is_empty());
}

/// A create that overruns its timeout has an unknown outcome: it is
/// `InDoubt`, and no clean-up delete goes out after it (the instance it
/// may have made could be running a job). Another create of the same
/// provider is not held behind it.
#[tokio::test]
async fn a_hung_create_is_in_doubt_cleans_nothing_up_and_blocks_no_other_create() {
    let dir = tempfile::tempdir().unwrap();
    let provider = executable(
        dir.path(),
        "provider",
        &format!(
            "d={d}\necho \"$GARM_COMMAND $GARM_INSTANCE_ID\" >> \"$d/log\"\n\
             case \"$GARM_COMMAND\" in\n\
             ListInstances) echo '[]' ;;\n\
             CreateInstance) n=$(cat | sed 's/.*\"name\": *\"\\([^\"]*\\)\".*/\\1/'); \
               case \"$n\" in *hang*) exec sleep 30 ;; esac; \
               echo \"{{\\\"provider_id\\\":\\\"i-$n\\\",\\\"name\\\":\\\"$n\\\",\\\"status\\\":\\\"running\\\"}}\" ;;\n\
             esac\n",
            d = dir.path().display()
        ),
    );
    let mut config = config(dir.path(), provider, InterfaceVersion::V011);
    config.timeout = Duration::from_secs(3);
    let provider = std::sync::Arc::new(ExecProvider::new(config));
    let hung = {
        let provider = provider.clone();
        tokio::spawn(async move { provider.create(&request("linux-hang")).await })
    };
    // Give the hung create time to be under way.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(dir.path().join("log"))
        .unwrap_or_default()
        .contains("CreateInstance")
    {
        assert!(std::time::Instant::now() < deadline, "no create began");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let other = provider.create(&request("linux-other")).await.unwrap();
    assert_eq!(other.name, "linux-other");
    assert!(
        !hung.is_finished(),
        "the second create waited behind the hung one"
    );
    let error = hung.await.unwrap().unwrap_err();
    assert!(error.is_in_doubt(), "{error}");
    assert!(error.is_retryable());
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
    assert!(
        !log.contains("DeleteInstance"),
        "cleaned up after a timeout: {log}"
    );
}
