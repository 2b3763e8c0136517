//! The problem type, the verdict on a response, and the [`Task`] trait.

use serde::{Deserialize, Serialize};

/// One problem: what the model is shown, the canonical answer, and a correct response.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    /// Stable identifier, e.g. `arith-train-17` or `gsm8k.jsonl:42`.
    pub id: String,
    /// The text the model is conditioned on.
    pub prompt: String,
    /// The canonical answer (for countdown: the target value).
    pub answer: String,
    /// A correct response in the task's format (for SFT warm-up); `verify` accepts it.
    pub demonstration: String,
}

/// The verifier's judgement of one response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The response's answer is right.
    pub correct: bool,
    /// The response follows the task's answer format (right or wrong).
    pub well_formed: bool,
}

impl Verdict {
    /// Correct (and therefore well formed).
    pub const CORRECT: Verdict = Verdict {
        correct: true,
        well_formed: true,
    };
    /// Well formed but wrong.
    pub const WRONG: Verdict = Verdict {
        correct: false,
        well_formed: true,
    };
    /// Not in the task's format.
    pub const MALFORMED: Verdict = Verdict {
        correct: false,
        well_formed: false,
    };
}

/// A source of prompts with a verifier.
pub trait Task: Send + Sync {
    /// Short name, e.g. `arithmetic`.
    fn name(&self) -> &str;
    /// The i-th training problem (deterministic in (seed, i)); never one of the held-out
    /// problems.
    fn train_problem(&self, index: u64) -> Problem;
    /// The i-th held-out problem, i < heldout_size(). An index past the end wraps around.
    fn heldout_problem(&self, index: u64) -> Problem;
    /// Number of held-out problems.
    fn heldout_size(&self) -> usize;
    /// Judges `response` (the generated text after the prompt, without EOS).
    fn verify(&self, problem: &Problem, response: &str) -> Verdict;
    /// Notes from building the task worth showing the operator (e.g. skipped dataset
    /// lines). Empty by default.
    fn warnings(&self) -> Vec<String> {
        Vec::new()
    }
}
