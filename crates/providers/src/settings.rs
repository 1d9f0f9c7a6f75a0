//! How settings are written in runway's configuration file, for the serde
//! derives of every type that appears there (a provider's kind here, the
//! rest of the file in `runway_server::config`): durations as operators
//! write them, and values that are written as their text.

/// A duration written `30s`, `2m`, `1h 30m`, `500ms`, `2days` (humantime's
/// form), or a bare number of seconds (`"30"` or `30`); written back in
/// the shortest exact form (`7d`, `300s`, `1500ms`).
pub mod duration {
    use std::fmt;
    use std::time::Duration;

    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serializer};

    /// `text` as a duration, or a message that says what is wrong.
    pub fn parse(text: &str) -> Result<Duration, String> {
        let text = text.trim();
        let refused = || format!("{text:?} is not a duration like 30s, 2m, 1h 30m or 500ms");
        // A bare number is seconds; anything else is humantime's form.
        if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            return text.parse().map(Duration::from_secs).map_err(|_| refused());
        }
        humantime::parse_duration(text).map_err(|_| refused())
    }

    /// The shortest exact form: whole days, else whole seconds, else
    /// milliseconds.
    pub fn format(duration: Duration) -> String {
        let millis = duration.as_millis();
        const DAY: u128 = 86_400_000;
        if millis >= DAY && millis.is_multiple_of(DAY) {
            format!("{}d", millis / DAY)
        } else if millis.is_multiple_of(1_000) {
            format!("{}s", millis / 1_000)
        } else {
            format!("{millis}ms")
        }
    }

    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format(*duration))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        struct DurationVisitor;
        impl Visitor<'_> for DurationVisitor {
            type Value = Duration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration like \"30s\", \"2m\" or \"1h 30m\"")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Duration, E> {
                parse(text).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, seconds: u64) -> Result<Duration, E> {
                Ok(Duration::from_secs(seconds))
            }
            fn visit_i64<E: de::Error>(self, seconds: i64) -> Result<Duration, E> {
                u64::try_from(seconds)
                    .map(Duration::from_secs)
                    .map_err(|_| E::custom(format!("{seconds} seconds is negative")))
            }
        }
        deserializer.deserialize_any(DurationVisitor)
    }
}

/// A value written as its text: `Display` to write, `FromStr` to read, so
/// the type's own parser (and its error message) is the only one.
pub mod text {
    use std::fmt::Display;
    use std::str::FromStr;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<T: Display, S: Serializer>(
        value: &T,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_str(value)
    }

    pub fn deserialize<'de, T, D>(deserializer: D) -> Result<T, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A boot time: a number of seconds, or `[min, max]` for a uniform range;
/// written back as `[min, max]`.
pub mod boot_seconds {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(range: &(f64, f64), serializer: S) -> Result<S::Ok, S::Error> {
        [range.0, range.1].serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<(f64, f64), D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            One(f64),
            Range(Vec<f64>),
        }
        let refused = || serde::de::Error::custom("must be a number of seconds or [min, max]");
        let (low, high) = match Written::deserialize(deserializer).map_err(|_| refused())? {
            Written::One(seconds) => (seconds, seconds),
            Written::Range(range) if range.len() == 2 => (range[0], range[1]),
            Written::Range(_) => return Err(refused()),
        };
        if low >= 0.0 && high >= low {
            Ok((low, high))
        } else {
            Err(refused())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::duration;

    #[test]
    fn durations_as_operators_write_them() {
        let cases = [
            ("30", Some(30_000)),
            ("30s", Some(30_000)),
            ("500ms", Some(500)),
            ("2m", Some(120_000)),
            ("1h 30m", Some(5_400_000)),
            ("1h30m", Some(5_400_000)),
            ("2days", Some(172_800_000)),
            (" 10s ", Some(10_000)),
            ("", None),
            ("ten seconds", None),
            ("-5s", None),
            ("5 parsecs", None),
        ];
        for (text, millis) in cases {
            let parsed = duration::parse(text).ok().map(|d| d.as_millis() as u64);
            assert_eq!(parsed, millis, "{text:?}");
        }
        assert_eq!(
            duration::parse("soon").unwrap_err(),
            "\"soon\" is not a duration like 30s, 2m, 1h 30m or 500ms"
        );
    }
}
