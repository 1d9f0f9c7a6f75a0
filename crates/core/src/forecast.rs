//! The predictive policy's forecast (DESIGN §8): how many jobs will arrive
//! in a pool within the next horizon (one boot time and a round), at a
//! chosen quantile, learnt online from the arrivals seen so far — never
//! from the future.
//!
//! Arrivals are counted in ten-second buckets over the last four weeks
//! (as running totals, so any window's count is one subtraction). The
//! forecast for the window starting now has two parts:
//!
//! - **The recurring rate**: the quantile of the counts of horizon-long
//!   windows around this time (half an hour either side) on the seasonal
//!   days — each of the last six days that was a day like today, and the
//!   same weekday one to four weeks ago (time of week: a day is like today
//!   when its arrivals up to this time of day are within a factor of two
//!   of today's so far and, once a week has been seen, its total within a
//!   factor of two of today's weekday a week ago — a Saturday is not
//!   forecast from the Friday before it). Many windows, not one per day:
//!   bursts make single windows noisy, and a noisy forecast boots runners
//!   only to delete them. Before a day has been seen, the last hour's
//!   windows are the sample.
//! - **Scheduled batches** ([`batches`]): many jobs arriving within a
//!   few minutes, far above their background, recurring at about the same
//!   time of day on most of the days like today (or of the week on most
//!   weeks), tolerating a start that drifts by a quarter of an hour.
//!   Expected on top of the rate from one horizon before the batch's
//!   earliest likely start until it has arrived, or until it is clearly
//!   not coming today.
//! - **Groups in progress** ([`groups`]): where jobs come in groups
//!   (matrices, fan-outs) and no workflow run says so, a group's first
//!   arrivals announce the rest, as the key's (repository's) recent groups
//!   of at least that size went on — those of its jobs still to come that
//!   are worth a runner started now (a job seconds away saves little).
//!   The forecast takes the larger of these and the rate with the batches
//!   (a group is part of what the rate describes, and a batch arriving is
//!   a group too).
//!
//! - **Workflow runs in progress** ([`runs`]): when the first jobs of a run
//!   have arrived, its later jobs (`needs:`) are expected as its
//!   workflow's recent runs brought them. These jobs are known to be
//!   coming, and they are not part of the rate (which counts only a
//!   run's first jobs): they are added to it.
//!
//! The quantile is what the pool's operator pays for: [`quantile_for`]
//! turns the value of a minute of a job's wait, in minutes of a runner,
//! into the quantile that balances expected idle cost against expected
//! waiting (the newsvendor's critical ratio).
//!
//! Pure: the caller passes every arrival and the time in.

use std::collections::VecDeque;
use std::time::Duration;

use crate::time::Timestamp;

mod batches;
mod groups;
mod runs;

pub use batches::ExpectedBatch;

const BUCKET_MILLIS: i64 = 10_000;
const DAY_MILLIS: i64 = 86_400_000;
const WEEK_MILLIS: i64 = 7 * DAY_MILLIS;
const BUCKETS_PER_DAY: i64 = DAY_MILLIS / BUCKET_MILLIS;
const BUCKETS_PER_HOUR: i64 = 360;
/// Weeks of history kept and looked back on.
const WEEKS: i64 = 4;
/// Days looked back on at this time of day (the seventh is a weekly lag).
const DAYS: i64 = 6;
/// The neighbourhood of a seasonal lag: this many buckets either side.
const AROUND: i64 = 180;

/// What a minute of a job's wait is worth, in minutes of a runner, when a
/// pool does not say.
pub const DEFAULT_WAIT_VALUE: f64 = 1.75;

/// How far back the forecast reads: four weeks, and an hour for the
/// neighbourhood of the oldest lag. A store's arrivals within it are what a
/// restarted forecast is seeded with.
pub const HISTORY: Duration = Duration::from_secs((WEEKS * WEEK_MILLIS / 1000 + 3_600) as u64);

/// The quantile at which a warm pool balances idling against waiting, when
/// a minute of a job's wait is worth `wait_value` minutes of a runner.
///
/// The k-th warm runner is worth keeping for the next horizon if the
/// chance p that at least k jobs arrive in it pays for its idle time: when
/// used it saves its job about one boot time of waiting (`wait_value` ×
/// the horizon, in runner time) and idles half a horizon on average before
/// its job comes; when not used it idles the whole horizon. Keep it while
/// `p × (wait_value − ½) ≥ 1 − p`, that is `p ≥ 1 / (wait_value + ½)`: the
/// forecast's quantile is `1 − 1 / (wait_value + ½)`, clamped to
/// [0.05, 0.99]. A wait worth one runner-minute gives the 0.33 quantile,
/// 1.75 (the default) 0.56, two 0.6, four 0.78.
pub fn quantile_for(wait_value: f64) -> f64 {
    if !wait_value.is_finite() || wait_value <= 0.5 {
        return 0.05;
    }
    (1.0 - 1.0 / (wait_value + 0.5)).clamp(0.05, 0.99)
}

/// The median of `values` (the lower of the middle two), sorting them.
fn median<T: Ord + Copy>(values: &mut [T]) -> Option<T> {
    values.sort_unstable();
    values.get(values.len().checked_sub(1)? / 2).copied()
}

/// The `wait_value` a quantile comes from (the inverse of
/// [`quantile_for`]).
fn wait_value_of(quantile: f64) -> f64 {
    1.0 / (1.0 - quantile.min(0.99)) - 0.5
}

#[derive(Debug, Clone, PartialEq)]
pub struct ArrivalForecast {
    /// The window forecast, in buckets.
    horizon: i64,
    quantile: f64,
    /// Index of the bucket `totals[0]` ends.
    first: i64,
    /// `totals[i]`: arrivals in buckets `first ..= first + i`.
    totals: VecDeque<u64>,
    runs: runs::Runs,
    groups: groups::Groups,
    /// Bursts far above their background, oldest first ([`batches`]).
    episodes: VecDeque<batches::Episode>,
    /// Buckets before this one have been scanned for episodes.
    scanned: i64,
}

/// What a forecast says about the window starting now.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Expected {
    /// Jobs expected in the window: the larger of the groups in progress
    /// and the recurring rate at the quantile with the scheduled batches
    /// expected now, and the runs' later jobs.
    pub jobs: u32,
    /// The recurring rate at the quantile (without batches, groups or
    /// runs).
    pub rate: u32,
    /// Of those, how many come in a recognised scheduled batch.
    pub batch: u32,
    /// Later jobs of workflow runs in progress expected in the window.
    pub following: u32,
    /// Jobs still to come of groups in progress (before the larger of
    /// this and the rate is taken).
    pub group: u32,
    /// The recurring batches: those wanted now (`warm`) and those due
    /// within twelve hours, earliest first.
    pub batches: Vec<ExpectedBatch>,
}

impl ArrivalForecast {
    /// `horizon`: how far ahead a runner started now must look (one boot
    /// time and a round; at least a bucket). `quantile` in (0, 1]: 0.5
    /// keeps the median arrivals warm, 0.9 covers nine windows in ten.
    pub fn new(horizon: Duration, quantile: f64) -> ArrivalForecast {
        let millis = i64::try_from(horizon.as_millis()).unwrap_or(DAY_MILLIS);
        ArrivalForecast {
            horizon: (millis.clamp(1, DAY_MILLIS / 24) + BUCKET_MILLIS - 1) / BUCKET_MILLIS,
            quantile: if quantile.is_finite() {
                quantile.clamp(0.01, 1.0)
            } else {
                0.9
            },
            first: 0,
            totals: VecDeque::new(),
            runs: runs::Runs::default(),
            groups: groups::Groups::default(),
            episodes: VecDeque::new(),
            scanned: i64::MIN,
        }
    }

    fn bucket(at: Timestamp) -> i64 {
        at.as_millis().div_euclid(BUCKET_MILLIS)
    }

    /// Buckets kept: the longest lag and its neighbourhood.
    fn keep(&self) -> i64 {
        WEEKS * WEEK_MILLIS / BUCKET_MILLIS + AROUND + self.horizon + 1
    }

    /// Counts one arrival at `at` of a job of workflow run `run` (its id
    /// and workflow name, when known) from `key` (its repository, or
    /// whoever it counts against; empty when unknown).
    pub fn observe_job(&mut self, at: Timestamp, run: Option<(u64, &str)>, key: &str) {
        let later = run.is_some_and(|(id, workflow)| self.runs.observe(id, workflow, at));
        if !later {
            self.groups.observe(key, at);
            self.observe(at);
        }
    }

    /// Counts one arrival at `at`. Arrivals should come in time order; one
    /// a little late is counted where it belongs, one earlier than the
    /// history kept is ignored.
    pub fn observe(&mut self, at: Timestamp) {
        let index = Self::bucket(at);
        if self.totals.is_empty() {
            self.first = index;
        }
        if index < self.first {
            return;
        }
        let keep = self.keep();
        let last = self.first + self.totals.len() as i64 - 1;
        if index - last > keep {
            // A silence longer than the history: start over rather than
            // write a month of buckets.
            self.totals.clear();
            self.episodes.clear();
            self.first = index;
        }
        let carried = self.totals.back().copied().unwrap_or(0);
        while self.first + (self.totals.len() as i64) <= index {
            self.totals.push_back(carried);
        }
        while self.totals.len() as i64 > keep {
            self.totals.pop_front();
            self.first += 1;
        }
        let from = (index - self.first) as usize;
        for total in self.totals.range_mut(from..) {
            *total += 1;
        }
        self.detect(index);
    }

    /// Arrivals before bucket `index` (clamped to the history kept).
    fn before(&self, index: i64) -> u64 {
        if index <= self.first {
            return 0;
        }
        let i = ((index - self.first - 1) as usize).min(self.totals.len() - 1);
        self.totals[i]
    }

    /// Arrivals in buckets `[start, end)`, if that is complete before
    /// bucket `current` and within the history seen.
    fn count(&self, start: i64, end: i64, current: i64) -> Option<u64> {
        if start < self.first || end > current {
            return None;
        }
        Some(self.before(end) - self.before(start))
    }

    /// Whether `day` was a day like `today`: its arrivals up to this time
    /// of day within a factor of two of today's so far, and its whole
    /// day's within a factor of two of today's weekday a week ago (when a
    /// week has been seen).
    fn like_today(&self, day: i64, today: i64, current: i64) -> bool {
        self.like_today_so_far(day, today, current) && self.like_by_week(day, today, current)
    }

    fn like_today_so_far(&self, day: i64, today: i64, current: i64) -> bool {
        let alike = |a: u64, b: u64| a.max(b) <= 2 * a.min(b) + 10;
        let elapsed = current - today * BUCKETS_PER_DAY;
        match (
            self.count(
                day * BUCKETS_PER_DAY,
                day * BUCKETS_PER_DAY + elapsed,
                current,
            ),
            self.count(today * BUCKETS_PER_DAY, current, current),
        ) {
            (Some(then), Some(now)) => alike(then, now),
            _ => true,
        }
    }

    /// Whether `day`'s arrivals were within a factor of two of today's
    /// weekday a week ago (true before a week has been seen). The days a
    /// scheduled batch is looked for on: not the so-far test, which the
    /// batch itself (arriving today at another minute than then) would
    /// fail.
    fn like_by_week(&self, day: i64, today: i64, current: i64) -> bool {
        let alike = |a: u64, b: u64| a.max(b) <= 2 * a.min(b) + 10;
        let total = |d: i64| self.count(d * BUCKETS_PER_DAY, (d + 1) * BUCKETS_PER_DAY, current);
        match (total(today - 7), total(day)) {
            (Some(week_ago), Some(then)) => alike(week_ago, then),
            _ => true,
        }
    }

    fn at_quantile(&self, sample: &mut [u64]) -> u64 {
        if sample.is_empty() {
            return 0;
        }
        sample.sort_unstable();
        let rank = (self.quantile * sample.len() as f64).ceil() as usize;
        sample[rank.clamp(1, sample.len()) - 1]
    }

    /// The jobs expected within the horizon from `now`, at the quantile.
    pub fn expected(&mut self, now: Timestamp) -> u32 {
        self.explain(now).jobs
    }

    /// [`ArrivalForecast::expected`] at another quantile (a stopped stock's,
    /// from the same history: `crate::stopped::quantile_for`).
    pub fn expected_at(&mut self, now: Timestamp, quantile: f64) -> u32 {
        self.explain_at(now, quantile).jobs
    }

    /// [`ArrivalForecast::explain`] at another quantile.
    pub fn explain_at(&mut self, now: Timestamp, quantile: f64) -> Expected {
        let own = self.quantile;
        if quantile.is_finite() {
            self.quantile = quantile.clamp(0.01, 1.0);
        }
        let expected = self.explain(now);
        self.quantile = own;
        expected
    }

    /// [`ArrivalForecast::expected`], with its parts: the scheduled
    /// batches, the groups and the runs in progress.
    /// (`&mut`: the history up to now is scanned for batches first.)
    pub fn explain(&mut self, now: Timestamp) -> Expected {
        if self.totals.is_empty() {
            return Expected::default();
        }
        let current = Self::bucket(now);
        self.detect(current);
        let h = self.horizon;
        let today = current.div_euclid(BUCKETS_PER_DAY);
        let seen = |days: &i64| current - days * BUCKETS_PER_DAY >= self.first;
        // A day counts for batches once its history starts within two
        // hours after this time of it (a trace may start with a batch).
        let seen_near =
            |days: &i64| current - days * BUCKETS_PER_DAY + 2 * BUCKETS_PER_HOUR >= self.first;
        let daily: Vec<i64> = (1..=DAYS)
            .filter(seen)
            .filter(|day| self.like_today(today - day, today, current))
            .collect();
        let weekly: Vec<i64> = (1..=WEEKS).map(|week| 7 * week).filter(seen).collect();
        let batch_weeks: Vec<i64> = (1..=WEEKS).map(|week| 7 * week).filter(seen_near).collect();
        let lags: Vec<i64> = daily
            .iter()
            .chain(&weekly)
            .map(|days| days * BUCKETS_PER_DAY)
            .collect();
        let mut sample = Vec::with_capacity(lags.len() * (2 * AROUND / h + 1) as usize);
        let mut windows = 0;
        for lag in &lags {
            let at = current - lag;
            let from = sample.len();
            let mut start = at - AROUND;
            while start + h <= at + AROUND {
                sample.extend(self.count(start, start + h, current));
                start += h;
            }
            windows += sample.len() - from;
        }
        if windows == 0 {
            // No seasonal day yet: the last hour's windows.
            let mut start = current - BUCKETS_PER_HOUR;
            while start + h <= current {
                sample.extend(self.count(start, start + h, current));
                start += h;
            }
        }
        let rate = u32::try_from(self.at_quantile(&mut sample)).unwrap_or(u32::MAX);
        let batch_days: Vec<i64> = (1..=DAYS)
            .filter(seen_near)
            .filter(|day| self.like_by_week(today - day, today, current))
            .collect();
        let batches = self.batches(current, &batch_days, &batch_weeks);
        let batch = batches
            .iter()
            .filter(|b| b.warm)
            .fold(0u32, |sum, b| sum.saturating_add(b.remaining));
        let group = self.groups.expected(
            now,
            self.horizon * BUCKET_MILLIS,
            wait_value_of(self.quantile),
        );
        let following = self
            .runs
            .expected(now, self.horizon * BUCKET_MILLIS, self.quantile);
        // A batch arriving is a group in progress too: not counted twice.
        let jobs = rate
            .saturating_add(batch)
            .max(group)
            .saturating_add(following);
        Expected {
            jobs,
            rate,
            batch,
            following,
            group,
            batches,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_millis(seconds * 1_000)
    }

    const DAY: i64 = 86_400;

    #[test]
    fn nothing_seen_nothing_expected() {
        let mut forecast = ArrivalForecast::new(Duration::from_secs(150), 0.9);
        assert_eq!(forecast.expected(at(1_000)), 0);
    }

    #[test]
    fn a_steady_rate_is_expected_to_continue() {
        let mut forecast = ArrivalForecast::new(Duration::from_secs(100), 0.5);
        // Four jobs every 100 s for an hour.
        for second in (0..3_600).step_by(25) {
            forecast.observe(at(second));
        }
        assert_eq!(forecast.expected(at(3_600)), 4);
    }

    #[test]
    fn yesterday_at_this_time_counts_even_when_the_last_hour_was_quiet() {
        let mut forecast = ArrivalForecast::new(Duration::from_secs(100), 0.9);
        // Yesterday 09:00–10:00: 10 jobs per 100 s; nothing since.
        let nine = 9 * 3_600;
        for second in (nine..nine + 3_600).step_by(10) {
            forecast.observe(at(second));
        }
        let today_nine = DAY + nine;
        forecast.observe(at(today_nine - 5_000)); // something, hours ago
        assert!(forecast.expected(at(today_nine)) >= 10);
        // At 03:00 yesterday there was nothing.
        assert_eq!(forecast.expected(at(DAY + 3 * 3_600)), 0);
    }

    #[test]
    fn the_future_is_never_consulted() {
        let mut forecast = ArrivalForecast::new(Duration::from_secs(100), 1.0);
        for _ in 0..50 {
            forecast.observe(at(1_050)); // all in the current window
        }
        assert_eq!(
            forecast.expected(at(1_060)),
            0,
            "the current window is not complete: it is not in the sample"
        );
        assert_eq!(forecast.expected(at(1_150)), 50);
    }

    /// A batch of 30 at 02:00:00 on weekdays (days 0–4 of each week), a
    /// trickle otherwise: by the second week it is recognised, expected
    /// from one horizon before 02:00 until it arrives, and not on the
    /// weekend.
    #[test]
    fn a_weekday_batch_at_the_same_minute_is_recognised() {
        let mut forecast = ArrivalForecast::new(Duration::from_secs(190), 0.6);
        let two = 2 * 3_600;
        let mut arrivals = Vec::new();
        for day in 0..21 {
            let weekday = day % 7 < 5;
            // A job every 20 minutes, all day; every 80 on weekends.
            let every = if weekday { 1_200 } else { 4_800 };
            arrivals.extend((0..DAY / every).map(|i| day * DAY + i * every + 7));
            if weekday {
                arrivals.extend(std::iter::repeat_n(day * DAY + two, 30));
            }
        }
        arrivals.sort_unstable();
        let forecast_at = |forecast: &mut ArrivalForecast, seen: &[i64], when: i64| {
            for &t in seen.iter().filter(|t| **t < when) {
                forecast.observe(at(t));
            }
            forecast.explain(at(when))
        };
        // Tuesday of week 3 (day 15), 100 s before 02:00: learnt from the
        // first two weeks.
        let tuesday = 15 * DAY + two;
        let before = forecast_at(&mut forecast, &arrivals, tuesday - 100);
        assert!(before.jobs >= 30, "{before:?}");
        assert!(before.batch >= 25, "{before:?}");
        // An hour earlier, only the trickle.
        let mut early = ArrivalForecast::new(Duration::from_secs(190), 0.6);
        let hour_before = forecast_at(&mut early, &arrivals, tuesday - 3_600);
        assert!(hour_before.jobs <= 1, "{hour_before:?}");
        assert_eq!(hour_before.batch, 0);
        // Saturday of week 3 (day 19) at the same time: no batch (its
        // weekday lags are unlike it, last Saturday had none).
        let mut weekend = ArrivalForecast::new(Duration::from_secs(190), 0.6);
        let saturday = forecast_at(&mut weekend, &arrivals, 19 * DAY + two - 100);
        assert!(saturday.jobs <= 1, "{saturday:?}");
    }

    /// Feeds `arrivals` (seconds, sorted) before `when` to a fresh
    /// forecast looking 190 s ahead and asks it at `when`.
    fn asked(arrivals: &[i64], when: i64, quantile: f64) -> Expected {
        let mut forecast = ArrivalForecast::new(Duration::from_secs(190), quantile);
        for &t in arrivals.iter().filter(|t| **t < when) {
            forecast.observe_job(at(t), None, "");
        }
        forecast.explain(at(when))
    }

    /// A small random generator for test workloads (xorshift).
    struct Noise(u64);
    impl Noise {
        fn next(&mut self) -> f64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// A nightly batch of 150 jobs over two minutes, starting between
    /// 02:00 and 02:15 (a different time each day), and a job every ten
    /// minutes all day: the batch's start on each day.
    fn drifting(days: i64, noise: &mut Noise, arrivals: &mut Vec<i64>) -> Vec<i64> {
        let mut starts = Vec::new();
        for day in 0..days {
            arrivals.extend((0..144).map(|i| day * DAY + i * 600 + 3));
            let start = day * DAY + 2 * 3_600 + (noise.next() * 900.0) as i64;
            starts.push(start);
            arrivals.extend((0..150).map(|i| start + (i * 120) / 150));
        }
        arrivals.sort_unstable();
        starts
    }

    #[test]
    fn a_drifting_nightly_batch_is_warm_before_its_earliest_start_from_its_fourth_night() {
        let mut noise = Noise(7);
        let mut arrivals = Vec::new();
        let starts = drifting(10, &mut noise, &mut arrivals);
        for day in 3..10usize {
            let seen = &starts[day.saturating_sub(6)..day];
            let earliest = seen.iter().map(|s| s % DAY).min().unwrap();
            // One horizon (190 s) before the earliest start seen, less a
            // few seconds: the batch is expected.
            let when = day as i64 * DAY + earliest - earliest % 300 - 180;
            let e = asked(&arrivals, when, 0.56);
            assert!(e.batch >= 140, "night {day}: {e:?}");
            assert_eq!(e.batches.len(), 1, "{e:?}");
            let batch = &e.batches[0];
            assert!(batch.warm);
            assert!(batch.seen as usize >= 3.min(day), "{batch:?}");
            // Down to the five minutes: a schedule's cron minute.
            assert_eq!(
                batch.earliest.as_millis() / 1000,
                day as i64 * DAY + earliest - earliest % 300
            );
            // Half an hour before, it is listed as due but not wanted yet.
            let early = asked(&arrivals, when - 1_800, 0.56);
            assert_eq!(early.batch, 0, "{early:?}");
            assert!(
                early.batches.iter().any(|b| !b.warm && b.jobs >= 140),
                "{early:?}"
            );
            // Half of today's batch in: the rest is expected.
            let start = starts[day];
            let middle = asked(&arrivals, start + 61, 0.56);
            assert!((60..=90).contains(&middle.batch), "night {day}: {middle:?}");
            // All in: nothing more, but for a few the background's share
            // leaves (they are released ten minutes after its latest start).
            let after = asked(&arrivals, start + 130, 0.56);
            assert!(after.batch <= 8, "night {day}: {after:?}");
        }
        // Not on the third night: it has come only twice.
        let e = asked(&arrivals, 2 * DAY + 2 * 3_600 - 100, 0.56);
        assert_eq!(e.batch, 0, "{e:?}");
    }

    #[test]
    fn a_batch_that_does_not_come_is_released_and_one_that_stops_is_forgotten_in_two_days() {
        let mut noise = Noise(11);
        let mut arrivals = Vec::new();
        let starts = drifting(8, &mut noise, &mut arrivals);
        let latest = starts.iter().map(|s| s % DAY).max().unwrap();
        // Nights 8, 9, 10 without it (the trickle goes on).
        for day in 8..11 {
            arrivals.extend((0..144).map(|i| day * DAY + i * 600 + 3));
        }
        arrivals.sort_unstable();
        for (day, wanted) in [(8, true), (9, true), (10, false)] {
            let e = asked(&arrivals, day * DAY + 2 * 3_600 - 60, 0.56);
            assert_eq!(e.batch > 0, wanted, "day {day}: {e:?}");
            // Eleven minutes after its latest start seen, it is not
            // waited for any more.
            let gone = asked(&arrivals, day * DAY + latest + 660, 0.56);
            assert_eq!(gone.batch, 0, "day {day}: {gone:?}");
        }
    }

    #[test]
    fn a_weekly_batch_is_expected_on_its_weekday_only() {
        // 60 jobs at about 03:00 on day 6 of each week, a job every ten
        // minutes otherwise.
        let mut arrivals: Vec<i64> = Vec::new();
        for day in 0..22 {
            arrivals.extend((0..144).map(|i| day * DAY + i * 600 + 3));
            if day % 7 == 6 {
                let start = day * DAY + 3 * 3_600 + (day / 7) * 120;
                arrivals.extend((0..60).map(|i| start + i));
            }
        }
        arrivals.sort_unstable();
        let three = 3 * 3_600;
        // Day 13: seen once (a week ago): not yet.
        assert_eq!(asked(&arrivals, 13 * DAY + three - 60, 0.56).batch, 0);
        // Day 20: seen twice, a week ago too.
        let e = asked(&arrivals, 20 * DAY + three - 60, 0.56);
        assert!(e.batch >= 55, "{e:?}");
        assert!(e.batches[0].weekly, "{e:?}");
        // Not on the days around it.
        for day in [14, 15, 19] {
            let e = asked(&arrivals, day * DAY + three - 60, 0.56);
            assert_eq!(e.batch, 0, "day {day}: {e:?}");
        }
    }

    #[test]
    fn random_bursts_are_not_taken_for_a_schedule() {
        // Bursts of 2–30 at random times, about every 20 minutes, two weeks.
        let mut noise = Noise(3);
        let mut arrivals = Vec::new();
        let mut t = 0.0;
        while t < 14.0 * DAY as f64 {
            t += -1_200.0 * (1.0 - noise.next()).ln();
            let size = 2 + (noise.next() * 29.0) as i64;
            arrivals.extend((0..size).map(|i| t as i64 + i));
        }
        arrivals.sort_unstable();
        let mut forecast = ArrivalForecast::new(Duration::from_secs(190), 0.56);
        let (mut asked, mut batched) = (0, 0);
        let mut next = 0;
        for when in (7 * DAY..14 * DAY).step_by(60) {
            while next < arrivals.len() && arrivals[next] < when {
                forecast.observe_job(at(arrivals[next]), None, "");
                next += 1;
            }
            asked += 1;
            batched += u32::from(forecast.explain(at(when)).batch > 0);
        }
        assert!(batched * 100 <= asked, "{batched} of {asked} minutes");
    }

    #[test]
    fn a_group_in_progress_raises_the_forecast() {
        // Groups of 12 a repository, a second apart, every 20 minutes.
        let mut forecast = ArrivalForecast::new(Duration::from_secs(190), 0.56);
        let mut t = 0;
        for _ in 0..30 {
            for i in 0..12 {
                forecast.observe_job(at(t + i), None, "org/app");
            }
            t += 1_200;
        }
        let quiet = forecast.explain(at(t - 10));
        forecast.observe_job(at(t), None, "org/app");
        forecast.observe_job(at(t + 1), None, "org/app");
        let e = forecast.explain(at(t + 2));
        assert_eq!(e.group, 10, "{e:?}");
        assert!(e.jobs >= 10 && e.jobs > quiet.jobs, "{quiet:?} then {e:?}");
    }

    #[test]
    fn a_long_silence_does_not_cost_a_month_of_buckets() {
        let mut forecast = ArrivalForecast::new(Duration::from_secs(150), 0.9);
        forecast.observe(at(0));
        forecast.observe(at(365 * DAY));
        assert!(forecast.totals.len() as i64 <= forecast.keep());
        assert_eq!(forecast.expected(at(365 * DAY + 1_000)), 0);
    }

    #[test]
    fn the_quantile_follows_the_value_of_waiting() {
        assert!((quantile_for(1.0) - 1.0 / 3.0).abs() < 1e-9);
        assert!((quantile_for(2.0) - 0.6).abs() < 1e-9);
        assert!(quantile_for(4.0) > quantile_for(2.0));
        assert_eq!(quantile_for(0.0), 0.05);
        assert_eq!(quantile_for(f64::NAN), 0.05);
        assert_eq!(quantile_for(1e9), 0.99);
    }
}
