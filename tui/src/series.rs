//! Curves for the dashboard: (step, value) points out of the metrics objects.

use serde_json::Value;

use crate::fmt::{is_abandoned, is_rl, num, step_of};

/// Weight of the previous value in the EMA (the console's `s` key).
pub const EMA_WEIGHT: f64 = 0.8;

/// `key` over the RL steps of the current line of the run (abandoned steps left out).
pub fn series(metrics: &[Value], key: &str) -> Vec<(f64, f64)> {
    points(metrics, key, false)
}

/// `key` over the steps abandoned by a rollback.
pub fn abandoned(metrics: &[Value], key: &str) -> Vec<(f64, f64)> {
    points(metrics, key, true)
}

fn points(metrics: &[Value], key: &str, gone: bool) -> Vec<(f64, f64)> {
    let mut v: Vec<(f64, f64)> = metrics
        .iter()
        .filter(|m| is_rl(m) && is_abandoned(m) == gone)
        .filter_map(|m| Some((step_of(m)? as f64, num(m, key)?)))
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

/// Exponential moving average of the values (steps kept).
pub fn ema(points: &[(f64, f64)], w: f64) -> Vec<(f64, f64)> {
    let mut acc: Option<f64> = None;
    points
        .iter()
        .map(|&(x, y)| {
            let s = acc.map_or(y, |a| w * a + (1.0 - w) * y);
            acc = Some(s);
            (x, s)
        })
        .collect()
}

/// Smallest and largest value, widened a little so that flat curves still show.
pub fn bounds(sets: &[&[(f64, f64)]]) -> Option<(f64, f64)> {
    let ys = sets.iter().flat_map(|s| s.iter().map(|p| p.1));
    let (lo, hi) = ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), y| {
        (l.min(y), h.max(y))
    });
    if !lo.is_finite() {
        return None;
    }
    let pad = ((hi - lo) * 0.05)
        .max(hi.abs().max(lo.abs()) * 0.01)
        .max(1e-9);
    Some((lo - pad, hi + pad))
}

/// Range of steps over the given sets.
pub fn x_range(sets: &[&[(f64, f64)]]) -> (f64, f64) {
    let xs = sets.iter().flat_map(|s| s.iter().map(|p| p.0));
    let (lo, hi) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), x| {
        (l.min(x), h.max(x))
    });
    if !lo.is_finite() {
        (0.0, 1.0)
    } else if hi <= lo {
        (lo, lo + 1.0)
    } else {
        (lo, hi)
    }
}

/// The log10 floor for exact zeros on a log chart: three decades under the
/// smallest positive value, or -9 when there is none.
pub fn log_floor(values: impl IntoIterator<Item = f64>) -> f64 {
    let smallest = values
        .into_iter()
        .filter(|v| *v > 0.0)
        .fold(f64::INFINITY, f64::min);
    if smallest.is_finite() {
        smallest.log10().floor() - 3.0
    } else {
        -9.0
    }
}

/// Log10 of each value, with values at or below zero put on `floor` (a log10).
pub fn log10(points: &[(f64, f64)], floor: f64) -> Vec<(f64, f64)> {
    points
        .iter()
        .map(|&(x, y)| (x, if y > 0.0 { y.log10().max(floor) } else { floor }))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn current_line_and_ema() {
        let ms = vec![
            json!({"phase":"sft","step":1,"loss":2.0}),
            json!({"phase":"rl","step":1,"reward_mean":0.0,"branch":0}),
            json!({"phase":"rl","step":2,"reward_mean":1.0,"branch":0,"abandoned":true}),
            json!({"phase":"rl","step":2,"reward_mean":0.5,"branch":1}),
        ];
        assert_eq!(series(&ms, "reward_mean"), vec![(1.0, 0.0), (2.0, 0.5)]);
        assert_eq!(abandoned(&ms, "reward_mean"), vec![(2.0, 1.0)]);
        let e = ema(&[(1.0, 0.0), (2.0, 1.0)], 0.8);
        assert!((e[1].1 - 0.2).abs() < 1e-12);
        assert_eq!(
            log10(&[(1.0, 0.0), (2.0, 0.01)], -6.0),
            vec![(1.0, -6.0), (2.0, -2.0)]
        );
    }
}
