//! Wall-clock instants as plain data.

use std::fmt;
use std::time::Duration;

/// An instant as milliseconds since the Unix epoch.
///
/// Millisecond integers store identically in SQLite and PostgreSQL, compare
/// cheaply in SQL and are trivial to produce from a virtual clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

impl Timestamp {
    pub const fn from_millis(millis: i64) -> Timestamp {
        Timestamp(millis)
    }

    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// `self + duration`, saturating instead of overflowing.
    pub fn plus(self, duration: Duration) -> Timestamp {
        let millis = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
        Timestamp(self.0.saturating_add(millis))
    }

    /// `self - duration`, saturating instead of overflowing.
    pub fn minus(self, duration: Duration) -> Timestamp {
        let millis = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
        Timestamp(self.0.saturating_sub(millis))
    }

    /// How long after `earlier` this instant is; zero if it is not later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Timestamp::from_millis(i64::MAX - 1);
        assert_eq!(
            t.plus(Duration::from_secs(10)),
            Timestamp::from_millis(i64::MAX)
        );
        let a = Timestamp::from_millis(1_000);
        let b = Timestamp::from_millis(4_500);
        assert_eq!(b.since(a), Duration::from_millis(3_500));
        assert_eq!(a.since(b), Duration::ZERO);
    }
}
