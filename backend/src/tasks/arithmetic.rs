//! Multi-digit arithmetic: prompt `12+34=`, response `46`.
//!
//! Operands are uniform in `0..10^digits`; the usual precedence applies (`*` before `+`
//! and `-`, left to right otherwise), so `2+3*4=` has answer `14`. Results may be
//! negative (`3-10=` -> `-7`).

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::error::TaskError;
use super::problem::{Problem, Task, Verdict};
use super::split::{Generated, SeededSplit};

/// Every character an arithmetic prompt or response (demonstration) can contain.
/// Space is not produced by the generator but is kept for tokenizers that want it.
pub const ARITH_ALPHABET: &str = "0123456789+-*= ";

/// An arithmetic operator; in TOML `"+"`, `"-"` or `"*"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ArithOp {
    #[serde(rename = "+")]
    Add,
    #[serde(rename = "-")]
    Sub,
    #[serde(rename = "*")]
    Mul,
}

impl ArithOp {
    pub fn symbol(self) -> char {
        match self {
            ArithOp::Add => '+',
            ArithOp::Sub => '-',
            ArithOp::Mul => '*',
        }
    }
}

/// Arithmetic task; see the module docs.
#[derive(Debug)]
pub struct ArithmeticTask {
    digits: u32,
    operands: u32,
    ops: Vec<ArithOp>,
    split: SeededSplit,
}

/// Value of `nums[0] ops[0] nums[1] ...` with `*` binding tighter than `+`/`-`.
fn evaluate(nums: &[i128], ops: &[ArithOp]) -> i128 {
    let mut acc: i128 = 0;
    let mut sign: i128 = 1;
    let mut term = nums[0];
    for (op, &n) in ops.iter().zip(&nums[1..]) {
        match op {
            ArithOp::Mul => term *= n,
            ArithOp::Add | ArithOp::Sub => {
                acc += sign * term;
                sign = if *op == ArithOp::Add { 1 } else { -1 };
                term = n;
            }
        }
    }
    acc + sign * term
}

/// The canonical form of an integer literal (`-?[0-9]+`, leading zeros dropped, no `-0`),
/// or `None` if `s` is not one.
pub(crate) fn canonical_integer(s: &str) -> Option<String> {
    let (neg, digits) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let trimmed = digits.trim_start_matches('0');
    if trimmed.is_empty() {
        return Some("0".to_string());
    }
    Some(if neg {
        format!("-{trimmed}")
    } else {
        trimmed.to_string()
    })
}

impl ArithmeticTask {
    /// `digits` per operand in 1..=6, `operands` in 2..=3, at least one operator;
    /// `heldout` at most half of the distinct prompts.
    pub fn new(
        digits: u32,
        operands: u32,
        ops: &[ArithOp],
        heldout: usize,
        seed: u64,
    ) -> Result<Self, TaskError> {
        if !(1..=6).contains(&digits) {
            return Err(TaskError::Config {
                field: "digits",
                message: format!("must be in 1..=6, got {digits}"),
            });
        }
        if !(2..=3).contains(&operands) {
            return Err(TaskError::Config {
                field: "operands",
                message: format!("must be 2 or 3, got {operands}"),
            });
        }
        let mut uniq: Vec<ArithOp> = Vec::new();
        for &op in ops {
            if !uniq.contains(&op) {
                uniq.push(op);
            }
        }
        if uniq.is_empty() {
            return Err(TaskError::Config {
                field: "ops",
                message: "needs at least one of \"+\", \"-\", \"*\"".into(),
            });
        }
        // Distinct prompts: (10^digits)^operands * |ops|^(operands-1).
        let space =
            10f64.powi((digits * operands) as i32) * (uniq.len() as f64).powi(operands as i32 - 1);
        if heldout as f64 > space / 2.0 {
            return Err(TaskError::Config {
                field: "heldout",
                message: format!(
                    "{heldout} held-out problems is more than half of the {space} distinct prompts"
                ),
            });
        }
        let gen = Self::generator(digits, operands, uniq.clone());
        let split = SeededSplit::new("arith", seed, heldout, gen)?;
        Ok(ArithmeticTask {
            digits,
            operands,
            ops: uniq,
            split,
        })
    }

    fn generator(
        digits: u32,
        operands: u32,
        ops: Vec<ArithOp>,
    ) -> impl Fn(&mut ChaCha8Rng) -> Generated {
        let hi: i128 = 10i128.pow(digits);
        move |rng: &mut ChaCha8Rng| {
            let nums: Vec<i128> = (0..operands).map(|_| rng.random_range(0..hi)).collect();
            let chosen: Vec<ArithOp> = (1..operands)
                .map(|_| ops[rng.random_range(0..ops.len())])
                .collect();
            let mut prompt = nums[0].to_string();
            for (op, n) in chosen.iter().zip(&nums[1..]) {
                prompt.push(op.symbol());
                prompt.push_str(&n.to_string());
            }
            prompt.push('=');
            let answer = evaluate(&nums, &chosen).to_string();
            Generated {
                prompt,
                demonstration: answer.clone(),
                answer,
            }
        }
    }
}

impl Task for ArithmeticTask {
    fn name(&self) -> &str {
        "arithmetic"
    }

    fn train_problem(&self, index: u64) -> Problem {
        self.split.train(
            index,
            Self::generator(self.digits, self.operands, self.ops.clone()),
        )
    }

    fn heldout_problem(&self, index: u64) -> Problem {
        self.split.heldout(index)
    }

    fn heldout_size(&self) -> usize {
        self.split.heldout_size()
    }

    /// Well formed: the trimmed response is an integer literal. Correct: it equals the answer.
    fn verify(&self, problem: &Problem, response: &str) -> Verdict {
        let Some(got) = canonical_integer(response.trim()) else {
            return Verdict::MALFORMED;
        };
        let want = canonical_integer(problem.answer.trim());
        if want.as_deref() == Some(got.as_str()) {
            Verdict::CORRECT
        } else {
            Verdict::WRONG
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn task(seed: u64) -> ArithmeticTask {
        ArithmeticTask::new(2, 3, &[ArithOp::Add, ArithOp::Sub, ArithOp::Mul], 200, seed).unwrap()
    }

    #[test]
    fn evaluate_precedence() {
        use ArithOp::*;
        assert_eq!(evaluate(&[2, 3, 4], &[Add, Mul]), 14);
        assert_eq!(evaluate(&[2, 3, 4], &[Mul, Sub]), 2);
        assert_eq!(evaluate(&[10, 3, 4], &[Sub, Sub]), 3);
        assert_eq!(evaluate(&[10, 3, 4], &[Sub, Mul]), -2);
        assert_eq!(
            evaluate(&[999_999, 999_999, 999_999], &[Mul, Mul]),
            999_997_000_002_999_999
        );
    }

    #[test]
    fn deterministic_in_seed() {
        let (a, b, c) = (task(7), task(7), task(8));
        for i in 0..200 {
            assert_eq!(a.train_problem(i), b.train_problem(i));
            assert_eq!(a.heldout_problem(i), b.heldout_problem(i));
        }
        let diff = (0..50)
            .filter(|&i| a.train_problem(i) != c.train_problem(i))
            .count();
        assert!(diff > 40, "seeds 7 and 8 agree too often ({diff})");
        let diff = (0..50)
            .filter(|&i| a.heldout_problem(i).prompt != c.heldout_problem(i).prompt)
            .count();
        assert!(diff > 40);
    }

    #[test]
    fn train_never_heldout() {
        for (digits, ops) in [
            (2, vec![ArithOp::Add]),
            (1, vec![ArithOp::Add, ArithOp::Mul]),
        ] {
            // One-digit with + and *: 2*10^2 prompts, 100 held out (the densest allowed).
            let n = if digits == 1 { 100 } else { 200 };
            let t = ArithmeticTask::new(digits, 2, &ops, n, 1).unwrap();
            let held: HashSet<String> =
                (0..n as u64).map(|i| t.heldout_problem(i).prompt).collect();
            assert_eq!(held.len(), n);
            for i in 0..5000 {
                let p = t.train_problem(i);
                assert!(
                    !held.contains(&p.prompt),
                    "train {i} = held-out {}",
                    p.prompt
                );
            }
        }
    }

    #[test]
    fn demonstrations_verify_and_alphabet_covers() {
        let t =
            ArithmeticTask::new(6, 3, &[ArithOp::Add, ArithOp::Sub, ArithOp::Mul], 100, 3).unwrap();
        for i in 0..2000 {
            let p = if i < 100 {
                t.heldout_problem(i)
            } else {
                t.train_problem(i)
            };
            assert_eq!(t.verify(&p, &p.demonstration), Verdict::CORRECT, "{p:?}");
            assert!(p.prompt.ends_with('='));
            for ch in p.prompt.chars().chain(p.demonstration.chars()) {
                assert!(ARITH_ALPHABET.contains(ch), "{ch:?} in {p:?}");
            }
        }
    }

    #[test]
    fn prompt_shape() {
        let t = ArithmeticTask::new(2, 2, &[ArithOp::Add], 10, 0).unwrap();
        let p = t.train_problem(0);
        let (a, b) = p.prompt.trim_end_matches('=').split_once('+').unwrap();
        let want: i64 = a.parse::<i64>().unwrap() + b.parse::<i64>().unwrap();
        assert_eq!(p.answer, want.to_string());
        assert_eq!(p.demonstration, p.answer);
        assert_eq!(p.id, "arith-train-0");
    }

    #[test]
    fn verify_table() {
        let t = task(1);
        let p = Problem {
            id: "x".into(),
            prompt: "12+34=".into(),
            answer: "46".into(),
            demonstration: "46".into(),
        };
        let neg = Problem {
            answer: "-7".into(),
            ..p.clone()
        };
        let huge = "9".repeat(10_000);
        let cases: &[(&Problem, &str, Verdict)] = &[
            (&p, "46", Verdict::CORRECT),
            (&p, " 46\n", Verdict::CORRECT),
            (&p, "046", Verdict::CORRECT),
            (&p, "47", Verdict::WRONG),
            (&p, "-46", Verdict::WRONG),
            (&p, &huge, Verdict::WRONG),
            (&p, "", Verdict::MALFORMED),
            (&p, "   ", Verdict::MALFORMED),
            (&p, "-", Verdict::MALFORMED),
            (&p, "46=46", Verdict::MALFORMED),
            (&p, "4 6", Verdict::MALFORMED),
            (&p, "46.0", Verdict::MALFORMED),
            (&p, "+46", Verdict::MALFORMED),
            (&p, "forty-six", Verdict::MALFORMED),
            (&p, "４６", Verdict::MALFORMED),
            (&p, "46🙂", Verdict::MALFORMED),
            (&neg, "-7", Verdict::CORRECT),
            (&neg, "7", Verdict::WRONG),
            (&neg, "-007", Verdict::CORRECT),
        ];
        for (prob, resp, want) in cases {
            assert_eq!(t.verify(prob, resp), *want, "response {resp:?}");
        }
        let zero = Problem {
            answer: "0".into(),
            ..p
        };
        assert_eq!(t.verify(&zero, "-0"), Verdict::CORRECT);
        assert_eq!(t.verify(&zero, "000"), Verdict::CORRECT);
    }

    #[test]
    fn config_errors() {
        let all = [ArithOp::Add];
        assert!(matches!(
            ArithmeticTask::new(0, 2, &all, 1, 0),
            Err(TaskError::Config {
                field: "digits",
                ..
            })
        ));
        assert!(matches!(
            ArithmeticTask::new(7, 2, &all, 1, 0),
            Err(TaskError::Config {
                field: "digits",
                ..
            })
        ));
        assert!(matches!(
            ArithmeticTask::new(2, 4, &all, 1, 0),
            Err(TaskError::Config {
                field: "operands",
                ..
            })
        ));
        assert!(matches!(
            ArithmeticTask::new(2, 2, &[], 1, 0),
            Err(TaskError::Config { field: "ops", .. })
        ));
        // 1 digit, 2 operands, "+": 100 prompts, at most 50 held out.
        assert!(ArithmeticTask::new(1, 2, &all, 50, 0).is_ok());
        assert!(matches!(
            ArithmeticTask::new(1, 2, &all, 51, 0),
            Err(TaskError::Config {
                field: "heldout",
                ..
            })
        ));
        let t = ArithmeticTask::new(1, 2, &all, 0, 0).unwrap();
        assert_eq!(t.heldout_size(), 0);
        assert!(!t.train_problem(5).prompt.is_empty());
    }
}
