//! How sizes read in every edgevol tool's output (the operator's tables, edgevold's format
//! progress): one rendering, so the same size never reads two ways.

/// A size in binary units: whole bytes below 1 KiB, then one decimal below 100 of a unit
/// (`1.5 GiB`), whole units from 100 on (`200 MiB`). Truncated, never rounded up: a pool
/// shown with `2.0 GiB` free has at least 2 GiB free.
pub fn human_bytes(bytes: i64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut unit = 0;
    let mut whole = bytes.unsigned_abs();
    let mut rem = 0;
    while whole >= 1024 && unit + 1 < UNITS.len() {
        rem = whole % 1024;
        whole /= 1024;
        unit += 1;
    }
    let sign = if bytes < 0 { "-" } else { "" };
    if unit == 0 || whole >= 100 {
        format!("{sign}{whole} {}", UNITS[unit])
    } else {
        format!("{sign}{whole}.{} {}", rem * 10 / 1024, UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_truncate_to_one_decimal_below_a_hundred_units() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(1536 << 20), "1.5 GiB");
        assert_eq!(human_bytes(16 << 30), "16.0 GiB");
        assert_eq!(human_bytes(200 << 20), "200 MiB");
        // 1.999 GiB is shown as 1.9, not rounded up to 2.0.
        assert_eq!(human_bytes((2 << 30) - 1), "1.9 GiB");
        assert_eq!(human_bytes(3 << 40), "3.0 TiB");
        assert_eq!(human_bytes(-(1536 << 10)), "-1.5 MiB");
        assert_eq!(human_bytes(i64::MAX), "7.9 EiB");
        assert_eq!(human_bytes(i64::MIN), "-8.0 EiB");
    }
}
