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
//! - **Scheduled batches**: several jobs that arrived within the same
//!   twenty seconds of the day on most of the seasonal days — a batch at
//!   the same minute on the same days. Expected on top of the rate, from
//!   one horizon before its minute until it has arrived.
//!
//! - **Workflow runs in progress** ([`runs`]): when the first jobs of a run
//!   have arrived, its later jobs (`needs:`) are expected as its
//!   workflow's recent runs brought them. These jobs are known to be
//!   coming, so the warm pool is never smaller than them: the forecast is
//!   the larger of the two parts above and these.
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

mod runs;

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
/// A batch must have recurred on at least this many seasonal days (and on
/// more than half of them)...
const BATCH_DAYS: usize = 3;
/// ... with at least this many jobs ...
const BATCH_JOBS: u64 = 3;
/// ... arriving within this many buckets.
const BATCH_SLOT: i64 = 2;

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
}

/// What a forecast says about the window starting now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    /// Jobs expected in the window: the larger of the recurring rate at
    /// the quantile with the batches, and the runs' later jobs.
    pub jobs: u32,
    /// Of the first, how many come in a recognised scheduled batch.
    pub batch: u32,
    /// Later jobs of workflow runs in progress expected in the window.
    pub following: u32,
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
    /// and workflow name, when known).
    pub fn observe_job(&mut self, at: Timestamp, run: Option<(u64, &str)>) {
        let later = run.is_some_and(|(id, workflow)| self.runs.observe(id, workflow, at));
        if !later {
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
        let alike = |a: u64, b: u64| a.max(b) <= 2 * a.min(b) + 10;
        let elapsed = current - today * BUCKETS_PER_DAY;
        let so_far = match (
            self.count(
                day * BUCKETS_PER_DAY,
                day * BUCKETS_PER_DAY + elapsed,
                current,
            ),
            self.count(today * BUCKETS_PER_DAY, current, current),
        ) {
            (Some(then), Some(now)) => alike(then, now),
            _ => true,
        };
        let total = |d: i64| self.count(d * BUCKETS_PER_DAY, (d + 1) * BUCKETS_PER_DAY, current);
        let weekly = match (total(today - 7), total(day)) {
            (Some(week_ago), Some(then)) => alike(week_ago, then),
            _ => true,
        };
        so_far && weekly
    }

    fn at_quantile(&self, sample: &mut [u64]) -> u64 {
        if sample.is_empty() {
            return 0;
        }
        sample.sort_unstable();
        let rank = (self.quantile * sample.len() as f64).ceil() as usize;
        sample[rank.clamp(1, sample.len()) - 1]
    }

    /// The jobs of scheduled batches expected in the window starting at
    /// bucket `current`: slots of the window (two buckets, a batch's
    /// seconds of jitter) that held at least [`BATCH_JOBS`] arrivals on
    /// most of the seasonal days, the median of those days' counts each.
    /// A burst lands in a given twenty seconds by chance on one day in
    /// many; a scheduled batch on every day it is scheduled.
    fn batch(&self, lags: &[i64], current: i64) -> u64 {
        if lags.len() < BATCH_DAYS {
            return 0;
        }
        let mut total = 0;
        let mut counts = Vec::with_capacity(lags.len());
        let mut slot = 0;
        while slot < self.horizon {
            counts.clear();
            counts.extend(
                lags.iter()
                    .filter_map(|lag| {
                        let at = current - lag + slot;
                        self.count(at, at + BATCH_SLOT, current)
                    })
                    .filter(|n| *n >= BATCH_JOBS),
            );
            if counts.len() >= BATCH_DAYS && 2 * counts.len() > lags.len() {
                counts.sort_unstable();
                total += counts[(counts.len() - 1) / 2];
                slot += BATCH_SLOT; // Its slot is counted; do not count it twice.
            } else {
                slot += 1;
            }
        }
        total
    }

    /// The jobs expected within the horizon from `now`, at the quantile.
    pub fn expected(&self, now: Timestamp) -> u32 {
        self.explain(now).jobs
    }

    /// [`ArrivalForecast::expected`], with how much of it is a recognised
    /// scheduled batch.
    pub fn explain(&self, now: Timestamp) -> Expected {
        if self.totals.is_empty() {
            return Expected {
                jobs: 0,
                batch: 0,
                following: 0,
            };
        }
        let current = Self::bucket(now);
        let h = self.horizon;
        let today = current.div_euclid(BUCKETS_PER_DAY);
        let lags: Vec<i64> = (1..=DAYS)
            .filter(|day| self.like_today(today - day, today, current))
            .map(|day| day * BUCKETS_PER_DAY)
            .chain((1..=WEEKS).map(|week| 7 * week * BUCKETS_PER_DAY))
            .filter(|lag| current - lag >= self.first)
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
        let rate = self.at_quantile(&mut sample);
        let batch = self.batch(&lags, current);
        let following = self
            .runs
            .expected(now, self.horizon * BUCKET_MILLIS, self.quantile);
        let jobs = u32::try_from(rate + batch)
            .unwrap_or(u32::MAX)
            .saturating_add(following);

        Expected {
            jobs,
            batch: u32::try_from(batch).unwrap_or(u32::MAX),
            following,
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
        let forecast = ArrivalForecast::new(Duration::from_secs(150), 0.9);
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
