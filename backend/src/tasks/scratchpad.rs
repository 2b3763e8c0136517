//! Long-horizon arithmetic with a written scratchpad: prompt `123+989=`, response
//! `3+9+0=12 2+8+1=11 1+9+1=11 =1112`.
//!
//! The response works column by column from the right: each step restates the
//! column's two digits and the carry coming in, then writes the column's value as
//! two digits (carry out, result digit). `*` multiplies by one digit the same way:
//! `1234*7=` -> `4*7+0=28 3*7+2=23 2*7+2=16 1*7+1=08 =8638`. After the steps come
//! `=` and the answer.
//!
//! Every step is 8 characters and a space, so with a character-level tokenizer a
//! response takes 9 tokens per column plus the answer: `digits` sets how long
//! responses get and `min_digits` how much they vary (each operand's length is
//! uniform in `min_digits..=digits`; a one-digit multiplier is drawn from 2..=9).
//! A spread of lengths is the point: it lets `jetd compare` show mismatch and
//! accuracy per response-length bucket.
//!
//! The verifier wants the whole scratchpad: a response is well formed only with
//! exactly one step per column (and the problem's operator in each), so RL cannot
//! shorten responses by jumping to the answer; it is correct when its answer is
//! right as well. The steps' arithmetic is not checked: a wrong step almost always
//! gives a wrong answer, and the answer is what the task asks for.

use std::fmt::Write;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::arithmetic::{canonical_integer, ArithOp};
use super::error::TaskError;
use super::problem::{Problem, Task, Verdict};
use super::split::{Generated, SeededSplit};

/// Longest operand allowed: 64 columns make responses of about 640 characters.
pub const SCRATCHPAD_MAX_DIGITS: u32 = 64;

/// One column of a scratchpad: `a op b + carry = out` (`out` in 0..=99).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub a: u8,
    pub op: ArithOp,
    pub b: u8,
    pub carry: u8,
    pub out: u8,
}

/// A parsed scratchpad response: its steps and its (canonical) answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    pub steps: Vec<Step>,
    pub answer: String,
}

/// Digits of a decimal string, least significant first (anything else is
/// skipped: misuse gives a wrong trace, never an underflow).
fn digits_rev(s: &str) -> Vec<u8> {
    s.bytes()
        .rev()
        .filter(u8::is_ascii_digit)
        .map(|b| b - b'0')
        .collect()
}

/// Columns (steps) the scratchpad of `a op b` has.
fn columns(a: &str, op: ArithOp, b: &str) -> usize {
    match op {
        ArithOp::Mul => a.len(),
        _ => a.len().max(b.len()),
    }
}

/// The scratchpad of `a op b` and its answer, for non-negative decimal operands
/// (`b` a single digit for `*`; `-` is not a scratchpad operator and gives `+`'s
/// columns).
pub fn scratchpad_trace(a: &str, op: ArithOp, b: &str) -> (String, String) {
    let (da, db) = (digits_rev(a), digits_rev(b));
    let n = columns(a, op, b);
    let mut text = String::with_capacity(9 * n + n + 2);
    let mut result_rev = Vec::with_capacity(n + 1);
    let mut carry = 0u8;
    for i in 0..n {
        let x = da.get(i).copied().unwrap_or(0);
        let (y, v) = match op {
            ArithOp::Mul => {
                let y = db.first().copied().unwrap_or(0);
                (y, x * y + carry)
            }
            _ => {
                let y = db.get(i).copied().unwrap_or(0);
                (y, x + y + carry)
            }
        };
        // `let _`: writing to a String cannot fail.
        let _ = write!(text, "{x}{}{y}+{carry}={v:02} ", op.symbol());
        result_rev.push(v % 10);
        carry = v / 10;
    }
    result_rev.push(carry);
    let raw: String = result_rev
        .iter()
        .rev()
        .map(|d| char::from(b'0' + d))
        .collect();
    let answer = canonical_integer(&raw).unwrap_or(raw);
    text.push('=');
    text.push_str(&answer);
    (text, answer)
}

fn parse_step(w: &str) -> Option<Step> {
    let b = w.as_bytes();
    if b.len() != 8 || b[3] != b'+' || b[5] != b'=' {
        return None;
    }
    let op = match b[1] {
        b'+' => ArithOp::Add,
        b'*' => ArithOp::Mul,
        _ => return None,
    };
    let d = |i: usize| b[i].is_ascii_digit().then(|| b[i] - b'0');
    Some(Step {
        a: d(0)?,
        op,
        b: d(2)?,
        carry: d(4)?,
        out: d(6)? * 10 + d(7)?,
    })
}

/// Parses a scratchpad response: whitespace-separated steps, then `=` and an
/// integer. `None` if it does not follow that grammar.
pub fn parse_trace(response: &str) -> Option<Trace> {
    let mut words: Vec<&str> = response.split_whitespace().collect();
    let last = words.pop()?;
    let answer = canonical_integer(last.strip_prefix('=')?)?;
    let steps = words
        .into_iter()
        .map(parse_step)
        .collect::<Option<Vec<_>>>()?;
    Some(Trace { steps, answer })
}

/// Operands and operator of a prompt `A+B=` or `A*B=`.
pub fn parse_prompt(prompt: &str) -> Option<(&str, ArithOp, &str)> {
    let body = prompt.strip_suffix('=')?;
    let i = body.find(['+', '*'])?;
    let op = if body.as_bytes()[i] == b'+' {
        ArithOp::Add
    } else {
        ArithOp::Mul
    };
    let (a, b) = (&body[..i], &body[i + 1..]);
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit());
    (digits(a) && digits(b) && (op == ArithOp::Add || b.len() == 1)).then_some((a, op, b))
}

/// How many of a response's steps equal the reference scratchpad's, and how many
/// the reference has (a finer measure of learning than the final answer).
pub fn steps_right(problem: &Problem, response: &str) -> (usize, usize) {
    let want: Vec<Option<Step>> = problem
        .demonstration
        .split_whitespace()
        .map(parse_step)
        .filter(Option::is_some)
        .collect();
    let got = response.split_whitespace().map(parse_step);
    let right = want.iter().zip(got).filter(|(w, g)| **w == *g).count();
    (right, want.len())
}

/// Scratchpad arithmetic task; see the module docs.
#[derive(Debug)]
pub struct ScratchpadTask {
    digits: u32,
    min_digits: u32,
    ops: Vec<ArithOp>,
    split: SeededSplit,
}

/// An operand of `len` digits (no leading zero unless it is a single digit).
fn operand(rng: &mut ChaCha8Rng, len: u32) -> String {
    let mut s = String::with_capacity(len as usize);
    for i in 0..len {
        let lo = if i == 0 && len > 1 { 1 } else { 0 };
        s.push(char::from(b'0' + rng.random_range(lo..10u8)));
    }
    s
}

impl ScratchpadTask {
    /// `digits` in 1..=64, `min_digits` in 1..=digits, operators `+` and/or `*`;
    /// `heldout` at most half of the distinct prompts.
    pub fn new(
        digits: u32,
        min_digits: u32,
        ops: &[ArithOp],
        heldout: usize,
        seed: u64,
    ) -> Result<Self, TaskError> {
        if !(1..=SCRATCHPAD_MAX_DIGITS).contains(&digits) {
            return Err(TaskError::Config {
                field: "digits",
                message: format!("must be in 1..={SCRATCHPAD_MAX_DIGITS}, got {digits}"),
            });
        }
        if !(1..=digits).contains(&min_digits) {
            return Err(TaskError::Config {
                field: "min_digits",
                message: format!("must be in 1..=digits ({digits}), got {min_digits}"),
            });
        }
        let mut uniq: Vec<ArithOp> = Vec::new();
        for &op in ops {
            if op == ArithOp::Sub {
                return Err(TaskError::Config {
                    field: "ops",
                    message: "the scratchpad task has \"+\" and \"*\", not \"-\"".into(),
                });
            }
            if !uniq.contains(&op) {
                uniq.push(op);
            }
        }
        if uniq.is_empty() {
            return Err(TaskError::Config {
                field: "ops",
                message: "needs at least one of \"+\", \"*\"".into(),
            });
        }
        // Distinct prompts: operands of each allowed length, squared for `+`,
        // times the 8 multipliers for `*`.
        let per_operand: f64 = (min_digits..=digits)
            .map(|l| {
                if l == 1 {
                    10.0
                } else {
                    9.0 * 10f64.powi(l as i32 - 1)
                }
            })
            .sum();
        let space: f64 = uniq
            .iter()
            .map(|op| match op {
                ArithOp::Mul => per_operand * 8.0,
                _ => per_operand * per_operand,
            })
            .sum();
        if heldout as f64 > space / 2.0 {
            return Err(TaskError::Config {
                field: "heldout",
                message: format!(
                    "{heldout} held-out problems is more than half of the {space} distinct prompts"
                ),
            });
        }
        let split = SeededSplit::new(
            "scratch",
            seed,
            heldout,
            Self::generator(digits, min_digits, uniq.clone()),
        )?;
        Ok(ScratchpadTask {
            digits,
            min_digits,
            ops: uniq,
            split,
        })
    }

    fn generator(
        digits: u32,
        min_digits: u32,
        ops: Vec<ArithOp>,
    ) -> impl Fn(&mut ChaCha8Rng) -> Generated {
        move |rng: &mut ChaCha8Rng| {
            let op = ops[rng.random_range(0..ops.len())];
            let len = rng.random_range(min_digits..=digits);
            let a = operand(rng, len);
            let b = match op {
                ArithOp::Mul => rng.random_range(2..=9u8).to_string(),
                _ => {
                    let len = rng.random_range(min_digits..=digits);
                    operand(rng, len)
                }
            };
            let (demonstration, answer) = scratchpad_trace(&a, op, &b);
            Generated {
                prompt: format!("{a}{}{b}=", op.symbol()),
                answer,
                demonstration,
            }
        }
    }
}

impl Task for ScratchpadTask {
    fn name(&self) -> &str {
        "scratchpad"
    }

    fn train_problem(&self, index: u64) -> Problem {
        self.split.train(
            index,
            Self::generator(self.digits, self.min_digits, self.ops.clone()),
        )
    }

    fn heldout_problem(&self, index: u64) -> Problem {
        self.split.heldout(index)
    }

    fn heldout_size(&self) -> usize {
        self.split.heldout_size()
    }

    /// Well formed: a scratchpad with one step per column, each with the problem's
    /// operator, then `=` and an integer. Correct: well formed with the right answer.
    fn verify(&self, problem: &Problem, response: &str) -> Verdict {
        let (Some((a, op, b)), Some(t)) = (parse_prompt(&problem.prompt), parse_trace(response))
        else {
            return Verdict::MALFORMED;
        };
        if t.steps.len() != columns(a, op, b) || t.steps.iter().any(|s| s.op != op) {
            return Verdict::MALFORMED;
        }
        if canonical_integer(problem.answer.trim()).as_deref() == Some(t.answer.as_str()) {
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

    fn prob(prompt: &str) -> Problem {
        let (a, op, b) = parse_prompt(prompt).unwrap();
        let (demonstration, answer) = scratchpad_trace(a, op, b);
        Problem {
            id: "x".into(),
            prompt: prompt.into(),
            answer,
            demonstration,
        }
    }

    #[test]
    fn traces_by_hand() {
        use ArithOp::*;
        let cases = [
            (
                "123",
                Add,
                "989",
                "3+9+0=12 2+8+1=11 1+9+1=11 =1112",
                "1112",
            ),
            ("5", Add, "47", "5+7+0=12 0+4+1=05 =52", "52"),
            ("0", Add, "0", "0+0+0=00 =0", "0"),
            (
                "1234",
                Mul,
                "7",
                "4*7+0=28 3*7+2=23 2*7+2=16 1*7+1=08 =8638",
                "8638",
            ),
            ("99", Mul, "9", "9*9+0=81 9*9+8=89 =891", "891"),
        ];
        for (a, op, b, text, answer) in cases {
            assert_eq!(
                scratchpad_trace(a, op, b),
                (text.to_string(), answer.to_string()),
                "{a}{op:?}{b}"
            );
        }
    }

    #[test]
    fn long_operands_add_exactly() {
        // 40-digit operands are beyond any integer type: check against digit-wise
        // addition of two known numbers.
        let a = "9".repeat(40);
        let (text, answer) = scratchpad_trace(&a, ArithOp::Add, "1");
        assert_eq!(answer, format!("1{}", "0".repeat(40)));
        assert_eq!(text.len(), 40 * 9 + 1 + 41);
        assert!(text.starts_with("9+1+0=10 9+0+1=10 "), "{text}");
    }

    #[test]
    fn parse_round_trips_and_rejects() {
        let t = parse_trace("3+9+0=12 2+8+1=11  1+9+1=11\n=01112 ").unwrap();
        assert_eq!(t.answer, "1112");
        assert_eq!(t.steps.len(), 3);
        assert_eq!(
            t.steps[1],
            Step {
                a: 2,
                op: ArithOp::Add,
                b: 8,
                carry: 1,
                out: 11
            }
        );
        for bad in [
            "",
            "=",
            "3+9+0=12",
            "3+9+0=12 1112",
            "3+9+0=2 =12",
            "3-9+0=12 =12",
            "3+9+0=123 =12",
            "a+9+0=12 =12",
            "3+9*0=12 =12",
            "=12 3+9+0=12",
        ] {
            assert_eq!(parse_trace(bad), None, "{bad:?}");
        }
        assert_eq!(parse_trace("=7").unwrap().steps, vec![]);
    }

    #[test]
    fn verify_table() {
        let t = ScratchpadTask::new(3, 1, &[ArithOp::Add, ArithOp::Mul], 10, 0).unwrap();
        let p = prob("123+989=");
        let m = prob("12*7=");
        let cases: &[(&Problem, &str, Verdict)] = &[
            (&p, "3+9+0=12 2+8+1=11 1+9+1=11 =1112", Verdict::CORRECT),
            (&p, " 3+9+0=12 2+8+1=11 1+9+1=11 =1112\n", Verdict::CORRECT),
            // Wrong steps but the right answer: the answer decides.
            (&p, "0+0+0=00 0+0+0=00 0+0+0=00 =1112", Verdict::CORRECT),
            (&p, "3+9+0=12 2+8+1=11 1+9+1=11 =1111", Verdict::WRONG),
            // Skipping columns, or the bare answer, is not the format.
            (&p, "3+9+0=12 2+8+1=11 =1112", Verdict::MALFORMED),
            (&p, "=1112", Verdict::MALFORMED),
            (&p, "1112", Verdict::MALFORMED),
            (&p, "3*9+0=27 2*8+2=18 1*9+1=10 =1112", Verdict::MALFORMED),
            (&p, "", Verdict::MALFORMED),
            (&m, "2*7+0=14 1*7+1=08 =84", Verdict::CORRECT),
            (&m, "2*7+0=14 1*7+1=08 =85", Verdict::WRONG),
            (&m, "2+7+0=09 1+7+0=08 =84", Verdict::MALFORMED),
        ];
        for (prob, resp, want) in cases {
            assert_eq!(t.verify(prob, resp), *want, "{} {resp:?}", prob.prompt);
        }
        let odd = Problem {
            prompt: "12-3=".into(),
            ..p.clone()
        };
        assert_eq!(t.verify(&odd, &p.demonstration), Verdict::MALFORMED);
    }

    #[test]
    fn demonstrations_verify_and_lengths_follow_digits() {
        let t = ScratchpadTask::new(12, 2, &[ArithOp::Add, ArithOp::Mul], 50, 3).unwrap();
        let (mut shortest, mut longest) = (usize::MAX, 0);
        for i in 0..500u64 {
            let p = if i < 50 {
                t.heldout_problem(i)
            } else {
                t.train_problem(i)
            };
            assert_eq!(t.verify(&p, &p.demonstration), Verdict::CORRECT, "{p:?}");
            assert_eq!(steps_right(&p, &p.demonstration), {
                let n = parse_trace(&p.demonstration).unwrap().steps.len();
                (n, n)
            });
            let (a, op, b) = parse_prompt(&p.prompt).unwrap();
            assert!((2..=12).contains(&a.len()), "{}", p.prompt);
            if op == ArithOp::Add {
                assert!((2..=12).contains(&b.len()), "{}", p.prompt);
                let want: u128 = a.parse::<u128>().unwrap() + b.parse::<u128>().unwrap();
                assert_eq!(p.answer, want.to_string());
            } else {
                assert!(('2'..='9').contains(&b.chars().next().unwrap()));
                let want: u128 = a.parse::<u128>().unwrap() * b.parse::<u128>().unwrap();
                assert_eq!(p.answer, want.to_string());
            }
            // 9 characters per column, then `=` and the answer.
            let n = columns(a, op, b);
            assert_eq!(p.demonstration.len(), 9 * n + 1 + p.answer.len());
            shortest = shortest.min(p.demonstration.len());
            longest = longest.max(p.demonstration.len());
        }
        assert!(shortest < 30 && longest > 110, "{shortest}..{longest}");
    }

    #[test]
    fn deterministic_and_disjoint() {
        let a = ScratchpadTask::new(4, 1, &[ArithOp::Add], 100, 7).unwrap();
        let b = ScratchpadTask::new(4, 1, &[ArithOp::Add], 100, 7).unwrap();
        let c = ScratchpadTask::new(4, 1, &[ArithOp::Add], 100, 8).unwrap();
        let held: HashSet<String> = (0..100).map(|i| a.heldout_problem(i).prompt).collect();
        assert_eq!(held.len(), 100);
        for i in 0..2000 {
            let p = a.train_problem(i);
            assert_eq!(p, b.train_problem(i));
            assert!(!held.contains(&p.prompt), "train {i} is held out");
        }
        let differ = (0..50)
            .filter(|&i| a.train_problem(i) != c.train_problem(i))
            .count();
        assert!(differ > 40, "seeds 7 and 8 agree too often ({differ})");
        assert_eq!(a.train_problem(3).id, "scratch-train-3");
    }

    #[test]
    fn config_errors() {
        let add = [ArithOp::Add];
        for (r, field) in [
            (ScratchpadTask::new(0, 1, &add, 1, 0), "digits"),
            (ScratchpadTask::new(65, 1, &add, 1, 0), "digits"),
            (ScratchpadTask::new(4, 0, &add, 1, 0), "min_digits"),
            (ScratchpadTask::new(4, 5, &add, 1, 0), "min_digits"),
            (ScratchpadTask::new(4, 1, &[], 1, 0), "ops"),
            (ScratchpadTask::new(4, 1, &[ArithOp::Sub], 1, 0), "ops"),
            // One-digit `*`: 10 * 8 = 80 prompts, at most 40 held out.
            (ScratchpadTask::new(1, 1, &[ArithOp::Mul], 41, 0), "heldout"),
        ] {
            match r {
                Err(TaskError::Config { field: f, .. }) => assert_eq!(f, field),
                other => panic!("expected a `{field}` error, got {other:?}"),
            }
        }
        assert!(ScratchpadTask::new(1, 1, &[ArithOp::Mul], 40, 0).is_ok());
        assert!(ScratchpadTask::new(64, 64, &add, 200, 0).is_ok());
    }
}
