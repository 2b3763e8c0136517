//! The long-horizon scratchpad task end to end on the CPU: the tiny config's SFT
//! warm-up teaches a random model to write the scratchpad (format and steps), and
//! the 0.6B config asks for the response lengths it promises.

use std::path::PathBuf;

use jet_backend::config::RunConfig;
use jet_backend::tasks::{parse_trace, steps_right, Problem};
use jet_backend::trainer::Trainer;

fn config(name: &str) -> RunConfig {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../configs")
        .join(name);
    RunConfig::from_file(&p).expect("config parses")
}

/// Share of well-formed responses and of scratchpad steps equal to the reference.
fn score(t: &Trainer, responses: &[(Problem, String)]) -> (f64, f64) {
    let wf = responses
        .iter()
        .filter(|(p, r)| t.task.verify(p, r).well_formed)
        .count();
    let (right, total) = responses
        .iter()
        .map(|(p, r)| steps_right(p, r))
        .fold((0, 0), |(a, b), (r, n)| (a + r, b + n));
    (
        wf as f64 / responses.len() as f64,
        right as f64 / total.max(1) as f64,
    )
}

#[test]
fn tiny_sft_teaches_the_scratchpad() {
    let mut cfg = config("tiny-longhorizon.toml");
    // A shortened warm-up (120 steps of 16 instead of 300 of 32) keeps this test
    // to seconds: enough for the format, not yet for the arithmetic (the full
    // warm-up reaches about 0.6 held-out accuracy). Over seeds 1-5 it leaves
    // 0.59-0.91 of the responses well formed (forty-eighth session); 80 steps left
    // 0.41-0.75 (0.53-0.69 with the quantizers' product by the reciprocal), so
    // the 0.6 bound held for one seed, not for the format being learnt.
    cfg.sft.steps = 120;
    cfg.sft.batch = 16;
    cfg.run.steps = 0;
    let mut t = Trainer::new(cfg, None).expect("trainer");
    let before = t.greedy_responses(EVAL).unwrap();
    let (wf0, steps0) = score(&t, &before);
    while let Some(m) = t.next_step() {
        m.expect("sft step");
    }
    let after = t.greedy_responses(EVAL).unwrap();
    let (wf1, steps1) = score(&t, &after);
    eprintln!("well formed {wf0:.3} -> {wf1:.3}, steps right {steps0:.3} -> {steps1:.3}");
    for (p, r) in after.iter().take(3) {
        eprintln!("  {} {r}   (want {})", p.prompt, p.demonstration);
    }
    assert!(wf0 < 0.05, "a random model writes scratchpads? {wf0}");
    // Well formed = one step per column of the problem: the model has learned to
    // size its scratchpad to the operands, not just the step grammar.
    assert!(
        wf1 >= 0.5,
        "after SFT only {wf1} of responses are well formed"
    );
    // And the responses are as long as the reference scratchpads.
    let len = |f: &dyn Fn(&(Problem, String)) -> usize| {
        after.iter().map(f).sum::<usize>() as f64 / EVAL as f64
    };
    let (got, want) = (len(&|(_, r)| r.len()), len(&|(p, _)| p.demonstration.len()));
    assert!(
        (got - want).abs() < 0.2 * want,
        "mean length {got} vs {want}"
    );
    let steps: usize = after
        .iter()
        .filter_map(|(_, r)| parse_trace(r))
        .map(|tr| tr.steps.len())
        .sum();
    assert!(
        steps as f64 / EVAL as f64 >= 1.5,
        "{steps} steps in {EVAL} responses"
    );
}

const EVAL: usize = 32;

#[test]
fn qwen3_0_6b_config_asks_for_256_plus_token_responses() {
    let cfg = config("qwen3-0.6b-longhorizon.toml");
    assert_eq!(cfg.run.device, "cuda");
    let task = jet_backend::tasks::build_task(&cfg.task, &cfg.base_dir).unwrap();
    let tok = jet_backend::tokenizer::Tokenizer::from_file(
        cfg.resolve(cfg.model.tokenizer.as_ref().expect("a tokenizer path")),
    )
    .unwrap();
    let random = cfg.model.random.as_ref().expect("a random model");
    let (mut long, mut longest, n) = (0usize, 0usize, 400u64);
    for i in 0..n {
        let p = task.train_problem(i);
        let prompt = tok.encode(&p.prompt, true).unwrap().len();
        // The demonstration and its EOS.
        let resp = tok.encode(&p.demonstration, false).unwrap().len() + 1;
        assert!(
            resp <= cfg.rollout.max_new_tokens,
            "{} tokens: {}",
            resp,
            p.prompt
        );
        assert!(prompt + resp <= random.max_position_embeddings);
        long += (resp >= 256) as usize;
        longest = longest.max(resp);
    }
    assert!(longest >= 256);
    assert!(
        long as f64 >= 0.5 * n as f64,
        "{long} of {n} responses are 256+ tokens"
    );
}

/// The stage-two config GRPOs from the stage-one SFT model: the same task,
/// rewards, rollout and training settings, no SFT of its own, and a model path
/// that is where `jetd run configs/qwen3-0.6b-longhorizon.toml --steps 0` (run
/// from the repository root) saves its final model.
#[test]
fn longhorizon_rl_config_starts_from_the_sft_model() {
    let (base, rl) = (
        config("qwen3-0.6b-longhorizon.toml"),
        config("qwen3-0.6b-longhorizon-rl.toml"),
    );
    assert_eq!(rl.task, base.task);
    assert_eq!(rl.reward, base.reward);
    assert_eq!(rl.rollout, base.rollout);
    assert_eq!(rl.train, base.train);
    assert_eq!(rl.sft.steps, 0);
    assert!(base.sft.steps > 0 && rl.model.random.is_none());
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let name = format!(
        "qwen3-0.6b-longhorizon-{}-seed{}",
        base.run.flow.0, base.run.seed
    );
    let want = repo.join("runs").join(name).join("final");
    let got = rl.resolve(rl.model.path.as_ref().expect("a model path"));
    assert_eq!(
        std::fs::canonicalize(got.parent().unwrap().parent().unwrap()).ok(),
        std::fs::canonicalize(repo.join("runs")).ok(),
        "{} is not under runs/",
        got.display()
    );
    assert_eq!(got.file_name(), want.file_name());
    assert_eq!(
        got.parent().unwrap().file_name(),
        want.parent().unwrap().file_name()
    );
}
