//! Secrets leave runway's own environment once they are read.
//!
//! `env:NAME` secrets are resolved when the configuration loads; after that
//! the variable has no use, and left in place any child that inherited the
//! environment by mistake, or any process of the same user reading
//! `/proc/PID/environ`, would see it. [`scrub`] removes each one from the
//! environment *and* overwrites its value where the kernel shows it: the
//! strings `/proc/PID/environ` reads are the ones the process started with,
//! which `remove_var` alone leaves in memory.

use std::ffi::CStr;

extern "C" {
    /// The C library's environment: a null-terminated array of
    /// `NAME=value` strings.
    static mut environ: *mut *mut libc::c_char;
}

/// Removes each named variable from this process's environment and
/// overwrites its value in place with NUL bytes.
///
/// Must run while this process has a single thread (before the async
/// runtime starts): the C library's environment is not thread-safe.
pub fn scrub(names: &[String]) {
    for name in names {
        if name.is_empty() || name.contains('=') {
            continue;
        }
        // SAFETY: single-threaded (see above), so nothing changes
        // `environ` while it is walked. Every entry is a valid
        // NUL-terminated string the process owns and may write; only the
        // bytes between the `=` and the terminating NUL are overwritten,
        // so each entry stays a valid string.
        unsafe {
            let mut entry = std::ptr::addr_of!(environ).read();
            while !entry.is_null() && !(*entry).is_null() {
                let text = *entry;
                let bytes = CStr::from_ptr(text).to_bytes();
                let prefix = name.len();
                if bytes.len() > prefix
                    && bytes.starts_with(name.as_bytes())
                    && bytes[prefix] == b'='
                {
                    std::ptr::write_bytes(text.add(prefix + 1), 0, bytes.len() - prefix - 1);
                }
                entry = entry.add(1);
            }
        }
        std::env::remove_var(name);
    }
}
