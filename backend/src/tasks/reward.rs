//! Turning a verdict into a scalar reward.

use serde::{Deserialize, Serialize};

use super::problem::Verdict;

/// Reward weights. TOML: `[reward] correct = 1.0  format = 0.1`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RewardConfig {
    /// Reward of a correct response.
    pub correct: f64,
    /// Reward of a well-formed but wrong response.
    pub format: f64,
}

impl Default for RewardConfig {
    fn default() -> Self {
        RewardConfig {
            correct: 1.0,
            format: 0.0,
        }
    }
}

/// `cfg.correct` if correct, else `cfg.format` if well formed, else 0.
pub fn reward(v: Verdict, cfg: &RewardConfig) -> f64 {
    if v.correct {
        cfg.correct
    } else if v.well_formed {
        cfg.format
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reward_table() {
        let d = RewardConfig::default();
        assert_eq!(reward(Verdict::CORRECT, &d), 1.0);
        assert_eq!(reward(Verdict::WRONG, &d), 0.0);
        assert_eq!(reward(Verdict::MALFORMED, &d), 0.0);
        let c = RewardConfig {
            correct: 2.0,
            format: 0.25,
        };
        assert_eq!(reward(Verdict::CORRECT, &c), 2.0);
        assert_eq!(reward(Verdict::WRONG, &c), 0.25);
        assert_eq!(reward(Verdict::MALFORMED, &c), 0.0);
        // A "correct" verdict that somehow is not well formed still earns the full reward.
        let odd = Verdict {
            correct: true,
            well_formed: false,
        };
        assert_eq!(reward(odd, &c), 2.0);
    }

    #[test]
    fn reward_config_toml() {
        let c: RewardConfig = toml::from_str("format = 0.1").unwrap();
        assert_eq!(c.correct, 1.0);
        assert_eq!(c.format, 0.1);
        let e = toml::from_str::<RewardConfig>("corect = 1.0").unwrap_err();
        assert!(e.to_string().contains("corect"), "{e}");
    }
}
