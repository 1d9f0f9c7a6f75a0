//! What a server process has used, read from `/proc`: its CPU time and
//! its memory. The benchmarks read the server's own figures this way, so
//! the load generator's cost never counts as the server's.

use std::time::Duration;

use anyhow::Context;

/// The CPU time (user + system) process `pid` has used.
pub(crate) fn cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("cannot read /proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces), from field 3.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |index: usize| -> anyhow::Result<u64> {
        fields
            .get(index)
            .and_then(|t| t.parse().ok())
            .with_context(|| format!("no field {} in /proc/{pid}/stat", index + 3))
    };
    // utime and stime are fields 14 and 15.
    let total = ticks(11)? + ticks(12)?;
    // SAFETY: sysconf has no memory effects.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(Duration::from_micros(total * 1_000_000 / per_second))
}

/// Process `pid`'s resident memory now, in MiB.
pub(crate) fn rss_mib(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read /proc/{pid}/status"))?;
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS")?;
    Ok(kib as f64 / 1024.0)
}

/// Process `pid`'s peak resident memory (VmHWM), in KiB.
pub(crate) fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The context switches, voluntary and not, process `pid`'s threads have
/// made (the threads alive now: the server's are long-lived).
pub(crate) fn context_switches(pid: u32) -> anyhow::Result<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .with_context(|| format!("cannot read /proc/{pid}/task"))?;
    let mut total = 0;
    for task in tasks.flatten() {
        // A thread that ended since the listing counts nothing.
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        total += status
            .lines()
            .filter_map(|line| {
                line.strip_prefix("voluntary_ctxt_switches:")
                    .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
            })
            .filter_map(|value| value.trim().parse::<u64>().ok())
            .sum::<u64>();
    }
    Ok(total)
}
