//! The wall clock, read only at the edges and passed inward as data, and
//! the one way times are written for people and APIs (RFC 3339, UTC).

use runway_core::Timestamp;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Now, by the system clock.
pub fn now() -> Timestamp {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis())
        .unwrap_or(0);
    Timestamp::from_millis(i64::try_from(millis).unwrap_or(i64::MAX))
}

/// `timestamp`'s time of day, `HH:MM` in UTC (its RFC 3339 form's, so the
/// same fallback when out of range).
pub fn hh_mm(timestamp: Timestamp) -> String {
    let text = rfc3339(timestamp);
    match text.get(11..16) {
        Some(time) => time.to_owned(),
        None => text,
    }
}

/// An RFC 3339 time (as [`rfc3339`] writes it) as a timestamp.
pub fn parse_rfc3339(text: &str) -> Option<Timestamp> {
    let parsed = OffsetDateTime::parse(text, &Rfc3339).ok()?;
    let millis = parsed.unix_timestamp_nanos() / 1_000_000;
    Some(Timestamp::from_millis(i64::try_from(millis).ok()?))
}

/// `timestamp` as RFC 3339 in UTC (its epoch milliseconds if out of range).
pub fn rfc3339(timestamp: Timestamp) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(timestamp.as_millis()) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| timestamp.as_millis().to_string())
}
