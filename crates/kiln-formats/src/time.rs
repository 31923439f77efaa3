//! RFC 3339 timestamps in UTC, as llama-bench's JSON and Ollama's API write them.

use std::time::{SystemTime, UNIX_EPOCH};

/// `t` as RFC 3339 UTC: `2025-01-31T12:00:00Z`, or with nanoseconds
/// (`2025-01-31T12:00:00.123456789Z`) when `nanos`. Times before 1970 read as 1970.
pub fn rfc3339_utc(t: SystemTime, nanos: bool) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, s) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (H. Hinnant, "chrono-compatible date algorithms").
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let frac = match nanos {
        true => format!(".{:09}", d.subsec_nanos()),
        false => String::new(),
    };
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}{frac}Z",
        s / 3600,
        s % 3600 / 60,
        s % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_dates() {
        let at = |s, n| rfc3339_utc(UNIX_EPOCH + Duration::from_nanos(s), n);
        assert_eq!(at(0, false), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400_000_000_000, false), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_700_000_000_000_000_000, false), "2023-11-14T22:13:20Z");
        assert_eq!(at(0, true), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(
            at(1_796_233_575_500_000_000, true),
            "2026-12-02T17:46:15.500000000Z"
        );
    }
}
