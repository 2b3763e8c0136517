//! Which catalogued checkpoints lie on a run's live line.
//!
//! A rollback to step S starts a new branch; the checkpoints the old branch
//! wrote after S stay in the catalog (and on disk) but are no longer the
//! run's past. The live line of a run at position P is, at every position up
//! to P, the checkpoint of the newest branch there: a newer branch always
//! supersedes older ones from its fork point on, and before its fork point it
//! has no checkpoints of its own. Resuming after a crash, rolling back and the
//! automatic rollback all pick from this line, never from an abandoned
//! branch's future.

use crate::store::{phase_rank, CheckpointRecord, RunRecord};

/// Where a run or checkpoint stands: SFT steps before RL steps.
pub type Position = (u8, u64);

/// The position of a checkpoint.
pub fn of_checkpoint(c: &CheckpointRecord) -> Position {
    (phase_rank(&c.info.phase), c.info.step)
}

/// The position of a run, from its persisted progress (a finished warm-up
/// is RL step 0, as its checkpoint is catalogued).
pub fn of_run(r: &RunRecord) -> Position {
    let p = &r.progress;
    if p.sft_steps_done < r.sft_total && p.rl_steps_done == 0 {
        (0, p.sft_steps_done)
    } else {
        (1, p.rl_steps_done)
    }
}

/// The live line of a run at `at`, oldest first (catalog order in, which is
/// branch-major).
pub fn live(catalog: Vec<CheckpointRecord>, at: Position) -> Vec<CheckpointRecord> {
    let mut line: Vec<CheckpointRecord> = Vec::new();
    for c in catalog {
        if of_checkpoint(&c) > at {
            continue;
        }
        // Catalog order puts newer branches later: they replace older ones.
        match line
            .iter_mut()
            .find(|l| of_checkpoint(l) == of_checkpoint(&c))
        {
            Some(l) if c.branch >= l.branch => *l = c,
            Some(_) => {}
            None => line.push(c),
        }
    }
    line.sort_by_key(of_checkpoint);
    line
}

/// What keep-last-`keep` may delete from a run at `at`: every checkpoint but the
/// newest `keep` of its live line (an abandoned branch's future counts as old,
/// so it never keeps a live checkpoint from being kept). The caller still
/// spares the best and the pinned ones.
pub fn prunable(catalog: &[CheckpointRecord], at: Position, keep: usize) -> Vec<CheckpointRecord> {
    let line = live(catalog.to_vec(), at);
    let kept: Vec<&str> = line
        .iter()
        .rev()
        .take(keep.max(1))
        .map(|c| c.info.path.as_str())
        .collect();
    catalog
        .iter()
        .filter(|c| !kept.contains(&c.info.path.as_str()))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use jet_proto::CheckpointInfo;

    fn ck(branch: u64, phase: &str, step: u64) -> CheckpointRecord {
        CheckpointRecord {
            info: CheckpointInfo {
                step,
                phase: phase.into(),
                path: format!("b{branch}-{phase}-{step}"),
                health: "ok".into(),
                heldout_accuracy: None,
                reward_mean: None,
                unix_ms: 0,
                bytes: 0,
            },
            branch,
            files: vec![],
        }
    }

    fn paths(v: &[CheckpointRecord]) -> Vec<&str> {
        v.iter().map(|c| c.info.path.as_str()).collect()
    }

    #[test]
    fn an_abandoned_branch_future_is_not_on_the_line() {
        // Branch 0 reached step 8; rolled back to 4 (branch 1), which wrote 6.
        let cat = vec![
            ck(0, "sft", 3),
            ck(0, "rl", 0),
            ck(0, "rl", 4),
            ck(0, "rl", 6),
            ck(0, "rl", 8),
            ck(1, "rl", 6),
        ];
        // Right after the rollback (branch 1 at step 5): back to 4, not 8.
        assert_eq!(
            paths(&live(cat.clone(), (1, 5))),
            ["b0-sft-3", "b0-rl-0", "b0-rl-4"]
        );
        // Branch 1 at step 7: its own 6 replaces branch 0's 6; 8 is not its past.
        assert_eq!(
            paths(&live(cat.clone(), (1, 7))),
            ["b0-sft-3", "b0-rl-0", "b0-rl-4", "b1-rl-6"]
        );
        // Still in the warm-up: only the SFT checkpoint counts.
        assert_eq!(paths(&live(cat, (0, 5))), ["b0-sft-3"]);
    }

    #[test]
    fn keep_last_keeps_the_live_line_not_the_abandoned_future() {
        // Rolled back from 8 to 4; branch 1 has just written its 6.
        let cat = vec![
            ck(0, "rl", 2),
            ck(0, "rl", 4),
            ck(0, "rl", 6),
            ck(0, "rl", 8),
            ck(1, "rl", 6),
        ];
        // Newest-in-catalog order would keep b0-rl-8 and b1-rl-6 and drop b0-rl-4,
        // the live parent of branch 1.
        assert_eq!(
            paths(&prunable(&cat, (1, 6), 2)),
            ["b0-rl-2", "b0-rl-6", "b0-rl-8"]
        );
        assert_eq!(paths(&prunable(&cat, (1, 6), 10)), ["b0-rl-6", "b0-rl-8"]);
        // keep 0 still keeps the newest.
        assert_eq!(prunable(&cat, (1, 6), 0).len(), 4);
    }
}
