//! Countdown: reach a target with some of the given numbers and `+ - * /`.
//!
//! Prompt `3 7 9 -> 30:`, response e.g. `3*7+9`. Each given number may be used at most
//! once; division is exact (rational). The target is made by combining a random subset
//! (at least two) of the numbers with random operators, every intermediate value a
//! positive integer; that expression is the demonstration.

use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::error::TaskError;
use super::expr::{parse_expression, Rational};
use super::problem::{Problem, Task, Verdict};
use super::split::{Generated, SeededSplit};

/// Every character a countdown prompt or demonstration can contain (responses may also
/// contain spaces, which the verifier ignores).
pub const COUNTDOWN_ALPHABET: &str = "0123456789+-*/() >:";

/// Countdown task; see the module docs.
#[derive(Debug)]
pub struct CountdownTask {
    numbers: u32,
    max_number: u32,
    split: SeededSplit,
}

enum Node {
    Leaf(i128),
    Bin(u8, Box<Node>, Box<Node>),
}

fn prec(n: &Node) -> u8 {
    match n {
        Node::Leaf(_) => 3,
        Node::Bin(b'+' | b'-', ..) => 1,
        Node::Bin(..) => 2,
    }
}

/// Renders with the fewest parentheses that keep the (rational) value.
fn render(n: &Node, out: &mut String) {
    match n {
        Node::Leaf(v) => out.push_str(&v.to_string()),
        Node::Bin(op, l, r) => {
            let p = prec(n);
            render_child(l, prec(l) < p, out);
            out.push(*op as char);
            render_child(
                r,
                prec(r) < p || (prec(r) == p && matches!(op, b'-' | b'/')),
                out,
            );
        }
    }
}

fn render_child(n: &Node, paren: bool, out: &mut String) {
    if paren {
        out.push('(');
    }
    render(n, out);
    if paren {
        out.push(')');
    }
}

/// Combines a random subset (at least two) of `nums` into one expression tree; every
/// intermediate value is a positive integer.
fn combine(rng: &mut ChaCha8Rng, nums: &[i128]) -> (i128, Node) {
    let k = rng.random_range(2..=nums.len());
    let mut idx: Vec<usize> = (0..nums.len()).collect();
    idx.shuffle(rng);
    let mut items: Vec<(i128, Node)> = idx[..k]
        .iter()
        .map(|&i| (nums[i], Node::Leaf(nums[i])))
        .collect();
    while items.len() > 1 {
        let i = rng.random_range(0..items.len());
        let (a, an) = items.swap_remove(i);
        let j = rng.random_range(0..items.len());
        let (b, bn) = items.swap_remove(j);
        // a, b >= 1, so every option keeps the value a positive integer.
        let mut ops: Vec<u8> = vec![b'+', b'*'];
        if a > b {
            ops.push(b'-');
        }
        if a % b == 0 {
            ops.push(b'/');
        }
        let op = ops[rng.random_range(0..ops.len())];
        let v = match op {
            b'+' => a + b,
            b'*' => a * b,
            b'-' => a - b,
            _ => a / b,
        };
        items.push((v, Node::Bin(op, Box::new(an), Box::new(bn))));
    }
    items.pop().unwrap_or((nums[0], Node::Leaf(nums[0])))
}

/// Tries at most this many combinations for a target that is not itself one of the
/// numbers (which a bare literal would solve).
const TARGET_TRIES: usize = 16;

fn generate(rng: &mut ChaCha8Rng, count: u32, max_number: u32) -> Generated {
    let nums: Vec<i128> = (0..count)
        .map(|_| rng.random_range(1..=max_number) as i128)
        .collect();
    let mut made = combine(rng, &nums);
    for _ in 1..TARGET_TRIES {
        if !nums.contains(&made.0) {
            break;
        }
        made = combine(rng, &nums);
    }
    let (target, tree) = made;
    let mut demonstration = String::new();
    render(&tree, &mut demonstration);
    let listed: Vec<String> = nums.iter().map(|n| n.to_string()).collect();
    Generated {
        prompt: format!("{} -> {target}:", listed.join(" ")),
        answer: target.to_string(),
        demonstration,
    }
}

/// Numbers and target of a countdown prompt `a b c -> t:`.
fn parse_prompt(prompt: &str) -> Option<(Vec<u64>, i128)> {
    let body = prompt.trim().strip_suffix(':')?;
    let (nums, target) = body.split_once("->")?;
    let nums: Option<Vec<u64>> = nums.split_whitespace().map(|t| t.parse().ok()).collect();
    Some((nums?, target.trim().parse().ok()?))
}

impl CountdownTask {
    /// `numbers` in 2..=6, `max_number` in 1..=10000, `heldout` at most half of the
    /// possible number lists.
    pub fn new(
        numbers: u32,
        max_number: u32,
        heldout: usize,
        seed: u64,
    ) -> Result<Self, TaskError> {
        if !(2..=6).contains(&numbers) {
            return Err(TaskError::Config {
                field: "numbers",
                message: format!("must be in 2..=6, got {numbers}"),
            });
        }
        if !(1..=10_000).contains(&max_number) {
            return Err(TaskError::Config {
                field: "max_number",
                message: format!("must be in 1..=10000, got {max_number}"),
            });
        }
        // Each number list (ordered) is equally likely, so this bounds the held-out share
        // of the prompt distribution by one half.
        let lists = (max_number as f64).powi(numbers as i32);
        if heldout as f64 > lists / 2.0 {
            return Err(TaskError::Config {
                field: "heldout",
                message: format!(
                    "{heldout} held-out problems is more than half of the {lists} possible number lists"
                ),
            });
        }
        let split = SeededSplit::new("countdown", seed, heldout, |rng| {
            generate(rng, numbers, max_number)
        })?;
        Ok(CountdownTask {
            numbers,
            max_number,
            split,
        })
    }
}

impl Task for CountdownTask {
    fn name(&self) -> &str {
        "countdown"
    }

    fn train_problem(&self, index: u64) -> Problem {
        self.split
            .train(index, |rng| generate(rng, self.numbers, self.max_number))
    }

    fn heldout_problem(&self, index: u64) -> Problem {
        self.split.heldout(index)
    }

    fn heldout_size(&self) -> usize {
        self.split.heldout_size()
    }

    /// Well formed: the response parses and uses only given numbers, each at most once.
    /// Correct: also its exact value is the target (division by zero is wrong).
    fn verify(&self, problem: &Problem, response: &str) -> Verdict {
        let Some((mut available, target)) = parse_prompt(&problem.prompt) else {
            return Verdict::MALFORMED;
        };
        let Ok(parsed) = parse_expression(response) else {
            return Verdict::MALFORMED;
        };
        for lit in &parsed.literals {
            match available.iter().position(|a| a == lit) {
                Some(i) => {
                    available.swap_remove(i);
                }
                None => return Verdict::MALFORMED,
            }
        }
        if parsed.value == Ok(Rational::integer(target)) {
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

    fn p(prompt: &str) -> Problem {
        let (_, t) = parse_prompt(prompt).unwrap();
        Problem {
            id: "c".into(),
            prompt: prompt.into(),
            answer: t.to_string(),
            demonstration: String::new(),
        }
    }

    #[test]
    fn demonstrations_verify() {
        for (n, m) in [(2, 12), (3, 20), (4, 50), (6, 100)] {
            let t = CountdownTask::new(n, m, 50, 11).unwrap();
            let mut nontrivial = 0;
            for i in 0..2000 {
                let pr = if i < 50 {
                    t.heldout_problem(i)
                } else {
                    t.train_problem(i)
                };
                assert_eq!(t.verify(&pr, &pr.demonstration), Verdict::CORRECT, "{pr:?}");
                let (nums, target) = parse_prompt(&pr.prompt).unwrap();
                assert_eq!(nums.len(), n as usize);
                assert!(nums.iter().all(|&x| (1..=m as u64).contains(&x)));
                assert!(target > 0);
                if !nums.contains(&(target as u64)) {
                    nontrivial += 1;
                }
                assert_eq!(pr.answer, target.to_string());
                for ch in pr.prompt.chars().chain(pr.demonstration.chars()) {
                    assert!(COUNTDOWN_ALPHABET.contains(ch), "{ch:?} in {pr:?}");
                }
            }
            // Targets that are one of the numbers (solved by a bare literal) are rare.
            assert!(
                nontrivial > 1990,
                "n={n} m={m}: {nontrivial} of 2000 nontrivial"
            );
        }
    }

    #[test]
    fn deterministic_and_disjoint() {
        let a = CountdownTask::new(3, 20, 200, 5).unwrap();
        let b = CountdownTask::new(3, 20, 200, 5).unwrap();
        let c = CountdownTask::new(3, 20, 200, 6).unwrap();
        let held: HashSet<String> = (0..200).map(|i| a.heldout_problem(i).prompt).collect();
        assert_eq!(held.len(), 200);
        for i in 0..5000 {
            let pa = a.train_problem(i);
            assert_eq!(pa, b.train_problem(i));
            assert!(
                !held.contains(&pa.prompt),
                "train {i} is held out: {}",
                pa.prompt
            );
        }
        for i in 0..200 {
            assert_eq!(a.heldout_problem(i), b.heldout_problem(i));
        }
        let diff = (0..50)
            .filter(|&i| a.train_problem(i) != c.train_problem(i))
            .count();
        assert!(diff > 40);
    }

    #[test]
    fn dense_heldout_still_disjoint() {
        // 3^2 = 9 number lists, 4 held-out prompts.
        let t = CountdownTask::new(2, 3, 4, 0).unwrap();
        let held: HashSet<String> = (0..4).map(|i| t.heldout_problem(i).prompt).collect();
        for i in 0..5000 {
            assert!(!held.contains(&t.train_problem(i).prompt));
        }
    }

    #[test]
    fn render_parens() {
        use Node::*;
        let l = |v| Box::new(Leaf(v));
        let cases: Vec<(Node, &str)> = vec![
            (Bin(b'-', l(9), Box::new(Bin(b'+', l(3), l(2)))), "9-(3+2)"),
            (Bin(b'+', l(9), Box::new(Bin(b'-', l(3), l(2)))), "9+3-2"),
            (Bin(b'*', Box::new(Bin(b'+', l(1), l(2))), l(3)), "(1+2)*3"),
            (Bin(b'/', l(8), Box::new(Bin(b'*', l(2), l(2)))), "8/(2*2)"),
            (Bin(b'/', l(8), Box::new(Bin(b'/', l(4), l(2)))), "8/(4/2)"),
            (Bin(b'-', Box::new(Bin(b'-', l(9), l(3))), l(2)), "9-3-2"),
        ];
        for (n, want) in cases {
            let mut s = String::new();
            render(&n, &mut s);
            assert_eq!(s, want);
        }
    }

    #[test]
    fn verify_table() {
        let t = CountdownTask::new(3, 20, 0, 0).unwrap();
        let pr = p("3 7 9 -> 30:");
        let dup = p("3 3 9 -> 18:");
        let deep = format!("{}3*7+9{}", "(".repeat(40), ")".repeat(40));
        let ok_deep = format!("{}3*7+9{}", "(".repeat(20), ")".repeat(20));
        let long = format!("3*7+9{}", " ".repeat(1000));
        let cases: Vec<(&Problem, &str, Verdict)> = vec![
            (&pr, "3*7+9", Verdict::CORRECT),
            (&pr, " 9 + 7 * 3 \n", Verdict::CORRECT),
            (&pr, "(9+7*3)", Verdict::CORRECT),
            (&pr, &ok_deep, Verdict::CORRECT),
            (&pr, &long, Verdict::CORRECT),
            (&pr, "3*(7+9)", Verdict::WRONG),
            (&pr, "9/(7-7)", Verdict::MALFORMED), // 7 used twice
            (&pr, "9/(3-3)", Verdict::MALFORMED),
            (&pr, "3+7+9", Verdict::WRONG),
            (&pr, "9/3", Verdict::WRONG),
            (&pr, "3*7+9+1", Verdict::MALFORMED),
            (&pr, "3*7+9=30", Verdict::MALFORMED),
            (&pr, "30", Verdict::MALFORMED),
            (&pr, "", Verdict::MALFORMED),
            (&pr, "(((", Verdict::MALFORMED),
            (&pr, &deep, Verdict::MALFORMED),
            (&pr, "3×7+9", Verdict::MALFORMED),
            (&pr, "３*7+9", Verdict::MALFORMED),
            (&pr, "99999999999999999999999", Verdict::MALFORMED),
            (&pr, "-3*7+9", Verdict::MALFORMED),
            (&dup, "3*3+9", Verdict::CORRECT),
            (&dup, "3*3*3", Verdict::MALFORMED),
            (&dup, "(9+9)", Verdict::MALFORMED),
            (&dup, "9/(3-3)", Verdict::WRONG), // division by zero: parses, numbers fine
        ];
        for (prob, resp, want) in cases {
            assert_eq!(t.verify(prob, resp), want, "{} <- {resp:?}", prob.prompt);
        }
        // A corrupted prompt is never a success.
        let bad = Problem {
            prompt: "garbage".into(),
            ..pr.clone()
        };
        assert_eq!(t.verify(&bad, "3*7+9"), Verdict::MALFORMED);
        // Rational intermediate results are fine.
        let frac = p("1 3 4 6 -> 24:");
        assert_eq!(t.verify(&frac, "6/(1-3/4)"), Verdict::CORRECT);
    }

    #[test]
    fn config_errors() {
        assert!(matches!(
            CountdownTask::new(1, 20, 0, 0),
            Err(TaskError::Config {
                field: "numbers",
                ..
            })
        ));
        assert!(matches!(
            CountdownTask::new(7, 20, 0, 0),
            Err(TaskError::Config {
                field: "numbers",
                ..
            })
        ));
        assert!(matches!(
            CountdownTask::new(3, 0, 0, 0),
            Err(TaskError::Config {
                field: "max_number",
                ..
            })
        ));
        assert!(matches!(
            CountdownTask::new(2, 3, 5, 0),
            Err(TaskError::Config {
                field: "heldout",
                ..
            })
        ));
    }
}
