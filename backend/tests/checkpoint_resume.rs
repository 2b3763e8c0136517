//! A run restored from a checkpoint continues bit for bit like the run that was
//! never interrupted: into a fresh trainer (a restart) and into the same trainer
//! later on (a rollback), on the CPU and, when there is one, on the GPU. The run
//! has a KL reference, which after an SFT warm-up only the checkpoint can give back.

use jet_backend::checkpoint;
use jet_backend::config::RunConfig;
use jet_backend::trainer::Trainer;
use serde_json::Value;

fn config(device: &str) -> RunConfig {
    let mut c = RunConfig::tiny_arith();
    c.sft.steps = 6;
    c.run.steps = 4;
    c.run.eval_size = 8;
    c.run.eval_every = 2;
    c.rollout.prompts_per_step = 4;
    c.rollout.group_size = 4;
    c.train.kl_coef = 0.05;
    c.run.device = device.into();
    c
}

/// Steps until `rl_done` RL steps are done (or the end), their metrics without timing.
fn steps_until(t: &mut Trainer, rl_done: u64) -> Vec<Value> {
    let mut out = Vec::new();
    while t.progress.rl_steps_done < rl_done {
        match t.next_step() {
            Some(m) => out.push(m.expect("step").without_timing()),
            None => break,
        }
    }
    out
}

fn rl(ms: &[Value]) -> Vec<Value> {
    ms.iter().filter(|m| m["phase"] == "rl").cloned().collect()
}

fn resume_is_bit_for_bit(device: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let mut full = Trainer::new(config(device), None).expect("trainer");
    let reference = rl(&steps_until(&mut full, u64::MAX));
    assert_eq!(reference.len(), 4);
    full.sync_host().unwrap();

    // Interrupted after RL step 2: checkpoint, drop, restore into a new trainer.
    let mut a = Trainer::new(config(device), None).unwrap();
    let first = rl(&steps_until(&mut a, 2));
    assert_eq!(first, reference[..2]);
    let dir = tmp.path().join("ck");
    let files = checkpoint::save(&dir, &mut a).expect("checkpoint");
    assert!(
        files.iter().any(|f| f.name == checkpoint::REFERENCE_FILE),
        "the KL reference is saved: {files:?}"
    );
    drop(a);
    let mut b = Trainer::new(config(device), None).unwrap();
    checkpoint::restore(&dir, &files, &mut b).expect("restore");
    let rest = steps_until(&mut b, u64::MAX);
    assert_eq!(rest, reference[2..], "{device}: restart from a checkpoint");
    b.sync_host().unwrap();
    assert!(b.weights == full.weights, "{device}: final weights differ");

    // Rollback: the same trainer, further on, goes back and replays.
    checkpoint::restore(&dir, &files, &mut b).expect("restore again");
    assert_eq!(b.progress.rl_steps_done, 2);
    let replay = steps_until(&mut b, u64::MAX);
    assert_eq!(replay, reference[2..], "{device}: rollback replay");
    b.sync_host().unwrap();
    assert!(
        b.weights == full.weights,
        "{device}: weights after the replay"
    );
}

#[test]
fn cpu_run_resumes_bit_for_bit() {
    resume_is_bit_for_bit("cpu");
}

#[test]
fn gpu_run_resumes_bit_for_bit() {
    if let Err(e) = jet_backend::gpu::open_gpu() {
        println!("skipping: no GPU ({e})");
        return;
    }
    resume_is_bit_for_bit("cuda");
}
