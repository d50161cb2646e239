//! How sizes and times read in the operator's tables.

pub use edgevol_driver::units::human_bytes;

use time::macros::format_description;
use time::OffsetDateTime;

/// A byte gauge of the exporter (an integer below 2^53, written as a float) as a size.
#[allow(clippy::cast_possible_truncation)] // exact: byte counts of a pool are far below 2^53
pub fn gauge_bytes(value: f64) -> String {
    human_bytes(value as i64)
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM:SS` (UTC); a time outside the calendar
/// `time` knows (years ±9999) as the number of seconds.
pub fn utc(seconds: i64) -> String {
    let format = format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
    OffsetDateTime::from_unix_timestamp(seconds)
        .ok()
        .and_then(|t| t.format(format).ok())
        .unwrap_or_else(|| format!("{seconds} s after the epoch"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_utc_calendar_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_709_251_199), "2024-02-29 23:59:59");
        assert_eq!(utc(-1), "1969-12-31 23:59:59");
        assert_eq!(utc(i64::MAX), format!("{} s after the epoch", i64::MAX));
    }
}
