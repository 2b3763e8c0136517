//! Small formatting helpers shared by the subcommands and the console.

use serde_json::Value;

/// A number field of a metrics object.
pub fn num(m: &Value, key: &str) -> Option<f64> {
    m.get(key).and_then(Value::as_f64).filter(|x| x.is_finite())
}

/// An RL step of the metrics object (`phase` absent counts as RL).
pub fn is_rl(m: &Value) -> bool {
    m.get("phase")
        .and_then(Value::as_str)
        .is_none_or(|p| p == "rl")
}

pub fn is_abandoned(m: &Value) -> bool {
    m.get("abandoned").and_then(Value::as_bool).unwrap_or(false)
}

pub fn step_of(m: &Value) -> Option<u64> {
    m.get("step").and_then(Value::as_u64)
}

/// Where a run computes: `cpu`, `gpu 1`, or `gpu` for a GPU run not started yet.
pub fn device(r: &jet_proto::RunInfo) -> String {
    match (r.device.as_str(), r.gpu) {
        ("cuda", Some(g)) => format!("gpu {g}"),
        ("cuda", None) => "gpu".into(),
        (d, _) => d.into(),
    }
}

/// `x` with `d` decimals, or `-`.
pub fn opt(x: Option<f64>, d: usize) -> String {
    x.map_or_else(|| "-".into(), |x| format!("{x:.d$}"))
}

/// A value in a short form that keeps 3-4 significant digits: 0.0104, 1.2e-5, 18.2k.
pub fn short(x: f64) -> String {
    let a = x.abs();
    if x == 0.0 {
        "0".into()
    } else if a >= 1e6 {
        format!("{:.1}M", x / 1e6)
    } else if a >= 1e4 {
        format!("{:.1}k", x / 1e3)
    } else if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else if a >= 1e-3 {
        let s = format!("{x:.4}");
        s.trim_end_matches('0').to_string()
    } else {
        format!("{x:.1e}")
    }
}

pub fn short_opt(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), short)
}

/// Bytes as B/kB/MB/GB (decimal units).
pub fn bytes(b: u64) -> String {
    let b = b as f64;
    if b >= 1e9 {
        format!("{:.1} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.1} kB", b / 1e3)
    } else {
        format!("{b} B")
    }
}

/// `YYYY-MM-DD HH:MM:SS` in UTC.
pub fn utc(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let t = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        t / 3600,
        t / 60 % 60,
        t % 60
    )
}

/// `HH:MM:SS` in UTC.
pub fn utc_time(unix_ms: u64) -> String {
    utc(unix_ms)[11..].to_string()
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Cut `s` to `n` characters, ending in `…` when cut.
pub fn ellipsize(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else if n == 0 {
        String::new()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_numbers() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_767_236_400_000), "2026-01-01 03:00:00");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(short(0.010_44), "0.0104");
        assert_eq!(short(18_234.0), "18.2k");
        assert_eq!(short(2.5e-5), "2.5e-5");
        assert_eq!(short(1.5), "1.50");
        assert_eq!(bytes(96_427_008), "96.4 MB");
        assert_eq!(ellipsize("abcdef", 4), "abc…");
    }
}
