//! Who a job runs as when the agent runs as root with `--job-user`: the
//! user looked up in the user database, and whether it can reach the
//! agent's work directory.

use std::path::PathBuf;

use anyhow::{bail, Context};

/// Who a job runs as, when not as the agent itself.
#[derive(Debug, Clone)]
pub(super) struct JobUser {
    pub(super) name: String,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) home: PathBuf,
}

impl JobUser {
    /// `name`, `uid` or `uid:gid`, looked up in the user database.
    pub(super) fn resolve(spec: &str) -> anyhow::Result<JobUser> {
        let (user, group) = match spec.split_once(':') {
            Some((user, group)) => (user, Some(group)),
            None => (spec, None),
        };
        let entry = match user.parse::<u32>() {
            Ok(uid) => passwd_by_uid(uid).or(Some(JobUser {
                name: uid.to_string(),
                uid,
                gid: uid,
                home: PathBuf::from("/"),
            })),
            Err(_) => passwd_by_name(user),
        };
        let Some(mut entry) = entry else {
            bail!("--job-user {spec:?}: no such user");
        };
        if let Some(group) = group {
            entry.gid = group
                .parse()
                .with_context(|| format!("--job-user {spec:?}: the group must be a number"))?;
        }
        if entry.uid == 0 {
            bail!("--job-user {spec:?} is root: choose an unprivileged user");
        }
        Ok(entry)
    }
}

fn passwd_by_name(name: &str) -> Option<JobUser> {
    let name = std::ffi::CString::new(name).ok()?;
    passwd_lookup(|entry, buffer, result| {
        // SAFETY: every pointer is valid for the call; `buffer` outlives it.
        unsafe {
            libc::getpwnam_r(
                name.as_ptr(),
                entry,
                buffer.as_mut_ptr(),
                buffer.len(),
                result,
            )
        }
    })
}

fn passwd_by_uid(uid: u32) -> Option<JobUser> {
    passwd_lookup(|entry, buffer, result| {
        // SAFETY: as above.
        unsafe { libc::getpwuid_r(uid, entry, buffer.as_mut_ptr(), buffer.len(), result) }
    })
}

/// Runs a `getpw*_r` call with room for its strings and copies the entry out.
fn passwd_lookup(
    call: impl Fn(*mut libc::passwd, &mut [libc::c_char], *mut *mut libc::passwd) -> libc::c_int,
) -> Option<JobUser> {
    let mut buffer: Vec<libc::c_char> = vec![0; 16 * 1024];
    // SAFETY: an all-zero `passwd` is a valid value (null pointers, zero ids).
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    if call(&mut entry, &mut buffer, &mut result) != 0 || result.is_null() {
        return None;
    }
    // SAFETY: on success the entry's strings point into `buffer`, which is
    // still alive, and are NUL-terminated.
    let text = |pointer: *const libc::c_char| unsafe {
        if pointer.is_null() {
            String::new()
        } else {
            std::ffi::CStr::from_ptr(pointer)
                .to_string_lossy()
                .into_owned()
        }
    };
    Some(JobUser {
        name: text(entry.pw_name),
        uid: entry.pw_uid,
        gid: entry.pw_gid,
        home: PathBuf::from(text(entry.pw_dir)),
    })
}

/// Whether `user` can reach `dir` (search permission on it and on every
/// directory above it), judged from the mode bits. Jobs start in a
/// directory under the work root; one the job user cannot reach would fail
/// every job, so the agent refuses to start instead.
pub(super) fn reachable_by(user: &JobUser, dir: &std::path::Path) -> Result<(), PathBuf> {
    use std::os::unix::fs::MetadataExt;
    for ancestor in dir.ancestors() {
        let Ok(metadata) = std::fs::metadata(ancestor) else {
            return Err(ancestor.to_path_buf());
        };
        let mode = metadata.mode();
        let searchable = if metadata.uid() == user.uid {
            mode & 0o100 != 0
        } else if metadata.gid() == user.gid {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        };
        if !searchable {
            return Err(ancestor.to_path_buf());
        }
    }
    Ok(())
}
