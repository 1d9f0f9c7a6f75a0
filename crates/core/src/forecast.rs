//! The predictive policy's forecast (DESIGN §8): how many jobs will arrive
//! in a pool within one boot time from now, at a chosen quantile, learnt
//! online from the arrivals seen so far — never from the future.
//!
//! Arrivals are counted in windows one boot time long. The forecast for the
//! window starting now is the `quantile` of a sample of past counts: the
//! three most recent complete windows (the current rate) and, for each of
//! the last seven days, the windows at this time of day (the daily and
//! weekly cycle). A pool whose runners take one boot time to start keeps
//! that many warm, so the jobs of the next boot time find a runner waiting.
//!
//! Pure: the caller passes every arrival and the time in.

use std::collections::VecDeque;
use std::time::Duration;

use crate::time::Timestamp;

const DAY_MILLIS: i64 = 86_400_000;
/// Days of history kept, and looked back on at this time of day.
const DAYS: i64 = 7;
/// Recent complete windows in the sample.
const RECENT: i64 = 3;

#[derive(Debug, Clone, PartialEq)]
pub struct ArrivalForecast {
    window_millis: i64,
    quantile: f64,
    /// Index of the window `counts[0]` counts.
    first: i64,
    counts: VecDeque<u32>,
}

impl ArrivalForecast {
    /// `window`: one boot time (at least a second). `quantile` in (0, 1]:
    /// 0.5 keeps the median arrivals warm, 0.9 covers nine windows in ten.
    pub fn new(window: Duration, quantile: f64) -> ArrivalForecast {
        let window_millis = i64::try_from(window.as_millis())
            .unwrap_or(i64::MAX)
            .max(1_000);
        ArrivalForecast {
            window_millis,
            quantile: if quantile.is_finite() {
                quantile.clamp(0.01, 1.0)
            } else {
                0.9
            },
            first: 0,
            counts: VecDeque::new(),
        }
    }

    fn index(&self, at: Timestamp) -> i64 {
        at.as_millis().div_euclid(self.window_millis)
    }

    fn windows_per_day(&self) -> i64 {
        (DAY_MILLIS / self.window_millis).max(1)
    }

    /// Counts one arrival at `at`. Arrivals must come in time order (an
    /// earlier one than the history kept is ignored).
    pub fn observe(&mut self, at: Timestamp) {
        let index = self.index(at);
        if self.counts.is_empty() {
            self.first = index;
        }
        if index < self.first {
            return;
        }
        while self.first + (self.counts.len() as i64) <= index {
            self.counts.push_back(0);
        }
        let keep = (DAYS + 1) * self.windows_per_day() + 2;
        while self.counts.len() as i64 > keep {
            self.counts.pop_front();
            self.first += 1;
        }
        if let Some(count) = self.counts.get_mut((index - self.first) as usize) {
            *count = count.saturating_add(1);
        }
    }

    /// Arrivals in window `index`, if it is within the history seen.
    fn count(&self, index: i64, current: i64) -> Option<u32> {
        if index < self.first || index >= current {
            return None; // Before the history, or not complete yet.
        }
        Some(
            self.counts
                .get((index - self.first) as usize)
                .copied()
                .unwrap_or(0),
        )
    }

    /// The jobs expected in the next boot time from `now`, at the quantile.
    pub fn expected(&self, now: Timestamp) -> u32 {
        if self.counts.is_empty() {
            return 0;
        }
        let current = self.index(now);
        let per_day = self.windows_per_day();
        let mut sample: Vec<u32> = Vec::with_capacity((RECENT + 2 * DAYS) as usize);
        for back in 1..=RECENT {
            sample.extend(self.count(current - back, current));
        }
        for day in 1..=DAYS {
            // The window this time of day, and the next one it overlaps.
            let then = current - day * per_day;
            sample.extend(self.count(then, current));
            sample.extend(self.count(then + 1, current));
        }
        if sample.is_empty() {
            return 0;
        }
        sample.sort_unstable();
        let rank = (self.quantile * sample.len() as f64).ceil() as usize;
        sample[rank.clamp(1, sample.len()) - 1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_millis(seconds * 1_000)
    }

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
        let today_nine = 86_400 + nine;
        forecast.observe(at(today_nine - 5_000)); // something, hours ago
        assert!(forecast.expected(at(today_nine)) >= 10);
        // At 03:00 yesterday there was nothing.
        assert_eq!(forecast.expected(at(86_400 + 3 * 3_600)), 0);
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
        assert_eq!(forecast.expected(at(1_100)), 50);
    }
}
