//! A private Podman for the container provider's tests: its own
//! `podman system service` (runc) with its own storage and socket in a
//! temporary directory, and an image imported from busybox-static plus any
//! extra files (no registry). Debian's `podman`, `runc` and
//! `busybox-static` must be installed (`.ci/run` does): without them,
//! [`podman`] fails under CI and returns `None` elsewhere.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::wait_until;

/// The image every test's containers run.
pub const IMAGE: &str = "localhost/runway-test-runner:1";

/// A private Podman: its service, storage and socket in one directory;
/// every container it ran is removed and the service stopped on drop.
pub struct Podman {
    pub dir: PathBuf,
    service: Option<Child>,
    pub socket: PathBuf,
}

fn tools_present() -> bool {
    ["podman", "runc", "busybox"].iter().all(|tool| {
        Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// The Podman of these tests, or `None` (skipped) where it is not
/// installed and this is not CI.
pub fn podman(extra: &[PathBuf]) -> Option<Podman> {
    if !tools_present() {
        assert!(
            std::env::var_os("CI").is_none(),
            "podman, runc and busybox must be installed under CI (.ci/run does)"
        );
        eprintln!("skipped: podman, runc or busybox is not installed");
        return None;
    }
    let dir = tempfile::Builder::new()
        .prefix("runway-podman-")
        .tempdir()
        .expect("a temporary directory")
        .keep();
    // This machine kind: crun fails on hybrid cgroups, and the default
    // ulimits exceed what a process without CAP_SYS_RESOURCE may set.
    std::fs::write(
        dir.join("containers.conf"),
        "[containers]\ndefault_ulimits = [\"nofile=1024:1024\", \"nproc=4096:4096\"]\n\
         [engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n",
    )
    .unwrap();
    let socket = dir.join("podman.sock");
    let mut podman = Podman {
        dir,
        service: None,
        socket,
    };
    podman.start_service();
    podman.build_image(extra);
    Some(podman)
}

/// Storage, run state and libpod's own state (default `/run/libpod`,
/// shared by every Podman on the machine: another test's `system reset`
/// would remove it under this one) all in `dir`.
fn podman_args(dir: &Path) -> Vec<String> {
    vec![
        "--root".into(),
        dir.join("root").display().to_string(),
        "--runroot".into(),
        dir.join("run").display().to_string(),
        "--tmpdir".into(),
        dir.join("libpod").display().to_string(),
    ]
}

impl Podman {
    /// `podman system service` on [`Podman::socket`], until stopped.
    pub fn start_service(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
        let service = Command::new("podman")
            .args(podman_args(&self.dir))
            .args(["system", "service", "--time", "0"])
            .arg(format!("unix://{}", self.socket.display()))
            .env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            // conmon leaves files (an `oom` marker) in its working directory.
            .current_dir(&self.dir)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.join("service.log")).unwrap())
            .spawn()
            .expect("start podman system service");
        self.service = Some(service);
        wait_until("podman's socket", 30, || self.socket.exists());
    }

    /// The engine goes away (its socket file stays, as after a crash).
    pub fn stop_service(&mut self) {
        if let Some(mut service) = self.service.take() {
            let _ = service.kill();
            let _ = service.wait();
        }
    }

    pub fn command(&self) -> Command {
        let mut command = Command::new("podman");
        command
            .args(podman_args(&self.dir))
            .env("CONTAINERS_CONF", self.dir.join("containers.conf"));
        command
    }

    /// busybox-static as `/bin/sh` and the other tools, and the shared
    /// libraries each of the `linked` executables needs (at the paths it
    /// asks for), imported as [`IMAGE`].
    fn build_image(&self, linked: &[PathBuf]) {
        let root = self.dir.join("rootfs");
        for sub in ["bin", "tmp", "etc", "usr/local/bin"] {
            std::fs::create_dir_all(root.join(sub)).unwrap();
        }
        let busybox = String::from_utf8(
            Command::new("sh")
                .args(["-c", "command -v busybox"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        std::fs::copy(busybox.trim(), root.join("bin/busybox")).unwrap();
        for tool in [
            "sh", "cat", "echo", "ls", "rm", "mkdir", "hostname", "test", "tr", "sleep", "env",
            "id", "touch", "head",
        ] {
            std::os::unix::fs::symlink("busybox", root.join("bin").join(tool)).unwrap();
        }
        std::fs::set_permissions(
            root.join("tmp"),
            std::os::unix::fs::PermissionsExt::from_mode(0o1777),
        )
        .unwrap();
        std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
        for executable in linked {
            let ldd = Command::new("ldd").arg(executable).output().unwrap();
            for line in String::from_utf8_lossy(&ldd.stdout).lines() {
                let path = line
                    .split_whitespace()
                    .find(|word| word.starts_with('/'))
                    .map(PathBuf::from);
                if let Some(path) = path.filter(|p| p.exists()) {
                    let target = root.join(path.strip_prefix("/").unwrap());
                    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
                    std::fs::copy(std::fs::canonicalize(&path).unwrap(), &target).unwrap();
                }
            }
        }
        let tar = self.dir.join("rootfs.tar");
        let packed = Command::new("tar")
            .arg("-C")
            .arg(&root)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .status()
            .unwrap();
        assert!(packed.success());
        let imported = self
            .command()
            .arg("import")
            .arg(&tar)
            .arg(IMAGE)
            .output()
            .unwrap();
        assert!(
            imported.status.success(),
            "podman import: {}",
            String::from_utf8_lossy(&imported.stderr)
        );
    }

    /// Names of this Podman's containers (all states) with a label.
    pub fn containers(&self) -> Vec<String> {
        let output = self
            .command()
            .args(["ps", "-a", "--format", "{{.Names}}", "--filter"])
            .arg("label=io.runway.controller")
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(str::to_owned)
            .filter(|l| !l.is_empty())
            .collect()
    }

    pub fn inspect(&self, name: &str) -> String {
        let output = self.command().arg("inspect").arg(name).output().unwrap();
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self
            .command()
            .args(["rm", "-a", "-f", "-t", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        self.stop_service();
        let _ = self
            .command()
            .args(["system", "reset", "-f"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
