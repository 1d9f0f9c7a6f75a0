//! Scheduled batches, recognised by their shape: many jobs arriving within
//! a few minutes, far above what the hours around them bring, recurring at
//! about the same time of day (or of week) — not at the same second:
//! GitHub's `schedule` trigger starts late under load, by up to a quarter
//! of an hour from one day to the next.
//!
//! **Episodes.** The arrivals seen are scanned once, an hour and a quarter
//! behind the newest (the hour after an episode is part of its
//! background): an episode starts where a five-minute window holds at
//! least [`MIN_JOBS`] arrivals more than the background and at least twice
//! it — the background being the median five-minute count of the two hours
//! around it, which a batch of a few minutes does not move. It runs from
//! the first arrival of that window that another follows within the
//! minute (a lone job of the background is not its start) to the end of
//! the densest window
//! starting within the next five minutes; its jobs are its arrivals less
//! the background's share. A batch longer than that is several episodes
//! in a row.
//!
//! **Recurrence.** Seen from now, the episodes of the seasonal days (the
//! days like today among the last six, and the same weekday one to four
//! weeks ago) at about this time of day are grouped when they start within
//! [`SPAN`] of each other. A group is a recurring batch when
//!
//! - *daily*: it came on at least [`MIN_DAYS`] of the days like today, on
//!   more than half of them, and on one of the last two — so a batch that
//!   stops coming is pre-warmed on two more days and no more, and one
//!   skipped day (a holiday) does not forget it; or
//! - *weekly*: it came on this weekday a week ago and on at least
//!   [`MIN_WEEKS`] of the weeks seen, on more than half of them, and not on
//!   the days either side of a week ago (that would be a daily batch, which
//!   the daily rule decides).
//!
//! Its earliest likely start is the earliest of its starts on those days
//! down to the whole five minutes (a schedule starts at its cron's minute
//! or later, and crons are set at whole five minutes or coarser: a few
//! days' starts do not show how early the next may come, the cron's
//! minute does), its latest the latest, its size the median of its days'
//! jobs. From one
//! horizon (a boot time and a round) before its earliest likely start, its
//! jobs not yet arrived today are expected; it is released once it has
//! arrived, or [`RELEASE`] after its latest likely start if it has not
//! come.

use super::{median, ArrivalForecast, BUCKETS_PER_DAY, BUCKET_MILLIS};
use crate::time::Timestamp;

/// Buckets in the window a batch arrives within (five minutes).
const WINDOW: i64 = 30;
/// The background of a window: this many windows either side (an hour).
const CONTEXT: i64 = 12;
/// An episode holds at least this many jobs above its background.
pub(super) const MIN_JOBS: u64 = 10;
/// A batch's starts on different days lie within this many buckets of
/// each other (twenty minutes: a quarter of an hour's drift and a margin).
const SPAN: i64 = 120;
/// A batch not come this long after its latest likely start is not coming
/// today (ten minutes).
const RELEASE: i64 = 60;
/// Days a daily batch must have come on...
const MIN_DAYS: usize = 3;
/// ... and weeks a weekly one.
const MIN_WEEKS: usize = 2;
/// A schedule stands alone: on the days it came, fewer than one other
/// episode every two days within this many buckets of it (an hour and a
/// half). Bursts every few minutes recur at any time of day; a schedule
/// does not hide among them.
const QUIET: i64 = 540;
/// Expected batches are listed this far ahead (twelve hours).
const LIST_AHEAD: i64 = 12 * 360;

/// A burst of arrivals far above its background.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Episode {
    /// Its first bucket.
    pub(super) start: i64,
    pub(super) jobs: u32,
}

/// A recurring batch found near now, in buckets from now.
struct Recurring {
    earliest: i64,
    latest: i64,
    jobs: u32,
    seen: u32,
    of: u32,
    weekly: bool,
}

/// A recurring batch as the forecast sees it from now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedBatch {
    /// Its earliest and latest likely start: the earliest and latest of
    /// its starts on the days it came, at today's date.
    pub earliest: Timestamp,
    pub latest: Timestamp,
    /// The jobs it brings: the median over the days it came.
    pub jobs: u32,
    /// Of those, not yet arrived (while it is expected).
    pub remaining: u32,
    /// On how many of the days (or weeks) looked at it came, and of how many.
    pub seen: u32,
    pub of: u32,
    /// Recurring weekly rather than daily.
    pub weekly: bool,
    /// Its runners are wanted now: from one horizon before its earliest
    /// likely start until it has arrived or is released.
    pub warm: bool,
}

impl ArrivalForecast {
    /// The background of the window starting in `block` (windows of
    /// [`WINDOW`] buckets): the median count of the windows an hour
    /// either side.
    fn background(&self, block: i64, current: i64) -> u64 {
        let mut counts: Vec<u64> = (block - CONTEXT..=block + CONTEXT)
            .filter_map(|b| self.count(b * WINDOW, (b + 1) * WINDOW, current))
            .collect();
        median(&mut counts).unwrap_or(0)
    }

    /// Scans for episodes up to where the counts and their background are
    /// complete before bucket `current`.
    pub(super) fn detect(&mut self, current: i64) {
        let upto = current - (CONTEXT + 3) * WINDOW;
        let mut s = self.scanned.max(self.first);
        let mut cached = (i64::MIN, 0);
        let mut background = |forecast: &ArrivalForecast, bucket: i64| {
            let block = bucket.div_euclid(WINDOW);
            if cached.0 != block {
                cached = (block, forecast.background(block, current));
            }
            cached.1
        };
        while s < upto {
            let bg = background(self, s);
            let n = self.count(s, s + WINDOW, current).unwrap_or(0);
            if n < bg + MIN_JOBS || n < 2 * bg {
                s += 1;
                continue;
            }
            // The densest window starting within the next five minutes
            // (the latest of equals: where the batch's last job is).
            let mut densest = (n.saturating_sub(bg), s);
            for t in s + 1..s + WINDOW {
                let bg = background(self, t);
                let excess = self
                    .count(t, t + WINDOW, current)
                    .unwrap_or(0)
                    .saturating_sub(bg);
                if excess >= densest.0 {
                    densest = (excess, t);
                }
            }
            let end = densest.1 + WINDOW;
            // It starts at its window's first arrival followed by another
            // within the minute, above the background's share (a lone
            // job of the background just before is not its start).
            let minute = WINDOW / 5;
            let mut start = s;
            while start + 1 < end
                && (self.count(start, start + 1, current).unwrap_or(0) == 0
                    || self.count(start, start + minute, current).unwrap_or(0) < 2 + bg / 5)
            {
                start += 1;
            }
            let arrived = self.count(start, end, current).unwrap_or(0);
            let share = bg * (end - start) as u64 / WINDOW as u64;
            let jobs = arrived.saturating_sub(share);
            if jobs >= MIN_JOBS {
                self.episodes.push_back(Episode {
                    start,
                    jobs: u32::try_from(jobs).unwrap_or(u32::MAX),
                });
            }
            s = end;
        }
        self.scanned = s.max(self.scanned);
        while self.episodes.front().is_some_and(|e| e.start < self.first) {
            self.episodes.pop_front();
        }
    }

    /// The recurring batches starting within `[current + lo, current +
    /// hi]` (in buckets), seen from `current` with these seasonal days
    /// (`daily`: days like today among the last six, nearest first;
    /// `weekly`: 7, 14, … as far as seen).
    fn recurring(
        &self,
        current: i64,
        lo: i64,
        hi: i64,
        daily: &[i64],
        weekly: &[i64],
    ) -> Vec<Recurring> {
        // Every day that could matter: the seasonal ones, and those either
        // side of a week ago (a weekly batch is not on them).
        let mut lags: Vec<i64> = daily.iter().chain(weekly).copied().collect();
        lags.extend([6, 8]);
        lags.sort_unstable();
        lags.dedup();
        // (offset from now, jobs, lag in days)
        let mut seen: Vec<(i64, u32, i64)> = Vec::new();
        for &lag in &lags {
            let at = current - lag * BUCKETS_PER_DAY;
            if at + hi < self.first {
                continue;
            }
            let from = self.episodes.partition_point(|e| e.start < at + lo - QUIET);
            let to = self
                .episodes
                .partition_point(|e| e.start <= at + hi + QUIET);
            seen.extend(
                self.episodes
                    .range(from..to)
                    .map(|e| (e.start - at, e.jobs, lag)),
            );
        }
        seen.sort_unstable();
        let mut found = Vec::new();
        let mut i = 0;
        while i < seen.len() {
            let first = seen[i].0;
            let mut j = i;
            while j < seen.len() && seen[j].0 - first <= SPAN {
                j += 1;
            }
            let group = &seen[i..j];
            i = j;
            if !(lo..=hi).contains(&first) {
                continue;
            }
            // Per day: its jobs in the group, earliest and latest start.
            let day = |lag: i64| {
                let mut of_day = group.iter().filter(|(_, _, l)| *l == lag);
                let first = of_day.next()?;
                let (mut jobs, mut earliest, mut latest) = (first.1, first.0, first.0);
                for (offset, n, _) in of_day {
                    jobs = jobs.saturating_add(*n);
                    earliest = earliest.min(*offset);
                    latest = latest.max(*offset);
                }
                Some((jobs, earliest, latest))
            };
            let came = |lags: &[i64]| -> Vec<(u32, i64, i64)> {
                lags.iter().filter_map(|lag| day(*lag)).collect()
            };
            let on_daily = came(daily);
            let recent = daily.iter().take(2).any(|lag| day(*lag).is_some());
            let is_daily = on_daily.len() >= MIN_DAYS && 2 * on_daily.len() > daily.len() && recent;
            let on_weekly = came(weekly);
            let is_weekly = !is_daily
                && day(7).is_some()
                && on_weekly.len() >= MIN_WEEKS
                && 2 * on_weekly.len() > weekly.len()
                && day(6).is_none()
                && day(8).is_none();
            let (days, of) = if is_daily {
                (on_daily, daily.len())
            } else if is_weekly {
                (on_weekly, weekly.len())
            } else {
                continue;
            };
            let latest = days.iter().map(|d| d.2).max().unwrap_or(0);
            // A schedule starts at its cron's minute or later, never
            // earlier, and crons are set at whole five minutes (or
            // coarser): its earliest likely start is the earliest seen,
            // down to the five minutes. Three nights' starts do not show
            // how early the fourth may come; the cron's minute does.
            let earliest = days.iter().map(|d| d.1).min().unwrap_or(0);
            let earliest = earliest - (current + earliest).rem_euclid(WINDOW);
            // On the days it came, any other episode near it?
            let near = |offset: i64| {
                (earliest - QUIET..earliest).contains(&offset)
                    || (latest + 1..=latest + QUIET).contains(&offset)
            };
            let hit_lags: Vec<i64> = (if is_daily { daily } else { weekly })
                .iter()
                .copied()
                .filter(|lag| day(*lag).is_some())
                .collect();
            let others = seen
                .iter()
                .filter(|(offset, _, lag)| hit_lags.contains(lag) && near(*offset))
                .count();
            if 2 * others >= days.len() {
                continue;
            }
            let mut jobs: Vec<u32> = days.iter().map(|d| d.0).collect();
            found.push(Recurring {
                earliest,
                latest,
                jobs: median(&mut jobs).unwrap_or(0),
                seen: days.len() as u32,
                of: of as u32,
                weekly: is_weekly,
            });
        }
        found
    }

    /// The recurring batches expected from `current` (bucket), each with
    /// how many of its jobs are still to come and whether its runners are
    /// wanted now: those wanted now, and those due within twelve hours.
    pub(super) fn batches(
        &self,
        current: i64,
        daily: &[i64],
        weekly: &[i64],
    ) -> Vec<ExpectedBatch> {
        let horizon = self.horizon;
        let lo = -(SPAN + RELEASE);
        let found = self.recurring(current, lo, LIST_AHEAD, daily, weekly);
        if found.is_empty() {
            return Vec::new();
        }
        // Today's background, per bucket: the median five-minute count of
        // the last hour.
        let mut last_hour: Vec<u64> = (1..=CONTEXT)
            .filter_map(|k| self.count(current - k * WINDOW, current - (k - 1) * WINDOW, current))
            .collect();
        let background = median(&mut last_hour).unwrap_or(0);
        let at = |offset: i64| Timestamp::from_millis((current + offset) * BUCKET_MILLIS);
        found
            .into_iter()
            .map(|found| {
                let Recurring {
                    earliest,
                    latest,
                    jobs,
                    seen,
                    of,
                    weekly,
                } = found;
                let warm = earliest <= horizon && latest + RELEASE >= 0;
                let remaining = if warm {
                    // Today's arrivals since a span before its earliest
                    // likely start, less the background's share.
                    let from = current + earliest.min(0) - SPAN;
                    let arrived = self
                        .count(from.max(self.first), current, current)
                        .unwrap_or(0);
                    let share = background * (current - from) as u64 / WINDOW as u64;
                    let arrived = u32::try_from(arrived.saturating_sub(share)).unwrap_or(u32::MAX);
                    jobs.saturating_sub(arrived)
                } else {
                    0
                };
                ExpectedBatch {
                    earliest: at(earliest),
                    latest: at(latest),
                    jobs,
                    remaining,
                    seen,
                    of,
                    weekly,
                    warm: warm && remaining > 0,
                }
            })
            .filter(|batch| batch.warm || batch.earliest.as_millis() > current * BUCKET_MILLIS)
            .collect()
    }
}
