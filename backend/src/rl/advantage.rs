//! GRPO advantages: rewards normalised within each group of samples of one prompt.

/// Advantages for `rewards` laid out group after group (`group` samples each).
/// `A_i = (r_i - mean) / (std + eps)` with the sample (n-1) standard deviation,
/// or `r_i - mean` when `scale_by_std` is off (Dr. GRPO). A group whose rewards
/// are all equal gets zero advantages and is counted in the second value.
pub fn group_advantages(rewards: &[f64], group: usize, scale_by_std: bool) -> (Vec<f64>, usize) {
    assert!(
        group >= 2 && rewards.len().is_multiple_of(group),
        "{} rewards in groups of {group}",
        rewards.len()
    );
    let mut adv = Vec::with_capacity(rewards.len());
    let mut zero_std = 0;
    for g in rewards.chunks(group) {
        let n = g.len() as f64;
        let mean = g.iter().sum::<f64>() / n;
        let var = g.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1.0);
        let std = var.sqrt();
        if std == 0.0 {
            zero_std += 1;
            adv.extend(std::iter::repeat_n(0.0, g.len()));
            continue;
        }
        let denom = if scale_by_std { std + 1e-6 } else { 1.0 };
        adv.extend(g.iter().map(|r| (r - mean) / denom));
    }
    (adv, zero_std)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalised_per_group() {
        let (a, z) = group_advantages(&[1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0], 4, true);
        assert_eq!(z, 1);
        // Group 1: mean 0.5, sample std sqrt(1/3).
        let s = (1.0f64 / 3.0).sqrt() + 1e-6;
        assert!((a[0] - 0.5 / s).abs() < 1e-12 && (a[1] + 0.5 / s).abs() < 1e-12);
        assert_eq!(&a[4..], &[0.0; 4]);
        assert!(
            (a[..4].iter().sum::<f64>()).abs() < 1e-12,
            "advantages sum to zero in a group"
        );
        let (b, _) = group_advantages(&[2.0, 0.0], 2, false);
        assert_eq!(b, vec![1.0, -1.0]);
    }
}
